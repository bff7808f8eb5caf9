"""A run's checkpoints: the policy's adapter, optimizer, scheduler and data cursor every `save_every` steps,
and finding and loading the newest one on resume.

These functions take the plain parts they save and restore (the run folder, the model, its optimizer and
schedule, the task cursor) and return the step; the session puts its own records (episodes, metrics, the
engine's weights) back where that step left them (`TrainingSession.restore`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from peft import PeftModel
    from torch.optim.lr_scheduler import LRScheduler

    from lightning_sdk.training.data import TaskCursor
    from lightning_sdk.training.update.distributed import Distributed

__all__ = ["load_run_checkpoint", "save_run_checkpoint"]

log = logging.getLogger("lightning_sdk.training")


def save_run_checkpoint(
    run_dir: Path,
    step: int,
    model: PeftModel,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    cursor: TaskCursor,
    keep: int,
    distributed: Distributed,
) -> None:
    """Write the checkpoint of `step` into `run_dir` (rank 0 writes, keeping the newest `keep`; every rank
    waits at the barrier). `model` is the unwrapped policy."""
    from lightning_sdk.training.update.folders.checkpoint import save_checkpoint

    if distributed.is_main:
        save_checkpoint(run_dir, step, model, optimizer, scheduler, {"data": cursor.state()}, keep=keep)
    distributed.barrier()


def load_run_checkpoint(
    run_dir: Path,
    model: PeftModel,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    cursor: TaskCursor,
) -> int:
    """Load the newest checkpoint in `run_dir` into the model, optimizer, scheduler and cursor and return
    its step; 0 (with a warning) when there is none."""
    from lightning_sdk.training.update.folders.checkpoint import find_latest_checkpoint, load_checkpoint

    checkpoint = find_latest_checkpoint(run_dir)
    if checkpoint is None:
        log.warning("resume=True but %s has no checkpoint yet; starting from step 0", run_dir)
        return 0
    state = load_checkpoint(checkpoint, model, optimizer, scheduler)
    cursor.restore(state["data"])
    step = int(state["step"])
    log.info("resumed from %s (step %d)", checkpoint, step)
    return step
