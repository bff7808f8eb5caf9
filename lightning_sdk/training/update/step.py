"""One training step on a list of samples: micro-batches, gradient accumulation, clipping, optimizer step."""

from __future__ import annotations

import math
import warnings
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, cast

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import LRScheduler

from lightning_sdk.training.algorithm.samples import Sample
from lightning_sdk.training.update.forward.batching import Batch, batch_tokens, collate
from lightning_sdk.training.update.forward.logprobs import default_layout, plan_micro_batches, token_logprobs
from lightning_sdk.training.update.lora import reference_adapter
from lightning_sdk.training.update.loss import LossOptions, LossStats, policy_loss, token_weights
from lightning_sdk.training.update.loss_scale import loss_scale, unscale_gradients, update_loss_scale
from lightning_sdk.training.update.memory import token_budget

if TYPE_CHECKING:
    from peft import PeftModel

    from lightning_sdk.training.config import TrainerConfig
    from lightning_sdk.training.update.distributed import PolicyModel

__all__ = ["advance", "optimizer_step", "split_mini_batches", "train_on_samples"]


def split_mini_batches(samples: list[Sample], count: int) -> list[list[Sample]]:
    """Split samples into `count` mini-batches of near-equal size (round robin, so groups mix)."""
    return [chunk for chunk in (samples[index::count] for index in range(count)) if chunk]


def _unwrapped(model: PolicyModel) -> PeftModel:
    """The peft model inside a `DistributedDataParallel` wrapper (gradient-free passes need no sync)."""
    return cast("PeftModel", model.module) if isinstance(model, DistributedDataParallel) else model


def _reference_logprobs(model: PolicyModel, batch: Batch, chunk_tokens: int | None) -> torch.Tensor:
    """The reference policy's log-probabilities: the warm start's frozen copy of the adapter where there is
    one (`add_reference_adapters`), else the base model (the same network with the adapter switched off:
    no second copy in memory)."""
    peft_model = _unwrapped(model)
    reference = reference_adapter(peft_model)
    if reference is None:
        with torch.no_grad(), peft_model.disable_adapter():
            logprobs, _ = token_logprobs(peft_model, batch, with_entropy=False, chunk_tokens=chunk_tokens)
        return logprobs
    trained = peft_model.active_adapter
    try:
        peft_model.set_adapter(reference)
        with torch.no_grad():
            logprobs, _ = token_logprobs(peft_model, batch, with_entropy=False, chunk_tokens=chunk_tokens)
    finally:
        peft_model.set_adapter(trained)  # its matrices require a gradient again, the reference's do not
    return logprobs


def _old_logprobs(model: PolicyModel, batches: list[Batch], chunk_tokens: int | None) -> list[torch.Tensor]:
    with torch.no_grad():
        unwrapped = _unwrapped(model)
        return [
            token_logprobs(unwrapped, batch, with_entropy=False, chunk_tokens=chunk_tokens)[0]
            for batch in batches
        ]


def _gradient_sync(model: PolicyModel, is_last_micro_batch: bool) -> AbstractContextManager[object]:
    # Under DDP, all-reduce the accumulated gradients once per mini-batch, not after every micro-batch.
    if isinstance(model, DistributedDataParallel) and not is_last_micro_batch:
        return model.no_sync()
    return nullcontext()


