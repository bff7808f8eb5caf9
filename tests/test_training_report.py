"""`write_report` on a run folder written by the real metrics writer and episode store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_sdk.tracing.episode import Episode, LLMCall
from lightning_sdk.tracing.store import EpisodeStore
from lightning_sdk.training.metrics import MetricsWriter
from lightning_sdk.training.report import write_report


def tool_call_episode(reward: float) -> Episode:
    tool_call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "calculator", "arguments": json.dumps({"expression": "20 - 5"})},
    }
    call = LLMCall(
        agent_name="math_solver",
        messages=[{"role": "user", "content": "Mia had 20 eggs and gave 5 away."}],
        text=None,
        response_message={"role": "assistant", "content": None, "tool_calls": [tool_call]},
    )
    episode = Episode(name="solver", task={"q": 1}, output="15", calls=[call], metadata={"step": 1})
    episode.rewards["answer"] = reward
    return episode


def test_report_shows_curves_and_the_tool_calls_of_sample_episodes(tmp_path: Path) -> None:
    with MetricsWriter(tmp_path) as writer:
        writer.log(0, {"val_reward": 0.0})
        writer.log(1, {"reward_mean": 0.25, "loss": 0.1})
        writer.log(1, {"val_reward": 0.5})
    with EpisodeStore(tmp_path / "episodes.sqlite") as store:
        store.add(tool_call_episode(1.0))

    page = write_report(tmp_path).read_text()

    assert "0.000 → 0.500" in page  # validation reward, first -> last
    assert 'calculator({"expression": "20 - 5"})' in page.replace("&quot;", '"')
    assert (tmp_path / "reward.png").stat().st_size > 0


def test_report_on_a_folder_without_metrics_says_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no metrics\.jsonl records"):
        write_report(tmp_path)


def test_report_of_a_run_whose_episodes_all_failed(tmp_path: Path) -> None:
    # The run a user most needs to look at: no reward anywhere (NaN is stored as null).
    with MetricsWriter(tmp_path) as writer:
        writer.log(0, {"val_reward": float("nan")})
        writer.log(1, {"reward_mean": float("nan"), "episodes_failed": 8})
    page = write_report(tmp_path).read_text()
    assert "n/a → n/a" in page
