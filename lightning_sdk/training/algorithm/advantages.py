"""GRPO group-relative advantages over credited LLM calls.

A *group* is the `group_size` episodes of one task. After credit assignment every episode holds a list
of per-call rewards (`None` for calls left untrained). The advantage of call `k` of episode `i` is

    A_ik = (reward_ik - mean_g) / (std_g + eps)      (or reward_ik - mean_g without std scaling)

where `mean_g` and `std_g` are the mean and (population) standard deviation of the group's per-call
rewards **with every episode weighted equally**: an episode with `n_i` credited calls gives each of
them weight `1 / n_i`.

Why weight by episode and not by call: the baseline must not depend on how many calls an episode
happened to make. With `"equal"` credit every call of episode `i` carries its return `R_i`, and the
weighted statistics are exactly the mean and standard deviation of the episode returns, which is GRPO
over episodes, the paper's setting. Counting calls instead would let long episodes dominate the
baseline: with returns `[1, 0, 0, 1]` where the first episode made 4 calls and the others 1, the
per-call mean is 5/7 = 0.71 rather than 0.5, so both failures would be pushed down harder (and both
successes up less) only because one episode happened to make more calls.

**Leave-one-out baseline** (`TrainerConfig(episode_baseline="leave_one_out")`, RLOO's): episode `i`'s
calls are compared with the episode-weighted mean of the *other* episodes' calls, `mean_g(-i)`, so a
sample is never its own baseline:

    A_ik = (reward_ik - mean_g(-i)) / (std_g + eps)

With `"equal"` credit this is `N / (N - 1)` times the group-mean advantage (returns `[1, 0, 0, 0]`: the
success gets `1 - 0 = 1` instead of `1 - 0.25 = 0.75`, each failure `0 - 1/3` instead of `-0.25`): the same
direction, a larger push on small groups, and a baseline free of the sample it judges. The scale
`std_g` is the whole group's in both cases.

Groups are skipped (no advantages, so no samples) when fewer than two episodes have credited calls,
or when every credited reward in the group is the same: then every advantage would be zero and the
step would spend compute on a zero gradient. `AdvantageResult.skipped_groups` counts them by reason.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import get_args

from lightning_sdk.training.config import EpisodeBaseline

__all__ = [
    "BASELINES",
    "AdvantageResult",
    "compute_advantages",
    "group_advantages",
    "weighted_group_stats",
]

BASELINES: tuple[str, ...] = get_args(EpisodeBaseline)
"""The episode advantage's baselines (`TrainerConfig.episode_baseline`; see the module docstring)."""

EpisodeRewards = Sequence[float | None]
"""Per-call rewards of one episode, in call order; `None` marks an untrained call."""


@dataclass
class AdvantageResult:
    """Advantages for every group, in the same nesting as the rewards (group -> episode -> call)."""

    advantages: list[list[list[float | None]] | None]
    """Per group: per episode, per call, the advantage (`None` for untrained calls); `None` for a
    skipped group."""
    skipped_groups: dict[str, int] = field(default_factory=dict)
    """Skipped groups by reason: `no_spread` (every reward equal) and `too_few_episodes`."""
    group_means: list[float | None] = field(default_factory=list)
    """The baseline of each group (`None` when skipped), for metrics."""

    @property
    def trained_groups(self) -> int:
        """How many groups produced advantages."""
        return sum(1 for group in self.advantages if group is not None)


def weighted_group_stats(group: Sequence[EpisodeRewards]) -> tuple[float, float]:
    """Mean and population standard deviation of a group's credited rewards, each episode weighing 1."""
    weighted: list[tuple[float, float]] = []
    for rewards in group:
        credited = [reward for reward in rewards if reward is not None]
        weighted.extend((reward, 1.0 / len(credited)) for reward in credited)
    total_weight = math.fsum(weight for _, weight in weighted)
    if total_weight == 0:
        raise ValueError("the group has no credited calls")
    mean = math.fsum(reward * weight for reward, weight in weighted) / total_weight
    variance = math.fsum(weight * (reward - mean) ** 2 for reward, weight in weighted) / total_weight
    return mean, math.sqrt(variance)


def group_advantages(
    group: Sequence[EpisodeRewards],
    scale: bool = True,
    eps: float = 1e-4,
    baseline: str = "group_mean",
) -> tuple[list[list[float | None]] | None, str | None]:
    """Advantages of one group, or `(None, reason)` when the group is skipped (see the module docstring).
    `baseline`: `"group_mean"` or `"leave_one_out"`."""
    if baseline not in BASELINES:
        raise ValueError(f"baseline={baseline!r} is unknown; use one of {BASELINES}.")
    credited = [[reward for reward in rewards if reward is not None] for rewards in group]
    if sum(1 for rewards in credited if rewards) < 2:
        return None, "too_few_episodes"
    flat = [reward for rewards in credited for reward in rewards]
    if max(flat) - min(flat) <= 1e-12 * max(1.0, abs(max(flat))):
        return None, "no_spread"
    mean, std = weighted_group_stats(group)
    denominator = std + eps if scale else 1.0
    baselines = _leave_one_out_means(credited) if baseline == "leave_one_out" else [mean] * len(group)
    advantages = [
        [None if reward is None else (reward - own) / denominator for reward in rewards]
        for rewards, own in zip(group, baselines, strict=True)
    ]
    return advantages, None


def _leave_one_out_means(credited: list[list[float]]) -> list[float]:
    """Per episode, the episode-weighted mean of the other episodes' credited rewards (each weighs 1)."""
    means = [math.fsum(rewards) / len(rewards) if rewards else 0.0 for rewards in credited]
    present = sum(1 for rewards in credited if rewards)
    total = math.fsum(means)
    # At least two episodes have credited calls here, so every episode has another one to compare with.
    return [(total - own) / (present - 1) if rewards else 0.0 for own, rewards in zip(means, credited)]


def compute_advantages(
    groups: Sequence[Sequence[EpisodeRewards]],
    scale: bool = True,
    eps: float = 1e-4,
    baseline: str = "group_mean",
) -> AdvantageResult:
    """Group-relative advantages for a batch of groups (one group per task).

    Args:
        groups: per task, per episode, the per-call rewards from `assign_credit`.
        scale: divide by the group's standard deviation (GRPO); `False` only centres (Dr. GRPO).
        eps: added to the standard deviation before dividing.
        baseline: `"group_mean"` (GRPO) or `"leave_one_out"` (RLOO; see the module docstring).
    """
    result = AdvantageResult(advantages=[])
    skipped: dict[str, int] = {}
    for group in groups:
        advantages, reason = group_advantages(group, scale=scale, eps=eps, baseline=baseline)
        result.advantages.append(advantages)
        if reason is not None:
            skipped[reason] = skipped.get(reason, 0) + 1
            result.group_means.append(None)
        else:
            result.group_means.append(weighted_group_stats(group)[0])
    result.skipped_groups = skipped
    return result
