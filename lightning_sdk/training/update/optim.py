"""AdamW over the trainable (LoRA) parameters, and a learning-rate schedule counted in training steps."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from lightning_sdk.training.config import TrainerConfig

__all__ = ["build_optimizer", "build_scheduler", "grpo_learning_rate", "lr_factor"]


def build_optimizer(
    model: torch.nn.Module,
    config: TrainerConfig,
    adapters: Sequence[str] | None = None,
    learning_rate: float | None = None,
) -> torch.optim.AdamW:
    """AdamW over the parameters that require a gradient (the LoRA matrices), from a `TrainerConfig`; with
    `adapters` (one per role), one parameter group per adapter, named in its `"adapter"` key.
    `learning_rate` replaces `config.learning_rate` (GRPO passes `grpo_learning_rate(config)`).

    Adam's moments are kept per parameter, so each role's adapter has its own optimizer state; a role
    that trains nothing in a step has no gradients, and AdamW leaves its parameters and state alone."""
    from lightning_sdk.training.update.lora import adapter_parameters

    lr = config.learning_rate if learning_rate is None else learning_rate
    if adapters:
        groups = [{"params": adapter_parameters(model, name), "adapter": name} for name in adapters]
        empty = [group["adapter"] for group in groups if not group["params"]]
        if empty:
            raise ValueError(f"The model has no LoRA adapter named {empty[0]!r}; build it with these roles.")
        return torch.optim.AdamW(groups, lr=lr, weight_decay=config.weight_decay)
    parameters = [parameter for parameter in model.parameters() if parameter.requires_grad]
    if not parameters:
        raise ValueError("The model has no trainable parameters; build it with build_lora_model first.")
    return torch.optim.AdamW(parameters, lr=lr, weight_decay=config.weight_decay)


def grpo_learning_rate(config: TrainerConfig) -> float:
    """GRPO's peak learning rate: `learning_rate`, times `warm_start_lr_scale` when the run starts from a
    trained adapter (`init_adapter`). Supervised fine-tuning uses `learning_rate` as is."""
    if config.init_adapter is None:
        return config.learning_rate
    return config.learning_rate * config.warm_start_lr_scale


def lr_factor(step: int, warmup_steps: int, max_steps: int, schedule: str) -> float:
    """Multiplier of the peak learning rate for the update made at training step `step` (0-based).

    Linear warm-up from `1 / (warmup_steps + 1)` to 1 over the first `warmup_steps` steps (never 0, so
    the first step is not wasted), then constant, or a linear or cosine decay reaching 0 at `max_steps`.
    """
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    if schedule == "constant":
        return 1.0
    decay_steps = max(max_steps - warmup_steps, 1)
    progress = min(max(step - warmup_steps, 0) / decay_steps, 1.0)
    if schedule == "linear":
        return 1.0 - progress
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"lr_schedule={schedule!r} is unknown; use 'constant', 'linear' or 'cosine'.")


def build_scheduler(
    optimizer: torch.optim.Optimizer, config: TrainerConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    """A `LambdaLR` that applies `lr_factor`; call `scheduler.step()` once per training step."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: lr_factor(step, config.warmup_steps, config.max_steps, config.lr_schedule),
    )
