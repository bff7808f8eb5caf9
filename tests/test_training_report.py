"""The run's curves: the PNGs `plot_curves` writes and the series the explorer draws, from a run folder
written by the real metrics writer. (`report.html`, the explorer's snapshot, is tested with the explorer.)"""

from __future__ import annotations

from pathlib import Path

from lightning_sdk.training.records.metrics import MetricsWriter, read_metrics
from lightning_sdk.training.records.report import moving_average, plot_curves, role_keys, signal_share


def test_the_curves_are_drawn_from_what_the_run_logged(tmp_path: Path) -> None:
    with MetricsWriter(tmp_path) as writer:
        writer.log(0, {"val_reward": 0.0})
        writer.log(1, {"reward_mean": 0.25, "loss": 0.1, "reward/planner": 0.5})
        writer.log(1, {"val_reward": 0.5})
    written = plot_curves(read_metrics(tmp_path), tmp_path)
    assert {path.name for path in written} >= {"reward.png", "validation.png", "roles.png"}
    assert all(path.stat().st_size > 0 for path in written)
    assert role_keys(read_metrics(tmp_path), "reward/") == ["reward/planner"]


def test_the_training_reward_is_smoothed_and_the_share_of_groups_that_taught_is_counted(
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
    assert moving_average([(1, 0.0), (2, 1.0), (3, 0.5)], 2) == [(1, 0.0), (2, 0.5), (3, 0.75)]
    shares = signal_share(read_metrics(tmp_path))
    assert shares == [(1, 1.0), (2, 0.75), (3, 0.5), (4, 0.5), (5, 0.5), (6, 0.5)]
    assert (tmp_path / "signal.png") in plot_curves(read_metrics(tmp_path), tmp_path)


def test_a_run_whose_episodes_all_failed_draws_no_empty_curve(tmp_path: Path) -> None:
    # The run a user most needs to look at: no reward anywhere (NaN is stored as null).
    with MetricsWriter(tmp_path) as writer:
        writer.log(0, {"val_reward": float("nan")})
        writer.log(1, {"reward_mean": float("nan"), "episodes_failed": 8})
    assert plot_curves(read_metrics(tmp_path), tmp_path) == []
