"""credit="step" made visible: the progress line, the report and the warning when no state is shared."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from lightning_sdk.explorer.run_summary import summary
from lightning_sdk.explorer.snapshot import write_snapshot
from lightning_sdk.training.records.metrics import MetricsWriter, ProgressBar, read_metrics
from lightning_sdk.training.records.report import plot_curves
from lightning_sdk.training.run.run_warnings import RunWarnings


def step_metrics(share: float) -> dict[str, float]:
    return {
        "reward_mean": 0.5,
        "step_group_share": share,
        "advantage_episode_abs_mean": 0.8,
        "advantage_step_abs_mean": 0.2 + share,
    }


def test_the_progress_line_and_the_report_show_the_step_group_share(tmp_path: Path) -> None:
    assert " shared=25% " in ProgressBar(total=3, enabled=False).update(1, step_metrics(0.25))
    assert "shared" not in ProgressBar(total=3, enabled=False).update(1, {"reward_mean": 0.5})
    with MetricsWriter(tmp_path) as writer:
        for step, share in enumerate([0.25, 0.75], start=1):
            writer.log(step, step_metrics(share))
    rows = dict(summary(read_metrics(tmp_path)))
    assert rows['trained calls sharing a state with another sample (credit="step"), mean over steps'] == "50%"
    assert rows['mean |episode advantage| (credit="step"), mean over steps'] == "0.800"
    assert rows['mean |weighted step advantage| (credit="step"), mean over steps'] == "0.700"
    page = write_snapshot(tmp_path).read_text()  # report.html shows the same rows and charts them
    assert "mean |weighted step advantage|" in page and '"id": "credit"' in page
    assert (tmp_path / "step_groups.png") in plot_curves(read_metrics(tmp_path), tmp_path)


def test_three_steps_without_shared_states_warn_once_and_point_at_state_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    warnings = RunWarnings()
    with caplog.at_level(logging.WARNING, logger="lightning_sdk.training"):
        for share in [0.0, 0.0, 0.4, 0.0, 0.01]:  # interrupted by a step that shared: no warning yet
            warnings.few_step_groups(step_metrics(share))
        assert not caplog.records
        warnings.few_step_groups({"reward_mean": 0.5})  # another rule (or no call trained): not counted
        warnings.few_step_groups(step_metrics(float("nan")))
        assert not caplog.records
        for _ in range(4):
            warnings.few_step_groups(step_metrics(0.0))
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert 'acting as "equal"' in message and "TrainerConfig(state_key=fn)" in message
    assert "for 3 steps in a row" in message
