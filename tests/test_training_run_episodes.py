"""RunEpisodes: a training run's two episode files on real SQLite, their labels, size limit and resume."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import lightning_sdk as ls
from lightning_sdk.rollouts.in_process import Rollout
from lightning_sdk.training.records.run_episodes import RunEpisodes


def rollouts(tasks: int, group_size: int, padding: int = 0) -> list[Rollout]:
    return [
        Rollout(task, sample, ls.Episode(name="solver", metadata={"padding": "x" * padding}))
        for task in range(tasks)
        for sample in range(group_size)
    ]


def test_episodes_are_labelled_with_run_step_task_and_sample(tmp_path: Path) -> None:
    run = RunEpisodes.open(tmp_path / "run-1", max_size_mb=None)
    assert run.keep_training(3, rollouts(2, 2)) == {"episodes_not_stored": 0}
    run.keep_evaluation(3, rollouts(1, 1))
    run.close()
    with ls.EpisodeStore(tmp_path / "run-1" / "episodes.sqlite") as store:
        labels = sorted(
            (e.run_id, e.metadata["step"], e.metadata["task_index"], e.metadata["sample"])
            for e in store.episodes()
        )
    assert labels == [("run-1", 3, task, sample) for task in range(2) for sample in range(2)]
    with ls.EpisodeStore(tmp_path / "run-1" / "evaluations.sqlite") as store:
        [evaluated] = store.episodes()
    assert evaluated.metadata == {"padding": "", "step": 3, "task_index": 0, "evaluation": True}


def test_at_the_size_limit_steps_are_counted_not_stored_and_warned_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = RunEpisodes.open(tmp_path / "run", max_size_mb=0.1)
    with caplog.at_level(logging.WARNING, logger="lightning_sdk"):
        results = [run.keep_training(step, rollouts(4, 2, padding=5000)) for step in range(1, 6)]
        run.keep_evaluation(5, rollouts(40, 1, padding=5000))  # 200 kB: more than the whole cap
    not_stored = [result["episodes_not_stored"] for result in results]
    assert not_stored[0] == 0 and not_stored[-1] == 8 and set(not_stored) == {0, 8}  # whole steps only
    assert run.training_full and run.training.count() == 8 * not_stored.count(0)
    warnings = [record.getMessage() for record in caplog.records]
    assert sum("Training goes on without storing episodes" in message for message in warnings) == 1
    assert sum("Evaluation after step 5" in message for message in warnings) == 1
    assert run.evaluations.count() == 0
    run.close()


def test_a_resumed_run_drops_what_its_stopped_attempt_stored_after_the_checkpoint(tmp_path: Path) -> None:
    run = RunEpisodes.open(tmp_path / "run", max_size_mb=None)
    for step in (1, 2, 3):
        run.keep_training(step, rollouts(2, 2))
        run.keep_evaluation(step, rollouts(1, 1))
    assert run.discard_steps_after(2) == 4 + 1
    assert sorted({e.metadata["step"] for e in run.training.episodes()}) == [1, 2]
    assert sorted(e.metadata["step"] for e in run.evaluations.episodes()) == [1, 2]
    run.close()
