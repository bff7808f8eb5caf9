"""One training step on a list of samples: micro-batches, gradient accumulation, clipping, optimizer step."""

from __future__ import annotations

import math
import warnings
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import torch
from torch.nn.parallel import DistributedDataParallel

from lightning_sdk.training.algorithm.samples import Sample
from lightning_sdk.training.update.batching import Batch, collate, micro_batches, token_logprobs
from lightning_sdk.training.update.loss import LossOptions, LossStats, policy_loss, token_weights

if TYPE_CHECKING:
    from lightning_sdk.training.config import TrainerConfig

__all__ = ["split_mini_batches", "train_on_samples"]


def split_mini_batches(samples: list[Sample], count: int) -> list[list[Sample]]:
    """Split samples into `count` mini-batches of near-equal size (round robin, so groups mix)."""
    return [chunk for chunk in (samples[index::count] for index in range(count)) if chunk]


def _unwrapped(model: Any) -> Any:
    """The peft model inside a `DistributedDataParallel` wrapper (gradient-free passes need no sync)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def _reference_logprobs(model: Any, batch: Batch) -> torch.Tensor:
    # The base model is the same network with the adapter switched off: no second copy in memory.
    peft_model = _unwrapped(model)
    with torch.no_grad(), peft_model.disable_adapter():
        logprobs, _ = token_logprobs(peft_model, batch, with_entropy=False)
    return logprobs


def _old_logprobs(model: Any, batches: list[Batch]) -> list[torch.Tensor]:
    with torch.no_grad():
        return [token_logprobs(_unwrapped(model), batch, with_entropy=False)[0] for batch in batches]


def _gradient_sync(model: Any, is_last_micro_batch: bool) -> Any:
    # Under DDP, all-reduce the accumulated gradients once per mini-batch, not after every micro-batch.
    if isinstance(model, DistributedDataParallel) and not is_last_micro_batch:
        return model.no_sync()
    return nullcontext()


def train_on_samples(
    model: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    samples: list[Sample],
    config: TrainerConfig,
    pad_token_id: int = 0,
) -> dict[str, float]:
    """Train on one step's samples and return the step's statistics.

    The samples are split into `config.mini_batches_per_step` mini-batches, each one optimizer step;
    each mini-batch runs as micro-batches of `config.micro_batch_size` sequences whose gradients are
    accumulated (the loss normalisation counts the whole mini-batch, so the result does not depend on
    the micro-batch size). Gradients are clipped to `config.max_grad_norm`; an update whose gradient
    is not finite is skipped (counted in `skipped_updates`) rather than corrupting the adapter. The
    scheduler advances once per call.

    Returns a dict with `loss`, `grad_norm`, `learning_rate`, `clip_fraction`, `ratio_mean`,
    `importance_ratio_mean`, `importance_ratio_max`, `importance_capped_fraction`, `kl`, `entropy`,
    `trained_tokens`, `trained_sequences`, `optimizer_steps` and `skipped_updates`.

    `model` may be wrapped in `DistributedDataParallel` (one process per GPU, or gloo on CPUs): gradients
    are then averaged across ranks once per mini-batch. Every rank must call this function with at least
    `mini_batches_per_step` samples, or the ranks that all-reduce wait for the ones that do not.
    """
    samples = [sample for sample in samples if sample.num_trained_tokens > 0]
    learning_rate = float(optimizer.param_groups[0]["lr"])
    if not samples:
        return {
            "trained_sequences": 0,
            "trained_tokens": 0,
            "optimizer_steps": 0,
            "learning_rate": learning_rate,
        }
    options = LossOptions.from_config(config)
    device = next(model.parameters()).device
    parameters = [parameter for group in optimizer.param_groups for parameter in group["params"]]
    plan = [
        [collate(chunk, pad_token_id, device) for chunk in micro_batches(mini, config.micro_batch_size)]
        for mini in split_mini_batches(samples, config.mini_batches_per_step)
    ]
    # Later mini-batches are trained after earlier updates: measure their ratio against the policy
    # that sampled them, computed before anything changes. The first mini-batch is exactly on-policy.
    old = [None] + [_old_logprobs(model, batches) for batches in plan[1:]]
    model.train()
    totals = LossStats()
    grad_norms: list[float] = []
    skipped = 0
    for mini_index, batches in enumerate(plan):
        num_sequences = sum(batch.num_sequences for batch in batches)
        num_tokens = int(sum(float(batch.loss_mask.sum()) for batch in batches))
        for micro_index, batch in enumerate(batches):
            reference = _reference_logprobs(model, batch) if options.kl_coef > 0 else None
            with _gradient_sync(model, micro_index == len(batches) - 1):
                logprobs, entropy = token_logprobs(model, batch)
                previous = old[mini_index]
                old_logprobs = logprobs.detach() if previous is None else previous[micro_index]
                weights = token_weights(
                    batch.loss_mask, options.normalization, num_sequences, num_tokens, options.dr_grpo_length
                )
                loss, stats = policy_loss(
                    logprobs,
                    old_logprobs,
                    batch.advantages,
                    weights,
                    options,
                    sampling_logprobs=batch.sampling_logprobs,
                    has_sampling_logprobs=batch.has_sampling_logprobs,
                    ref_logprobs=reference,
                    entropy=entropy,
                )
                loss.backward()  # type: ignore[no-untyped-call]
            totals.add(stats)
        max_norm = config.max_grad_norm if config.max_grad_norm is not None else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(parameters, max_norm))
        if math.isfinite(grad_norm):
            optimizer.step()
            grad_norms.append(grad_norm)
        else:
            skipped += 1
        optimizer.zero_grad(set_to_none=True)
    with warnings.catch_warnings():
        # When every update of the step was skipped, torch warns that the scheduler steps before the
        # optimizer; the schedule is counted in training steps, so stepping it anyway is intended.
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
        scheduler.step()
    summary = totals.summary()
    summary["loss"] = totals.loss / len(plan)
    summary.update(
        grad_norm=sum(grad_norms) / len(grad_norms) if grad_norms else math.nan,
        learning_rate=learning_rate,
        trained_sequences=len(samples),
        optimizer_steps=len(plan) - skipped,
        skipped_updates=skipped,
    )
    return summary
