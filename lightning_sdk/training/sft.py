"""`Trainer.fit_sft`: a supervised warm start of the LoRA adapter on chosen episodes, before GRPO.

RL from scratch spends its first hours finding the format a team's traces already show. `fit_sft` trains
the same LoRA adapter GRPO trains, on the replies of chosen episodes (those recorded in production with a
good reward, or all of a stronger teacher's), and writes the same run folder: `metrics.jsonl` (one
record per step, `loss` the mean negative log-likelihood of a reply token), checkpoints, `run.json` and
the final adapter in `run_dir/adapter`. GRPO then starts from that adapter with
`TrainerConfig(init_adapter=".../adapter")`.

The steps: the samples (`lightning_sdk.training.algorithm.sft_samples`) are shuffled with `config.seed`,
and each step trains on `config.batch_size * config.group_size` of them (the number of episodes a GRPO
step trains on), `epochs` passes in all. Learning rate, warm-up, schedule, LoRA shape, micro-batches,
gradient clipping and dtype come from the same `TrainerConfig`. No engine is started: the model trains
where the placement puts the policy.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_sdk.tracing.episode import Episode
from lightning_sdk.tracing.store import EpisodeStore
from lightning_sdk.training.algorithm.samples import Sample
from lightning_sdk.training.algorithm.sft_samples import SFTData, sft_samples
from lightning_sdk.training.config import TrainerConfig
from lightning_sdk.training.records.run_dir import make_run_dir, refuse_earlier_run, write_run_info

__all__ = ["SFTResult", "fit_sft"]

log = logging.getLogger("lightning_sdk.training")


@dataclass
class SFTResult:
    """What `fit_sft` did."""

    run_dir: Path
    adapter_path: Path
    """The trained adapter: pass it as `TrainerConfig(init_adapter=...)` to start GRPO from it."""
    steps: int
    samples: int
    """Training samples (one per usable call of the chosen episodes)."""
    first_loss: float
    last_loss: float
    data: dict[str, Any]
    """Episodes chosen and left out, samples by origin (`engine` ids or `text`), calls left out by reason."""


def fit_sft(
    model: str | Path | None,
    config: TrainerConfig,
    episodes: Iterable[Episode] | EpisodeStore,
    *,
    min_reward: float | None = None,
    epochs: int = 1,
) -> SFTResult:
    """Train the LoRA adapter on the replies of chosen episodes (see the module docstring).

    Args:
        model: `None` (the bundled model), a Hugging Face folder or a Hub id: the policy GRPO will train.
        config: the run's settings (`run_dir`, learning rate, LoRA shape, batch sizes, `train_agents`,
            `max_sample_tokens`, `init_adapter` to continue from another adapter, ...).
        episodes: episodes, or an `EpisodeStore` (every episode in it).
        min_reward: keep episodes whose return is at least this; `None` keeps all (a teacher's episodes).
        epochs: passes over the samples.
    """
    from transformers import AutoTokenizer

    from lightning_sdk.engine.models.resolve import resolve_model

    if not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs={epochs!r} must be an integer >= 1.")
    refuse_earlier_run(config.run_dir)  # before the tokenizer and the episodes are read
    resolved = resolve_model(model)
    tokenizer = AutoTokenizer.from_pretrained(str(resolved.path))
    chosen = episodes.episodes() if isinstance(episodes, EpisodeStore) else list(episodes)
    agents = config.train_agents if isinstance(config.train_agents, tuple) else None
    data = sft_samples(
        chosen,
        tokenizer,
        min_reward=min_reward,
        train_agents=agents,
        max_sample_tokens=config.max_sample_tokens,
    )
    if not data.samples:
        raise ValueError(f"no sample to train on: {_describe(data, min_reward)}.")
    per_step = config.batch_size * config.group_size
    steps = epochs * math.ceil(len(data.samples) / per_step)
    config = dataclasses.replace(config, max_steps=steps)  # the schedule spans this run's steps
    run_dir = make_run_dir(config.run_dir)
    log.info("supervised warm start: %s; %d steps", _describe(data, min_reward), steps)
    losses = _train(
        resolved.path,
        config,
        run_dir,
        _step_batches(data.samples, per_step, epochs, config.seed),
        tokenizer.pad_token_id or 0,
        {"sft": _summary(data, min_reward, epochs)},
    )
    return SFTResult(
        run_dir,
        run_dir / "adapter",
        steps,
        len(data.samples),
        losses[0],
        losses[-1],
        _summary(data, min_reward, epochs),
    )


def _train(
    model_path: Path,
    config: TrainerConfig,
    run_dir: Path,
    batches: list[list[Sample]],
    pad_token_id: int,
    facts: dict[str, Any],
) -> list[float]:
    from lightning_sdk.engine.placement import plan_placement
    from lightning_sdk.training.records.metrics import MetricsWriter, ProgressBar
    from lightning_sdk.training.run.startup import seed_everything
    from lightning_sdk.training.update.folders.checkpoint import save_checkpoint
    from lightning_sdk.training.update.lora import (
        build_lora_model,
        load_adapter_weights,
        load_base_model,
        save_adapter,
    )
    from lightning_sdk.training.update.optim import build_optimizer, build_scheduler
    from lightning_sdk.training.update.sft_step import sft_update

    seed_everything(config.seed)
    placement = plan_placement()
    dtype = placement.training_dtype(config.dtype)
    base = load_base_model(model_path, dtype, device=placement.device, attention=config.attention)
    policy = build_lora_model(base, config)
    if config.init_adapter is not None:
        load_adapter_weights(policy, config.init_adapter)
    optimizer = build_optimizer(policy, config)
    scheduler = build_scheduler(optimizer, config)
    write_run_info(run_dir, config, 0, {"model_path": str(model_path), **facts})
    losses = []
    with MetricsWriter(
        run_dir, config.report_to, config.to_dict(), wandb_project=config.wandb_project
    ) as metrics:
        progress = ProgressBar(total=len(batches), initial=0, enabled=config.progress_bar)
        for step, batch in enumerate(batches, start=1):
            stats = sft_update(policy, optimizer, scheduler, batch, config, pad_token_id)
            metrics.log(step, {"phase": "sft", **stats})
            losses.append(float(stats.get("loss", math.nan)))
            progress.update(step, stats)
            if config.save_every and step % config.save_every == 0:
                save_checkpoint(
                    run_dir, step, policy, optimizer, scheduler, {"data": {}}, keep=config.keep_checkpoints
                )
        progress.close()
    save_adapter(policy, run_dir / "adapter")
    return losses


def _step_batches(samples: list[Sample], per_step: int, epochs: int, seed: int) -> list[list[Sample]]:
    order = random.Random(seed)
    batches = []
    for _ in range(epochs):
        shuffled = list(samples)
        order.shuffle(shuffled)
        batches += [shuffled[start : start + per_step] for start in range(0, len(shuffled), per_step)]
    return batches


def _summary(data: SFTData, min_reward: float | None, epochs: int) -> dict[str, Any]:
    return {
        "min_reward": min_reward,
        "epochs": epochs,
        "episodes": data.episodes,
        "episodes_left_out": data.episodes_left_out,
        "samples": len(data.samples),
        "samples_by_origin": dict(data.origins),
        "calls_left_out": dict(data.calls_left_out),
    }


def _describe(data: SFTData, min_reward: float | None) -> str:
    chosen = f"{data.episodes} episode(s) chosen" + (
        f" (reward >= {min_reward:g}; {data.episodes_left_out} below or unscored)"
        if min_reward is not None
        else ""
    )
    origins = (
        ", ".join(f"{count} from {origin} ids" for origin, count in sorted(data.origins.items())) or "none"
    )
    left = ", ".join(f"{count} {reason}" for reason, count in sorted(data.calls_left_out.items())) or "none"
    return f"{chosen}; {len(data.samples)} sample(s) ({origins}); calls left out: {left}"
