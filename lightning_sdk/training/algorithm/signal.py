"""Which groups of a step carry a learning signal, and a warning when almost none does.

GRPO learns from the differences inside a group: when every sample of a task scores alike, the group's
advantages are all zero and it trains nothing. That happens for two opposite reasons, and the remedy
differs: every sample solved the task (common after a supervised warm start: the policy already knows
it) or every sample failed it alike (the task is too hard for the policy, or the reward too coarse to
tell attempts apart). Each step counts both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lightning_sdk.training.algorithm.prepare import PreparedGroup

__all__ = ["LOW_SIGNAL_SHARE", "SignalWatch", "signal_counts"]

LOW_SIGNAL_SHARE = 0.25
"""A step where fewer than this share of the groups train gets a warning."""
WARN_EVERY_STEPS = 10
"""Fewest steps between two such warnings."""


def signal_counts(groups: Sequence[PreparedGroup], success_threshold: float) -> dict[str, float]:
    """`groups_all_solved` and `groups_all_alike_unsolved`: groups that train nothing because every kept
    sample scored the same, at or above `success_threshold` or below it."""
    solved = alike = 0
    for group in groups:
        if group.skipped != "no_spread" or not group.kept:
            continue
        reward = group.kept[0].reward
        if reward is not None and reward >= success_threshold:
            solved += 1
        else:
            alike += 1
    return {"groups_all_solved": float(solved), "groups_all_alike_unsolved": float(alike)}


@dataclass
class SignalWatch:
    """Says, at most every `WARN_EVERY_STEPS` steps, when a step trained on almost none of its groups."""

    last_warned: int | None = None

    def warning(self, step: int, metrics: dict[str, float]) -> str | None:
        """The warning for a step's metrics (`groups_rolled_out`, `groups_with_signal` and the counts of
        `signal_counts`), or None."""
        rolled = int(metrics.get("groups_rolled_out", 0))
        trained = int(metrics.get("groups_with_signal", 0))
        if not rolled or trained / rolled >= LOW_SIGNAL_SHARE:
            return None
        if self.last_warned is not None and step - self.last_warned < WARN_EVERY_STEPS:
            return None
        self.last_warned = step
        solved = int(metrics.get("groups_all_solved", 0))
        alike = int(metrics.get("groups_all_alike_unsolved", 0))
        text = (
            f"only {trained} of {rolled} groups had a reward spread and trained ({solved} with every sample "
            f"solved, {alike} with every sample scored alike below success_threshold)."
        )
        if solved >= alike:
            return text + (
                " The policy already solves most tasks (expected after a warm start): give it harder tasks, "
                "or stop; with a validation set the best evaluated adapter is kept (keep_best)."
            )
        return text + (
            " The tasks are too hard or the reward too coarse to tell attempts apart: a larger group_size, "
            "partial credit in the reward, easier tasks, or dynamic_sampling_rounds."
        )
