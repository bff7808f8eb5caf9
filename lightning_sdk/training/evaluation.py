"""Evaluation: run the agent once per validation task and summarise the rewards."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lightning_sdk.rollouts.in_process import Rollout

if TYPE_CHECKING:
    from lightning_sdk.training.run.session import TrainingSession

__all__ = ["evaluate_agent", "summarize_rollouts"]


def summarize_rollouts(rollouts: list[Rollout], success_threshold: float) -> dict[str, float]:
    """Mean reward (failed or unscored episodes count as 0), success rate and failure count."""
    rewards = []
    failed = 0
    for rollout in rollouts:
        value = rollout.episode.reward
        if rollout.failed or value is None or not math.isfinite(value):
            failed += rollout.failed
            value = 0.0
        rewards.append(value)
    count = len(rewards)
    return {
        "reward": math.fsum(rewards) / count if count else math.nan,
        "success_rate": sum(value >= success_threshold for value in rewards) / count if count else math.nan,
        "episodes": float(count),
        "episodes_failed": float(failed),
    }


def evaluate_agent(
    session: TrainingSession,
    agent: Callable[..., Any] | None,
    tasks: list[Any],
    reward: Callable[[Any, Any], float] | None,
    on_finished: Callable[[Rollout], None] | None = None,
) -> tuple[dict[str, float], list[Rollout]]:
    """Run `agent` once on each task against the session's endpoint, in the evaluation's sampling lane;
    return the metrics (averaged over ranks) and this rank's rollouts.

    `on_finished` is called as each of this rank's episodes ends (e.g. to count them on screen).
    """
    rollouts = session.rollouts(agent, session.my_share(tasks), 1, reward, on_finished, lane="eval")
    metrics: dict[str, float] = session.distributed.mean_metrics(
        summarize_rollouts(rollouts, session.config.success_threshold)
    )
    return metrics, rollouts
