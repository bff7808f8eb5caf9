"""The run's curves: PNG files (an example's README shows them) and the series the run explorer draws.

`report.html` itself is the explorer's one-file snapshot (`lightning_sdk.explorer.snapshot`), written by
`lightning-sdk report RUN_DIR` and by the examples.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

__all__ = ["moving_average", "plot_curves", "role_keys", "signal_share"]

MOVING_AVERAGE_STEPS = 5
"""Window of the training reward's moving average: one step's mean over a few groups is noisy."""


def plot_curves(history: list[dict[str, Any]], folder: Path) -> list[Path]:
    """Draw the training reward and validation curves as PNGs in `folder`; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never open a window
    import matplotlib.pyplot as plt

    reward = _series(history, "reward_mean")
    figures: list[tuple[str, str, dict[str, list[tuple[int, float]]]]] = [
        (
            "reward.png",
            "Training reward (mean over the step's episodes)",
            {
                "reward_mean": reward,
                f"moving average ({MOVING_AVERAGE_STEPS} steps)": moving_average(
                    reward, MOVING_AVERAGE_STEPS
                ),
            },
        ),
        (
            "validation.png",
            "Validation (held-out tasks)",
            {key: _series(history, key) for key in ("val_reward", "val_success_rate")},
        ),
        (
            "signal.png",
            "Share of the step's groups that carried a learning signal",
            {"groups with a reward spread": signal_share(history)},
        ),
        (
            "step_groups.png",
            'credit="step": share of trained calls whose state another sample faced',
            {"step_group_share": _series(history, "step_group_share")},
        ),
        (
            "roles.png",
            "Each role's calls: mean credited reward (TrainerConfig.roles)",
            {key: _series(history, key) for key in role_keys(history, "reward/")},
        ),
    ]
    written = []
    for name, title, series in figures:
        if not any(points for points in series.values()):
            continue
        figure, axes = plt.subplots(figsize=(6.4, 3.6), dpi=100)
        for key, points in series.items():
            if points:
                axes.plot(*zip(*points, strict=True), marker="o", markersize=3, label=key)
        if name in ("signal.png", "step_groups.png"):
            axes.set_ylim(-0.05, 1.05)
        axes.set_xlabel("step")
        axes.set_title(title)
        axes.grid(alpha=0.3)
        axes.legend()
        figure.tight_layout()
        path = folder / name
        figure.savefig(path)
        plt.close(figure)
        written.append(path)
    return written


def role_keys(history: list[dict[str, Any]], prefix: str) -> list[str]:
    """The per-role metric keys with `prefix` (`"reward/"` gives `reward/<role>`) in the history, sorted."""
    return sorted({key for record in history for key in record if key.startswith(prefix)})


def _series(history: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    return [(int(record["step"]), float(record[key])) for record in history if _finite(record.get(key))]


def moving_average(points: list[tuple[int, float]], window: int) -> list[tuple[int, float]]:
    """The trailing mean of the last `window` points at each point (fewer at the start)."""
    averaged = []
    for index, (step, _) in enumerate(points):
        recent = [value for _, value in points[max(0, index - window + 1) : index + 1]]
        averaged.append((step, math.fsum(recent) / len(recent)))
    return averaged


def signal_share(history: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """Per step, the share of rolled-out groups whose rewards differed (the ones GRPO learns from).

    Uses `groups_with_signal / groups_rolled_out` when the run recorded them, else (older runs) the
    groups that were not skipped."""
    points = []
    for record in history:
        if _finite(record.get("groups_with_signal")) and record.get("groups_rolled_out"):
            share = record["groups_with_signal"] / record["groups_rolled_out"]
        elif record.get("groups"):
            skipped = sum(
                record.get(f"groups_skipped_{reason}") or 0 for reason in ("no_spread", "too_few_episodes")
            )
            share = (record["groups"] - skipped) / record["groups"]
        else:
            continue
        points.append((int(record["step"]), float(share)))
    return points


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)
