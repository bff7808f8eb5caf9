"""The Run page's summary: a few numbers that say how the run went, from its `metrics.jsonl` records."""

from __future__ import annotations

import math
from typing import Any

from lightning_sdk.training.records.policy_gap import MISMATCH_HIGH
from lightning_sdk.training.records.report import MOVING_AVERAGE_STEPS, moving_average, signal_share

__all__ = ["summary"]


def summary(records: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(what, value) rows: steps trained; held-out reward first -> last and the kept best adapter; the
    training reward's moving average first -> last; how many groups taught and why the others did not;
    under `credit="step"` the share of calls in step groups and the advantages' parts; seconds per step."""
    steps = [record for record in records if "reward_mean" in record]
    evaluations = [record for record in records if "val_reward" in record]
    rows = [("steps trained", str(max((int(record["step"]) for record in steps), default=0)))]
    if evaluations:
        first, last = evaluations[0]["val_reward"], evaluations[-1]["val_reward"]
        rows.append(("held-out reward, first → last", f"{_number(first)} → {_number(last)}"))
        best = [record for record in evaluations if "best_step" in record]
        if best:
            rows.append(
                (
                    "best held-out reward (the run's adapter: best_adapter/)",
                    f"{_number(best[-1]['val_reward'])} at step {int(best[-1]['best_step'])}",
                )
            )
    if not steps:
        return rows
    rewards = [
        (int(record["step"]), float(record["reward_mean"]))
        for record in steps
        if _finite(record["reward_mean"])
    ]
    averaged = moving_average(rewards, MOVING_AVERAGE_STEPS)
    if averaged:
        rows.append(
            (
                f"training reward, moving average of {MOVING_AVERAGE_STEPS} steps, first → last",
                f"{_number(averaged[0][1])} → {_number(averaged[-1][1])}",
            )
        )
    shares = signal_share(records)
    if shares:
        rows.append(("groups with a learning signal (mean over steps)", f"{_mean(s for _, s in shares):.0%}"))
    solved = sum(int(record.get("groups_all_solved", 0)) for record in steps)
    alike = sum(int(record.get("groups_all_alike_unsolved", 0)) for record in steps)
    if solved or alike:
        rows.append(
            ("groups without a signal: every sample solved / all alike, unsolved", f"{solved} / {alike}")
        )
    for key, label, percent in (
        ("step_group_share", 'trained calls sharing a state with another sample (credit="step")', True),
        ("advantage_episode_abs_mean", 'mean |episode advantage| (credit="step")', False),
        ("advantage_step_abs_mean", 'mean |weighted step advantage| (credit="step")', False),
    ):
        values = [float(record[key]) for record in steps if _finite(record.get(key))]
        if values:
            rows.append(
                (f"{label}, mean over steps", f"{_mean(values):.0%}" if percent else f"{_mean(values):.3f}")
            )
    gaps = [
        float(record["mismatch_logratio_abs"])
        for record in steps
        if _finite(record.get("mismatch_logratio_abs"))
    ]
    if gaps:
        high = sum(gap > MISMATCH_HIGH for gap in gaps)
        rows.append(
            (
                "engine against trainer: mean |log ratio| per token, median over steps (steps above "
                f"{MISMATCH_HIGH})",
                f"{sorted(gaps)[len(gaps) // 2]:.4f} ({high} of {len(gaps)})",
            )
        )
    seconds = sorted(float(record["time_step_s"]) for record in steps if _finite(record.get("time_step_s")))
    if seconds:
        rows.append(("seconds per step (median)", f"{seconds[len(seconds) // 2]:.1f}"))
    return rows


def _mean(values: Any) -> float:
    values = list(values)
    return math.fsum(values) / len(values)


def _number(value: object) -> str:
    # A step whose episodes all failed has no mean reward: metrics.jsonl holds null (its NaN).
    return f"{value:.3f}" if _finite(value) else "n/a"


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
