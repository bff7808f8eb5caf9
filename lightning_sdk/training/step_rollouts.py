"""One step's rollouts grouped by task: what `Trainer.fit`'s loop rolls out, trains on and reports."""

from __future__ import annotations

from dataclasses import dataclass, field

from lightning_sdk.rollouts.in_process import Rollout
from lightning_sdk.tracing.episode import Episode
from lightning_sdk.training.algorithm.prepare import PreparedGroup, reward_stats

__all__ = ["StepRollouts", "group_episodes", "groups_to_train", "rollout_metrics"]


@dataclass
class StepRollouts:
    """What one step's rollout rounds produced."""

    rollouts: list[Rollout] = field(default_factory=list)
    groups: list[PreparedGroup] = field(default_factory=list)
    """One per task, in the order of `Rollout.task_index`."""
    rounds: int = 0
    extra: dict[str, float] = field(default_factory=dict)
    """Metrics only rollouts that run on through the update have (staleness, groups in flight)."""

    @property
    def groups_with_signal(self) -> int:
        return sum(group.has_signal for group in self.groups)


def group_episodes(rollouts: list[Rollout], num_tasks: int) -> list[list[Episode]]:
    """The episodes of each task, in task order (`Rollout.task_index`)."""
    groups: list[list[Episode]] = [[] for _ in range(num_tasks)]
    for rollout in rollouts:
        groups[rollout.task_index].append(rollout.episode)
    return groups


def groups_to_train(groups: list[PreparedGroup], wanted: int) -> list[PreparedGroup]:
    """Dynamic sampling's batch: the first `wanted` groups that carry a learning signal."""
    return [group for group in groups if group.has_signal][:wanted]


def rollout_metrics(rolled: StepRollouts) -> dict[str, float]:
    """The step's training reward and how many groups it rolled out, with a signal, in how many rounds."""
    # The training reward describes every rollout of the step, not only the groups kept for training.
    return {
        **reward_stats([group.kept for group in rolled.groups]),
        "groups_rolled_out": len(rolled.groups),
        "groups_with_signal": rolled.groups_with_signal,
        "rollout_rounds": rolled.rounds,
        **rolled.extra,
    }
