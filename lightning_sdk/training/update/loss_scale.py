"""Dynamic loss scaling for a policy whose base weights compute in float16 (`TrainerConfig(dtype="float16")`).

float16 keeps 10 bits of mantissa (bfloat16 keeps 7), so an engine and a trainer that both compute in it
round far less apart: the fix for the training-inference mismatch that Qi et al. measured ("Defeating
the Training-Inference Mismatch via FP16", 2025). Its price is range: the smallest normal float16 is
6e-5, and the activation gradients of a loss averaged over thousands of tokens fall below it and flush
to zero. So the loss is multiplied by a scale before the backward pass and the LoRA gradients (float32:
peft keeps adapter weights in float32 on a half-precision base) divided by it after; a step whose
gradient overflowed is skipped (as any non-finite step is) and halves the scale, and every
`GROWTH_INTERVAL` finite steps double it, as `torch.amp.GradScaler` does.

The scale lives in the optimizer's first parameter group (`"loss_scale"`), so it is saved and restored
with the optimizer in every checkpoint and a resumed run goes on from where it was.
"""

from __future__ import annotations

import torch

__all__ = ["GROWTH_INTERVAL", "INITIAL_SCALE", "loss_scale", "unscale_gradients", "update_loss_scale"]

INITIAL_SCALE = 2.0**16
"""The first scale (torch.amp.GradScaler's default)."""
GROWTH_INTERVAL = 200
"""Finite optimizer steps in a row after which the scale doubles."""


def loss_scale(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> float | None:
    """The scale to multiply the loss by, or None when no weight of the policy is float16 (a model may
    keep some modules, such as its embeddings, in float32 beside float16 layers)."""
    if not any(parameter.dtype == torch.float16 for parameter in model.parameters()):
        return None
    group = optimizer.param_groups[0]
    group.setdefault("loss_scale_good_steps", 0)
    return float(group.setdefault("loss_scale", INITIAL_SCALE))


def unscale_gradients(optimizer: torch.optim.Optimizer, scale: float) -> None:
    """Divide every accumulated gradient by `scale`, before clipping looks at their norm."""
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            if parameter.grad is not None:
                parameter.grad.div_(scale)


def update_loss_scale(optimizer: torch.optim.Optimizer, finite: bool) -> None:
    """After an optimizer step: halve the scale when the gradient overflowed, double it after
    `GROWTH_INTERVAL` finite steps in a row."""
    group = optimizer.param_groups[0]
    if not finite:
        group["loss_scale"] = max(group["loss_scale"] / 2.0, 1.0)
        group["loss_scale_good_steps"] = 0
        return
    group["loss_scale_good_steps"] += 1
    if group["loss_scale_good_steps"] >= GROWTH_INTERVAL:
        group["loss_scale"] *= 2.0
        group["loss_scale_good_steps"] = 0
