"""A run's checkpoints: the policy's adapter, optimizer, scheduler and data cursor every `save_every` steps,
and the resume that loads the newest one and puts the run's records back where that step left them."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lightning_sdk.training.data import TaskCursor
    from lightning_sdk.training.run.session import TrainingSession

__all__ = ["restore_session", "save_session_checkpoint"]

log = logging.getLogger("lightning_sdk.training")


def save_session_checkpoint(session: TrainingSession, step: int, cursor: TaskCursor) -> None:
    """Write `session`'s checkpoint at `step` (rank 0; every rank waits at the barrier)."""
    from lightning_sdk.training.update.folders.checkpoint import save_checkpoint

    distributed = session.distributed
    if distributed.is_main:
        save_checkpoint(
            session.run_dir,
            step,
            distributed.unwrap(session.policy_model),
            session.optimizer,
            session.scheduler,
            {"data": cursor.state()},
            keep=session.config.keep_checkpoints,
        )
    distributed.barrier()


def restore_session(session: TrainingSession, cursor: TaskCursor) -> int:
    """Load the newest checkpoint of `session`'s run into it and `cursor`, drop the episodes and metrics a
    killed run wrote after it, push its weights to the engine and return its step; 0 without one."""
    from lightning_sdk.training.update.folders.checkpoint import find_latest_checkpoint, load_checkpoint

    checkpoint = find_latest_checkpoint(session.run_dir)
    if checkpoint is None:
        log.warning("resume=True but %s has no checkpoint yet; starting from step 0", session.run_dir)
        return 0
    state = load_checkpoint(
        checkpoint, session.distributed.unwrap(session.policy_model), session.optimizer, session.scheduler
    )
    cursor.restore(state["data"])
    step = int(state["step"])
    session.changed_roles = None  # every role's adapter is pushed below
    if session.episodes is not None:  # what the killed run stored for the steps it redoes
        session.episodes.discard_steps_after(step)
    session.reopen_metrics(step)  # drop records written after the checkpoint by the killed run
    session.push_weights(step)
    log.info("resumed from %s (step %d)", checkpoint, step)
    return step
