"""Rewards given to a task's whole group of episodes at once (`Trainer.fit(..., group_reward=...)`): a judge
that compares the attempts with each other (`lightning_sdk.Judge`), or any function of the same shape.

`group_reward(task, outputs) -> rewards` receives the outputs of the group's episodes that finished
(failed ones are left out: the error policy handles them) and returns one reward per output, or `None`
for an output it could not score. A reward becomes `Episode.rewards[<name>]` (the function's `name`
attribute, else `"group_reward"`); a `None` leaves the episode unscored and marks it in its metadata, so
it is never trained as if it had scored 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from lightning_sdk.tracing.episode import Episode
from lightning_sdk.training.algorithm.prepare import episode_failed

__all__ = ["GroupReward", "apply_group_reward", "group_reward_metrics", "one_at_a_time"]

GroupReward = Callable[[Any, list[Any]], Sequence[float | None]]
MISSING_KEY = "group_reward_missing"
"""Set in `Episode.metadata` when the group reward gave this episode none."""


def apply_group_reward(group_reward: GroupReward, task: object, episodes: list[Episode]) -> None:
    """Score the finished episodes of one task's group together, in place."""
    scored = [episode for episode in episodes if not episode_failed(episode)]
    if not scored:
        return
    rewards = list(group_reward(task, [episode.output for episode in scored]))
    if len(rewards) != len(scored):
        raise ValueError(
            f"group_reward returned {len(rewards)} reward(s) for {len(scored)} output(s): return one per "
            "output (None for one it cannot score)."
        )
    name = str(getattr(group_reward, "name", "group_reward"))
    for episode, reward in zip(scored, rewards, strict=True):
        if reward is None:
            episode.metadata[MISSING_KEY] = True
            continue
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise ValueError(f"group_reward returned {reward!r}: a reward must be a finite number or None.")
        episode.rewards[name] = float(reward)


def one_at_a_time(group_reward: GroupReward) -> Callable[[Any, Any], float]:
    """A per-episode reward function for held-out evaluation: each episode scored in a group of its own.
    An episode the group reward cannot score raises, so it is recorded as a reward error (unscored)."""

    def reward(task: object, output: object) -> float:
        [value] = list(group_reward(task, [output]))
        if value is None:
            raise ValueError("the group reward gave no reward for this episode (see the judge's failures)")
        return float(value)

    return reward


def group_reward_metrics(group_reward: GroupReward | None) -> dict[str, float]:
    """What the group reward reports about itself since its last report (a `Judge`'s cost), or nothing."""
    take = getattr(group_reward, "take_metrics", None)
    return dict(take()) if callable(take) else {}
