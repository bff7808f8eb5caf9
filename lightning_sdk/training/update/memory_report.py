"""What a training step needs against what the machine has, said twice: at the start, the sizing rule's
bound (`update/memory.py`) with what `"auto"` chose for `gradient_checkpointing` and `micro_batch_tokens`,
and why; after the first trained step, the tokens it held, the rule's figure for them and the peak measured.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_sdk.training.config import TrainerConfig

if TYPE_CHECKING:
    from lightning_sdk.engine.placement import Placement
    from lightning_sdk.training.update.memory import StepMemory

__all__ = ["memory_for_training", "say_step_memory", "say_step_memory_used"]

log = logging.getLogger("lightning_sdk.training")


def say_step_memory(config: TrainerConfig, model_path: Path, placement: Placement) -> TrainerConfig:
    """Settle `gradient_checkpointing="auto"` and `micro_batch_tokens="auto"` (`_settled`) and log the sizing
    rule's bound on a training step (at the largest micro-batch the settings allow) beside the memory this
    machine has for it, with what "auto" chose and why, in one line; warn, with what to change, when the
    bound is over it (before minutes of training end in an out-of-memory error). On a CPU as on a GPU.
    Returns `config` with both settled."""
    from lightning_sdk.training.update.memory import GIB, advice, bound_reason, run_tokens

    available = _memory_for_training(placement)
    config, chosen, recompute = _settled(config, model_path, placement.on_gpu, available)
    memory = _estimate(config, model_path, placement.on_gpu)
    if memory is None:
        return config
    reason = bound_reason(config, run_tokens(config, placement.on_gpu)) + (f" ({chosen})" if chosen else "")
    reason += f"; {recompute}" if recompute else ""
    problem = advice(memory, available, config) if available is not None else None
    if problem is not None:
        log.warning(
            "memory bound (%s): %s Shorter episodes use less; the first trained step logs what it used "
            "(lightning-sdk memory --model ... prints the rule for other settings).",
            reason,
            problem,
        )
        return config
    room = f" of the {available / GIB:.1f} GiB available" if available is not None else ""
    log.info("memory: a training step needs at most %.1f GiB%s, at %s", memory.total / GIB, room, reason)
    return config


def _settled(
    config: TrainerConfig, model_path: Path, on_gpu: bool, available: int | None
) -> tuple[TrainerConfig, str | None, str | None]:
    """`settle_auto` on the model's `config.json`; for a model the rule cannot size (`_estimate` says so),
    checkpointing as the device's default and the largest budget."""
    import dataclasses
    import json

    from lightning_sdk.training.update.memory import AUTO_BUDGETS, settle_auto

    try:
        model_config = json.loads((Path(model_path) / "config.json").read_text())
        return settle_auto(config, model_config, on_gpu, available)
    except (OSError, ValueError):
        unknown = "no estimate for this model"
        checkpointing, budget = config.gradient_checkpointing, config.micro_batch_tokens
        recompute = None
        if checkpointing == "auto":
            checkpointing = on_gpu
            recompute = f"{'' if on_gpu else 'no '}gradient checkpointing ('auto': {unknown})"
        chosen = None
        if budget == "auto":
            budget, chosen = AUTO_BUDGETS[-1], f"chosen by 'auto': {unknown}"
        settled = dataclasses.replace(config, gradient_checkpointing=checkpointing, micro_batch_tokens=budget)
        return settled, chosen, recompute


def say_step_memory_used(config: TrainerConfig, model_path: Path, placement: Placement, tokens: int) -> None:
    """After the first trained step: the tokens of its largest micro-batch, the rule's figure for them
    and the peak this process measured, so the start-up bound is not read as what the run needs."""
    from lightning_sdk.training.update.memory import GIB

    memory = _estimate(config, model_path, placement.on_gpu, tokens)
    if memory is None:
        return
    log.info(
        "memory used: the first step's largest micro-batch held %d tokens, about %.1f GiB by the sizing "
        "rule; %s",
        tokens,
        memory.total / GIB,
        _measured_peak(placement),
    )


def _estimate(
    config: TrainerConfig, model_path: Path, on_gpu: bool, tokens: int | None = None
) -> StepMemory | None:
    import json

    from lightning_sdk.training.update.memory import estimate_run_memory

    try:
        model_config = json.loads((Path(model_path) / "config.json").read_text())
        return estimate_run_memory(config, model_config, on_gpu, tokens)
    except (OSError, ValueError) as error:  # a model family the rule does not know: say so, train anyway
        log.info("no memory estimate for this model (%s)", error)
        return None


def _memory_for_training(placement: Placement) -> int | None:
    return memory_for_training(placement.on_gpu, placement.device)


def memory_for_training(on_gpu: bool, device: Any = 0) -> int | None:
    """Bytes a training step can use, as the trainer counts them. A GPU (`device`): its memory less a tenth
    for the CUDA context and the allocator's slack (the engine sleeps while the policy trains: weights
    offloaded, KV cache freed). A CPU: what the system reports available now (after the engine started,
    in a run: its memory stays while it sleeps there). None when the system does not say."""
    if on_gpu:
        import torch

        return int(torch.cuda.get_device_properties(device).total_memory * 0.9)
    try:
        with open("/proc/meminfo") as meminfo:  # Linux: MemAvailable counts reclaimable caches too
            fields = dict(line.split(":", 1) for line in meminfo)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not every system names these
        return None


def _measured_peak(placement: Placement) -> str:
    from lightning_sdk.training.update.memory import GIB

    if placement.on_gpu:
        import torch

        peak = torch.cuda.max_memory_allocated(placement.device)
        return f"peak GPU memory allocated by this process so far {peak / GIB:.1f} GiB"
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    return f"peak resident memory of this process so far {peak / GIB:.1f} GiB"  # KiB on Linux, bytes on macOS
