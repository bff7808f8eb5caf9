"""One step's rollouts grouped by task (`StepRollouts`: what `Trainer.fit`'s loop trains on and reports),
and where they come from step by step (`StepByStepRollouts`, `max_staleness=0`).

The loop is one loop for every `max_staleness`: it asks its rollouts for the step's groups (`collect`),
trains inside their `update_window`, evaluates inside their `evaluation_phase`, and checkpoints the cursor
they hand it. `StepByStepRollouts` answers as the loop always did; `OverlappedRollouts`
(`lightning_sdk.training.overlapped`) answers the same calls with groups that run on through the update.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lightning_sdk.rollouts.in_process import Rollout
from lightning_sdk.tracing.episode import Episode
from lightning_sdk.training.algorithm.prepare import PreparedGroup, reward_stats
from lightning_sdk.training.data import TaskCursor

if TYPE_CHECKING:
    from lightning_sdk.training.run.session import TrainingSession

__all__ = [
    "StepByStepRollouts",
    "StepRollouts",
    "evaluation_alone",
    "group_episodes",
    "groups_to_train",
    "rollout_metrics",
]


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


class StepByStepRollouts:
    """A step's groups with `max_staleness=0`: the step's own batch, rolled out when the step starts, every
    episode waited for; the engine then sleeps through the update, and evaluations have it alone."""

    def __init__(
        self,
        session: TrainingSession,
        cursor: TaskCursor,
        agent: Callable[..., Any] | None,
        reward: Callable[[Any, Any], float] | None,
        prepare: Callable[[Any, list[Episode]], PreparedGroup],
    ) -> None:
        self.session, self.config, self.cursor = session, session.config, cursor
        self.agent, self.reward, self.prepare = agent, reward, prepare

    def start(self) -> None:
        """Nothing runs between steps."""

    def collect(self, step: int) -> StepRollouts:
        """Roll out this process's share of the next batch, `group_size` times each task, at the training
        temperature. With `dynamic_sampling_rounds`, further rounds of fresh tasks run while fewer than the
        batch's groups carry a learning signal."""
        session, config = self.session, self.config
        tasks = session.my_share(self.cursor.next_batch())
        rolled = StepRollouts()
        with session.rollout_phase():
            for round_index in range(config.dynamic_sampling_rounds + 1):
                if round_index and rolled.groups_with_signal >= len(tasks):
                    break
                rolled.rounds += 1
                batch = tasks if round_index == 0 else session.my_share(self.cursor.next_batch())
                new = session.rollouts(self.agent, batch, config.group_size, self.reward)
                # Later rounds' groups follow the first round's, so task_index stays unique within the step.
                offset = len(rolled.groups)
                rolled.rollouts += [dataclasses.replace(r, task_index=r.task_index + offset) for r in new]
                groups = group_episodes(new, len(batch))
                rolled.groups += [self.prepare(task, episodes) for task, episodes in zip(batch, groups)]
        return rolled

    def update_window(self, last: bool = False) -> AbstractContextManager[None]:
        """The engine already sleeps: nothing to hold."""
        return nullcontext()

    def evaluation_phase(self) -> AbstractContextManager[dict[str, float]]:
        """The evaluation has the engine alone (`evaluation_alone`)."""
        return evaluation_alone(self.session)

    def cursor_with_held_tasks(self) -> TaskCursor:
        """No group is held between steps: the cursor as it is."""
        return self.cursor

    def stop(self, finish_running: bool = True) -> None:
        """Nothing runs after the last step."""


@contextmanager
def evaluation_alone(session: TrainingSession) -> Iterator[dict[str, float]]:
    """An evaluation with the engine to itself (no training rollout runs): its phase, yielding what the
    evaluation's record adds (nothing, here)."""
    with session.eval_phase():
        yield {}
