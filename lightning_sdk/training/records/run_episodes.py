"""`RunEpisodes`: the two episode files of a training run, kept by rank 0.

`run_dir/episodes.sqlite` holds every training rollout's episode, `run_dir/evaluations.sqlite` every
validation episode; the run report and later analysis read them. Both are capped at
`TrainerConfig.episode_store_max_mb`: at the cap the run keeps training and stops storing, with a warning,
because losing a run to a full disk is worse than losing its later episodes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from lightning_sdk.rollouts.in_process import Rollout
from lightning_sdk.tracing.store import EpisodeStore, EpisodeStoreFull

__all__ = ["EPISODES_FILE", "EVALUATIONS_FILE", "RunEpisodes"]

EPISODES_FILE = "episodes.sqlite"
EVALUATIONS_FILE = "evaluations.sqlite"

log = logging.getLogger("lightning_sdk.training")


@dataclass
class RunEpisodes:
    """The training and validation episode stores of one run. Open with `RunEpisodes.open(...)`."""

    run_id: str
    """The run folder's name, written into every episode's `run_id`."""
    training: EpisodeStore
    evaluations: EpisodeStore
    training_full: bool = False
    """`training` reached its size limit; later steps' episodes are counted, not stored."""

    @classmethod
    def open(cls, run_dir: Path, max_size_mb: float | None) -> RunEpisodes:
        """Open (or create) both files in `run_dir`, each capped at `max_size_mb` (None: no cap)."""
        return cls(
            run_dir.name,
            EpisodeStore(run_dir / EPISODES_FILE, max_size_mb=max_size_mb),
            EpisodeStore(run_dir / EVALUATIONS_FILE, max_size_mb=max_size_mb),
        )

    def keep_training(self, step: int, rollouts: list[Rollout]) -> dict[str, int]:
        """Store the step's rollouts with `metadata` step, task_index and sample.

        Returns `{"episodes_not_stored": n}` for the step's metrics."""
        for rollout in rollouts:
            rollout.episode.run_id = self.run_id
            rollout.episode.metadata.update(
                step=step, task_index=rollout.task_index, sample=rollout.sample_index
            )
        if self.training_full:
            return {"episodes_not_stored": len(rollouts)}
        try:
            self.training.add_many(rollout.episode for rollout in rollouts)
        except EpisodeStoreFull as full:
            self.training_full = True
            log.warning("Step %d: %s Training goes on without storing episodes.", step, full)
            return {"episodes_not_stored": len(rollouts)}
        return {"episodes_not_stored": 0}

    def keep_evaluation(self, step: int, rollouts: list[Rollout]) -> None:
        """Store the validation episodes of the evaluation after `step` (`metadata` step, task_index and
        `evaluation=True`). At the size limit they are left out, with a warning."""
        for rollout in rollouts:
            rollout.episode.run_id = self.run_id
            rollout.episode.metadata.update(step=step, task_index=rollout.task_index, evaluation=True)
        try:
            self.evaluations.add_many(rollout.episode for rollout in rollouts)
        except EpisodeStoreFull as full:
            log.warning("Evaluation after step %d: %s Its episodes are not stored.", step, full)

    def discard_steps_after(self, step: int) -> int:
        """Drop what a stopped attempt stored for steps after `step` (the resumed run redoes them), so no
        step's episodes are stored twice. Returns how many were dropped."""
        dropped = sum(store.discard_steps_after(self.run_id, step) for store in self.stores)
        if dropped:
            log.info("dropped %d episodes of steps after %d, stored before the run stopped", dropped, step)
        return dropped

    @property
    def stores(self) -> tuple[EpisodeStore, EpisodeStore]:
        return (self.training, self.evaluations)

    def close(self) -> None:
        for store in self.stores:
            store.close()
