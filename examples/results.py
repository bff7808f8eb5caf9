"""What every example's training script does after `fit`: the held-out numbers, the report, the curve."""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

__all__ = ["summarize_fit"]


def summarize_fit(result: Any, *, report: bool = True, curve_to: str | Path | None = None) -> dict[str, Any]:
    """Base and trained held-out reward, the validation curve and the run's paths, from a `FitResult`.

    Args:
        result: what `Trainer.fit` returned.
        report: write `report.html` (and its PNG curves) into the run folder.
        curve_to: copy the validation curve PNG there (needs `report`), e.g. next to the example.
    """
    summary: dict[str, Any] = {
        "base_reward": result.initial_eval["reward"] if result.initial_eval else math.nan,
        "trained_reward": result.final_eval["reward"] if result.final_eval else math.nan,
        "steps": sum(1 for record in result.history if "time_step_s" in record),
        "curve": [
            (record["step"], record["val_reward"]) for record in result.history if "val_reward" in record
        ],
        "run_dir": str(result.run_dir),
        "adapter": str(result.adapter_path),
        # The adapter the run hands back (`keep_best`): chosen on the held-out set, so its score is an
        # optimistic estimate where that set is also the test set; `trained_reward` is the last adapter's.
        "best_step": result.best_step,
        "best_reward": result.best_eval["reward"] if result.best_eval else math.nan,
    }
    if report:
        from lightning_sdk.explorer.snapshot import write_snapshot
        from lightning_sdk.training.records.metrics import read_metrics
        from lightning_sdk.training.records.report import plot_curves

        # report.html is the explorer's one-file snapshot (`lightning-sdk view` shows the same, live); the
        # PNG curves beside it are what an example's README shows.
        plot_curves(read_metrics(result.run_dir), Path(result.run_dir))
        summary["report"] = str(write_snapshot(result.run_dir))
        curve = Path(result.run_dir) / "validation.png"
        if curve_to is not None and curve.exists():
            shutil.copyfile(curve, curve_to)
            summary["curve_png"] = str(curve_to)
    return summary
