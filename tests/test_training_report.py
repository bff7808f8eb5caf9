"""`write_report` on a run folder written by the real metrics writer and episode store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_sdk.tracing.episode import Episode, LLMCall
from lightning_sdk.tracing.store import EpisodeStore
from lightning_sdk.training.records.metrics import MetricsWriter, read_metrics
from lightning_sdk.training.records.report import moving_average, signal_share, write_report


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


def test_report_shows_the_training_reward_smoothed_and_the_share_of_groups_that_taught(
    tmp_path: Path,
) -> None:
    rewards = [0.0, 1.0, 0.0, 1.0, 0.5, 0.5]
    with MetricsWriter(tmp_path) as writer:
        for step, reward in enumerate(rewards, start=1):
            # Steps 1-3 as an older run wrote them (skip counts only), 4-6 with dynamic sampling's counts.
            counts = (
                {"groups": 4, "groups_skipped_no_spread": step - 1}
                if step <= 3
                else {"groups": 4, "groups_rolled_out": 8, "groups_with_signal": 4}
            )
            writer.log(step, {"reward_mean": reward, **counts})

    page = write_report(tmp_path).read_text()

    # The moving average of 5 steps goes from the first step's 0.000 to mean(1, 0, 1, .5, .5) = 0.600.
    assert "moving average of 5 steps, first → last</th><td>0.000 → 0.600" in page
    assert moving_average([(1, 0.0), (2, 1.0), (3, 0.5)], 2) == [(1, 0.0), (2, 0.5), (3, 0.75)]
    shares = signal_share(read_metrics(tmp_path))
    assert shares == [(1, 1.0), (2, 0.75), (3, 0.5), (4, 0.5), (5, 0.5), (6, 0.5)]
    assert "groups with a learning signal (mean over steps)</th><td>62%" in page
    assert (tmp_path / "signal.png").stat().st_size > 0 and 'src="signal.png"' in page


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
