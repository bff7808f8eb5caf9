"""Kill -9 and resume, for real: a training run started from the command line is SIGKILLed in the middle of
its run, after a checkpoint, and resumed with --resume. The run must end as an uninterrupted one would:
every step logged once, the same tasks per step, no duplicate or missing episode, an intact episode store
and a loadable adapter."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from safetensors.torch import load_file

import lightning_sdk as ls
from lightning_sdk.training.records.metrics import read_metrics
from tests.fixtures.runs import REPOSITORY

pytestmark = pytest.mark.slow

GROUP, STEPS = 2, 6


def _command(data: Path, config: Path, run_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "lightning_sdk.cli",
        "train",
        "tests.scripts.cli_agent:solver",
        "--data",
        str(data),
        "--reward",
        "tests.scripts.cli_agent:length_reward",
        "--config",
        str(config),
        "--engine",
        "transformers",
        "--run-dir",
        str(run_dir),
        *extra,
    ]


def _environment() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


def _steps_logged(run_dir: Path) -> list[int]:
    return [record["step"] for record in read_metrics(run_dir) if "reward_mean" in record]


def _kill_once_logged(command: list[str], env: dict[str, str], run_dir: Path, step: int) -> None:
    """Start the training command and SIGKILL it as soon as `step` is logged."""
    training = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 600
    while step not in (_steps_logged(run_dir) if (run_dir / "metrics.jsonl").exists() else []):
        assert training.poll() is None, training.stderr.read().decode()[-3000:]  # type: ignore[union-attr]
        assert time.monotonic() < deadline, f"step {step} was never logged"
        time.sleep(0.05)
    training.send_signal(signal.SIGKILL)
    training.wait(30)


def _tasks_by_step(run_dir: Path) -> dict[int, list[str]]:
    with ls.EpisodeStore(run_dir / "episodes.sqlite") as store:
        episodes = list(store.episodes())
    by_step: dict[int, list[str]] = {}
    for episode in episodes:
        by_step.setdefault(episode.metadata["step"], []).append(episode.task["question"])
    return {step: sorted(tasks) for step, tasks in by_step.items()}


def test_a_run_killed_after_a_checkpoint_resumes_as_if_it_had_not_stopped(tmp_path: Path) -> None:
    data = tmp_path / "tasks.jsonl"
    data.write_text("".join(json.dumps({"question": f"Name a fruit, number {i}."}) + "\n" for i in range(5)))
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "group_size": GROUP,
                "batch_size": 1,
                "max_steps": STEPS,
                "save_every": 2,
                "eval_every": 0,
                "max_tokens": 6,
                "progress_bar": False,
            }
        )
    )
    env = _environment()

    reference = tmp_path / "reference"
    subprocess.run(_command(data, config, reference), env=env, check=True, capture_output=True, timeout=900)

    run_dir = tmp_path / "run"
    _kill_once_logged(_command(data, config, run_dir), env, run_dir, step=3)
    # Step 3 is done and its episodes are stored; the newest checkpoint is step 2's.
    assert (run_dir / "checkpoints" / "step-00000002").is_dir()

    resumed = subprocess.run(
        _command(data, config, run_dir, "--resume"),
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    assert _steps_logged(run_dir) == list(range(1, STEPS + 1))  # every step once, in order
    with sqlite3.connect(run_dir / "episodes.sqlite") as connection:
        assert connection.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    tasks = _tasks_by_step(run_dir)
    assert Counter({step: len(questions) for step, questions in tasks.items()}) == Counter(
        dict.fromkeys(range(1, STEPS + 1), GROUP)
    )  # no duplicate and no missing episode
    assert tasks == _tasks_by_step(reference)  # the same data order as a run that was never stopped
    adapter = load_file(str(run_dir / "adapter" / "adapter_model.safetensors"))
    assert adapter.keys() == load_file(str(reference / "adapter" / "adapter_model.safetensors")).keys()


def test_a_run_with_rollouts_in_flight_killed_after_a_checkpoint_resumes_with_nothing_lost(
    tmp_path: Path,
) -> None:
    """max_staleness=1: groups run on through every update, so at the kill some are running and some are
    complete but not trained. The checkpoint gave their tasks back to the cursor; the resumed run trains
    every step once, each on whole groups, and the episode store stays intact."""
    data = tmp_path / "tasks.jsonl"
    data.write_text("".join(json.dumps({"question": f"Name a fruit, number {i}."}) + "\n" for i in range(5)))
    config = tmp_path / "config.json"
    settings = {"group_size": GROUP, "batch_size": 1, "max_steps": STEPS, "save_every": 2, "eval_every": 0}
    config.write_text(json.dumps({**settings, "max_tokens": 6, "progress_bar": False, "max_staleness": 1}))
    env = _environment()
    run_dir = tmp_path / "run"
    # Step 3 trained; step 4's groups are running through its update.
    _kill_once_logged(_command(data, config, run_dir), env, run_dir, step=3)
    state = json.loads((run_dir / "checkpoints" / "step-00000002" / "trainer_state.json").read_text())
    assert len(state["data"]["returned"]) == 2  # (S + 1) x batch_size groups held at the checkpoint

    resumed = subprocess.run(
        _command(data, config, run_dir, "--resume"),
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    steps = [record for record in read_metrics(run_dir) if "reward_mean" in record]
    assert [record["step"] for record in steps] == list(range(1, STEPS + 1))  # every step once, in order
    with sqlite3.connect(run_dir / "episodes.sqlite") as connection:
        assert connection.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    stored = Counter({step: len(questions) for step, questions in _tasks_by_step(run_dir).items()})
    # Each step trained one whole group; a group too old to train is stored beside it, marked.
    assert stored == Counter({r["step"]: GROUP * (1 + int(r["groups_too_old"])) for r in steps})
    assert all(record["groups_rolled_out"] == 1 for record in steps)
    # The groups held at the checkpoint ran first after the resume: the first step it trained (3) took one
    # of their tasks, not the next ones of the data.
    returned = {f"Name a fruit, number {index}." for index in state["data"]["returned"]}
    with ls.EpisodeStore(run_dir / "episodes.sqlite") as store:
        first_trained = {
            e.task["question"]
            for e in store.episodes()
            if e.metadata["step"] == 3 and "not_trained" not in e.metadata
        }
    assert len(first_trained) == 1 and first_trained <= returned
    assert load_file(str(run_dir / "adapter" / "adapter_model.safetensors"))
