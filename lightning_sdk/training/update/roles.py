"""One training step for a model with one LoRA adapter per role (`TrainerConfig.roles`).

Each role's samples (those its adapter sampled: `Sample.adapter`) update that adapter alone: the adapter is
made the active one, and `train_on_samples` runs on its samples as it would for a model with one adapter
(its own loss normalisation, gradient clipping and optimizer steps). The other adapters have no gradients
in that pass, so AdamW leaves them and their state alone. The learning-rate schedule advances once per
training step, after every role has trained.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch.optim.lr_scheduler import LRScheduler

from lightning_sdk.training.algorithm.samples import Sample
from lightning_sdk.training.update.step import advance, train_on_samples

if TYPE_CHECKING:
    from peft import PeftModel

    from lightning_sdk.training.config import TrainerConfig

__all__ = ["ROLE_METRICS", "RolesUpdate", "train_each_role"]

ROLE_METRICS = ("loss", "grad_norm", "kl", "entropy", "clip_fraction", "trained_sequences", "trained_tokens")
"""The update's statistics reported per role too, as `<name>/<role>`."""
_SUMMED = frozenset(
    {"trained_sequences", "trained_tokens", "optimizer_steps", "skipped_updates", "mismatch_tokens"}
)
_CAPPED_BY_AGE = "importance_capped_fraction_s"


def _weight_of(name: str) -> str:
    """The count a role's mean `name` is weighed by when the roles' statistics are combined: the tokens
    it is a mean over."""
    if name.startswith("mismatch_"):  # over the tokens that had an engine log-probability
        return "mismatch_tokens"
    if name.startswith(_CAPPED_BY_AGE):  # over the weighted tokens of samples that old
        return "importance_tokens_s" + name.removeprefix(_CAPPED_BY_AGE)
    return "trained_tokens"


class RolesUpdate:
    """What `train_each_role` did: the step's statistics and the roles whose adapter changed."""

    def __init__(self, metrics: dict[str, float], changed: list[str], idle: list[str]) -> None:
        self.metrics = metrics
        """The statistics of `train_on_samples` over every role, and `<name>/<role>` per role."""
        self.changed = changed
        """Roles whose adapter took at least one optimizer step (the ones to push to the engine)."""
        self.idle = idle
        """Roles without a trained sample this step."""


def train_each_role(
    model: PeftModel,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    samples: list[Sample],
    config: TrainerConfig,
    adapters: Sequence[str],
    pad_token_id: int = 0,
) -> RolesUpdate:
    """Train each adapter of `adapters` on its own samples, then advance the schedule once."""
    per_role: dict[str, dict[str, float]] = {}
    idle = []
    for adapter in adapters:
        own = [sample for sample in samples if sample.adapter == adapter and sample.num_trained_tokens > 0]
        if not own:
            idle.append(adapter)
            continue
        model.set_adapter(adapter)  # this adapter's matrices require a gradient, the others' do not
        per_role[adapter] = train_on_samples(
            model, optimizer, scheduler, own, config, pad_token_id, advance_schedule=False
        )
    advance(scheduler)
    metrics = _combined(list(per_role.values()), float(optimizer.param_groups[0]["lr"]))
    for adapter, stats in per_role.items():
        metrics.update({f"{name}/{adapter}": stats[name] for name in ROLE_METRICS if name in stats})
    changed = [adapter for adapter, stats in per_role.items() if stats.get("optimizer_steps", 0) > 0]
    return RolesUpdate(metrics, changed, idle)


def _combined(stats: list[dict[str, float]], learning_rate: float) -> dict[str, float]:
    """The roles' statistics as one step's: counts summed, maxima kept, others weighted by tokens."""
    combined: dict[str, float] = {"learning_rate": learning_rate}
    summed = _SUMMED | {name for role in stats for name in role if name.startswith("importance_tokens_s")}
    for name in summed:
        combined[name] = sum(role.get(name, 0) for role in stats)
    names = {name for role in stats for name in role} - summed - {"learning_rate"}
    for name in names:
        weight = _weight_of(name)
        pairs = [(role[name], role.get(weight, 0)) for role in stats if name in role]
        values = [value for value, _ in pairs if not math.isnan(value)]
        if name.endswith("_max"):
            combined[name] = max(values) if values else math.nan
            continue
        weights = [weight for value, weight in pairs if not math.isnan(value)]
        total = sum(weights)
        combined[name] = (
            sum(value * weight for value, weight in zip(values, weights, strict=True)) / total
            if total
            else math.nan
        )
    return combined
