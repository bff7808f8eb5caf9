"""`summarize_fit`, shared by the example training scripts, on a run folder the real writers produced."""

from __future__ import annotations

from pathlib import Path

from lightning_sdk.examples.results import summarize_fit
from lightning_sdk.training.records.metrics import MetricsWriter, read_metrics
from lightning_sdk.training.trainer import FitResult


def test_summary_has_the_held_out_numbers_the_curve_and_the_copied_png(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with MetricsWriter(run_dir) as writer:
        writer.log(0, {"val_reward": 0.1})
        writer.log(1, {"reward_mean": 0.3, "time_step_s": 2.0})
        writer.log(2, {"reward_mean": 0.5, "time_step_s": 2.0})
        writer.log(2, {"val_reward": 0.4})
    result = FitResult(
        run_dir=run_dir,
        adapter_path=run_dir / "adapter",
        history=read_metrics(run_dir),
        initial_eval={"reward": 0.1},
        final_eval={"reward": 0.4},
    )

    summary = summarize_fit(result, curve_to=tmp_path / "curve.png")

    assert (summary["base_reward"], summary["trained_reward"], summary["steps"]) == (0.1, 0.4, 2)
    assert summary["curve"] == [(0, 0.1), (2, 0.4)]
    assert Path(summary["report"]).is_file() and (tmp_path / "curve.png").stat().st_size > 0


def test_without_evaluations_the_rewards_are_nan_and_nothing_is_written(tmp_path: Path) -> None:
    result = FitResult(run_dir=tmp_path, adapter_path=tmp_path / "adapter")
    summary = summarize_fit(result, report=False, curve_to=tmp_path / "curve.png")
    assert summary["base_reward"] != summary["base_reward"] and summary["curve"] == []
    assert "report" not in summary and not (tmp_path / "curve.png").exists()
