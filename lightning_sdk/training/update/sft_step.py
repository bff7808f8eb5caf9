"""One supervised step: the mean negative log-likelihood of the trained reply tokens, then an optimizer step.

The samples are packed into micro-batches by the same token budget as GRPO (`micro_batch_size`,
`micro_batch_tokens`), their gradients accumulated, and the loss is normalised by every trained token of
the step, so the result does not depend on how the step was cut into micro-batches.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch.optim.lr_scheduler import LRScheduler

from lightning_sdk.training.algorithm.samples import Sample
from lightning_sdk.training.update.forward.batching import collate
from lightning_sdk.training.update.forward.logprobs import plan_micro_batches, token_logprobs
from lightning_sdk.training.update.loss_scale import loss_scale
from lightning_sdk.training.update.memory import token_budget
from lightning_sdk.training.update.step import advance, optimizer_step

if TYPE_CHECKING:
    from lightning_sdk.training.config import TrainerConfig

__all__ = ["sft_update"]


def sft_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    samples: list[Sample],
    config: TrainerConfig,
    pad_token_id: int = 0,
) -> dict[str, float]:
    """Train on one step's samples; returns `loss` (mean NLL per trained token), `grad_norm`,
    `learning_rate`, `trained_tokens`, `trained_sequences` and `skipped_updates` (1 when the gradient was
    not finite and the step was skipped)."""
    samples = [sample for sample in samples if sample.num_trained_tokens > 0]
    learning_rate = float(optimizer.param_groups[0]["lr"])
    if not samples:
        return {"trained_tokens": 0, "trained_sequences": 0, "learning_rate": learning_rate}
    device = next(model.parameters()).device
    tokens = sum(sample.num_trained_tokens for sample in samples)
    model.train()
    total = 0.0
    scale = loss_scale(model, optimizer)  # a float16 policy's gradients need it; None otherwise
    for chunk in plan_micro_batches(model, samples, config.micro_batch_size, token_budget(config)):
        batch = collate(chunk, pad_token_id, device)
        logprobs, _ = token_logprobs(model, batch, with_entropy=False, chunk_tokens=config.logit_chunk_tokens)
        loss = -(logprobs * batch.loss_mask).sum() / tokens
        (loss if scale is None else loss * scale).backward()  # type: ignore[no-untyped-call]
        total += float(loss.detach())
    grad_norm = optimizer_step(optimizer, config.max_grad_norm, scale)
    advance(scheduler)
    return {
        "loss": total,
        "grad_norm": grad_norm if grad_norm is not None else math.nan,
        "learning_rate": learning_rate,
        "trained_tokens": tokens,
        "trained_sequences": len(samples),
        "skipped_updates": 0 if grad_norm is not None else 1,
    }