def train_on_samples(
    model: PolicyModel,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    samples: list[Sample],
    config: TrainerConfig,
    pad_token_id: int = 0,
    advance_schedule: bool = True,
) -> dict[str, float]:
    """Train on one step's samples and return the step's statistics.

    The samples are split into `config.mini_batches_per_step` mini-batches, each one optimizer step;
    each mini-batch runs as micro-batches of `config.micro_batch_size` sequences whose gradients are
    accumulated (the loss normalisation counts the whole mini-batch, so the result does not depend on
    the micro-batch size). Gradients are clipped to `config.max_grad_norm`; an update whose gradient
    is not finite is skipped (counted in `skipped_updates`) rather than corrupting the adapter. The
    scheduler advances once per call, unless `advance_schedule` is False (the caller trains several role
    adapters in one step and advances it once, with `advance`).

    Returns a dict with `loss`, `grad_norm`, `learning_rate`, `clip_fraction`, `ratio_mean`,
    `importance_ratio_mean`, `importance_ratio_max`, `importance_capped_fraction` (and, with
    `max_staleness >= 1`, per staleness level `k` of the samples `importance_capped_fraction_s<k>` and
    `importance_tokens_s<k>`), `kl`, `entropy`, the
    engine-against-trainer gap (`mismatch_tokens`, `mismatch_logratio_abs`, `mismatch_kl`,
    `mismatch_tail_share`, `mismatch_signal_removed`: `update/loss.py`),
    `trained_tokens`, `trained_sequences`, `optimizer_steps`, `skipped_updates` and
    `micro_batch_tokens_max` (the tokens of the largest forward pass, as `micro_batch_tokens` counts them:
    what the sizing rule needs to say what the step used).

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
    chunks = [
        plan_micro_batches(model, mini, config.micro_batch_size, token_budget(config))
        for mini in split_mini_batches(samples, config.mini_batches_per_step)
    ]
    packed = default_layout(model) == "packed"  # as `plan_micro_batches` counted them
    largest = max(batch_tokens(chunk, packed) for mini in chunks for chunk in mini)
    device = next(model.parameters()).device
    plan = [[collate(chunk, pad_token_id, device) for chunk in mini] for mini in chunks]
    # Later mini-batches are trained after earlier updates: measure their ratio against the policy
    # that sampled them, computed before anything changes. The first mini-batch is exactly on-policy.
    old = [None] + [_old_logprobs(model, batches, options.logit_chunk_tokens) for batches in plan[1:]]
    model.train()
    totals = LossStats()
    grad_norms: list[float | None] = []
    scale = loss_scale(model, optimizer)  # a float16 policy's gradients need it; None otherwise
    for batches, old_of_batches in zip(plan, old, strict=True):
        _accumulate_gradients(model, batches, old_of_batches, options, totals, scale)
        grad_norms.append(optimizer_step(optimizer, config.max_grad_norm, scale))
        scale = loss_scale(model, optimizer)
    if advance_schedule:
        advance(scheduler)
    return {
        **_step_summary(totals, grad_norms, learning_rate, len(samples)),
        "micro_batch_tokens_max": largest,
    }


def _accumulate_gradients(
    model: PolicyModel,
    batches: list[Batch],
    old_logprobs: list[torch.Tensor] | None,
    options: LossOptions,
    totals: LossStats,
    scale: float | None = None,
) -> None:
    """Backpropagate the loss of one mini-batch's micro-batches and add their statistics to `totals`.
    `old_logprobs`: per micro-batch, the log-probabilities before this step's updates (None: on-policy);
    `scale`: the loss scale of a float16 policy (`update/loss_scale.py`)."""
    num_sequences = sum(batch.num_sequences for batch in batches)
    num_tokens = int(sum(float(batch.loss_mask.sum()) for batch in batches))
    for micro_index, batch in enumerate(batches):
        chunk = options.logit_chunk_tokens
        reference = _reference_logprobs(model, batch, chunk) if options.kl_coef > 0 else None
        with _gradient_sync(model, micro_index == len(batches) - 1):
            logprobs, entropy = token_logprobs(model, batch, chunk_tokens=chunk)
            old = logprobs.detach() if old_logprobs is None else old_logprobs[micro_index]
            weights = token_weights(
                batch.loss_mask, options.normalization, num_sequences, num_tokens, options.dr_grpo_length
            )
            loss, stats = policy_loss(
                logprobs,
                old,
                batch.advantages,
                weights,
                options,
                sampling_logprobs=batch.sampling_logprobs,
                has_sampling_logprobs=batch.has_sampling_logprobs,
                ref_logprobs=reference,
                entropy=entropy,
                staleness=batch.staleness,
            )
            (loss if scale is None else loss * scale).backward()  # type: ignore[no-untyped-call]
        totals.add(stats)


def optimizer_step(
    optimizer: torch.optim.Optimizer, max_grad_norm: float | None, scale: float | None = None
) -> float | None:
    """Clip the accumulated gradients and step; the gradient norm, or None when it was not finite and the
    update was skipped. The gradients are cleared either way. With `scale` (a float16 policy's loss
    scale) the gradients are divided by it first, and the scale follows the outcome."""
    if scale is not None:
        unscale_gradients(optimizer, scale)
    parameters = [parameter for group in optimizer.param_groups for parameter in group["params"]]
    max_norm = max_grad_norm if max_grad_norm is not None else math.inf
    grad_norm = float(torch.nn.utils.clip_grad_norm_(parameters, max_norm))
    finite = math.isfinite(grad_norm)
    if finite:
        optimizer.step()
    if scale is not None:
        update_loss_scale(optimizer, finite)
    optimizer.zero_grad(set_to_none=True)
    return grad_norm if finite else None


def advance(scheduler: LRScheduler) -> None:
    """Step the learning-rate schedule, which counts training steps (not optimizer steps)."""
    with warnings.catch_warnings():
        # When every update of the step was skipped, torch warns that the scheduler steps before the
        # optimizer; the schedule is counted in training steps, so stepping it anyway is intended.
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
        scheduler.step()


def _step_summary(
    totals: LossStats, grad_norms: list[float | None], learning_rate: float, trained_sequences: int
) -> dict[str, float]:
    """The step's statistics; `grad_norms` has one entry per mini-batch (None: its update was skipped)."""
    applied = [norm for norm in grad_norms if norm is not None]
    summary = totals.summary()
    summary["loss"] = totals.loss / len(grad_norms)
    summary.update(
        grad_norm=sum(applied) / len(applied) if applied else math.nan,
        learning_rate=learning_rate,
        trained_sequences=trained_sequences,
        optimizer_steps=len(applied),
        skipped_updates=len(grad_norms) - len(applied),
    )
    return summary
