"""`OverlappedRollouts`: a step's groups with rollouts that run on through the update (`max_staleness >= 1`).

`Trainer.fit`'s loop is the same loop either way: a step collects its groups, trains on them and pushes
the new weights. With `max_staleness=0` it rolls out the step's batch and waits for every episode; here the
groups come from a pool that never stops:

    agents  ─ run ─ run ─ run ─ wait at the gate ─ run ─ run ─ run ─ wait ─ ...
    engine  ─ busy ──────────── │ asleep, training │ ─ busy ────────────── │ ...
    trainer ─ waits for batch_size complete groups ─ update ─ push ─ waits ...

An evaluation between steps runs beside training where the engine can pin the evaluated step's adapter
(`lightning_sdk.training.evaluation`, `TrainerConfig.eval_beside_training`): no update waits for it.
Otherwise, and for the final one, it runs on the new weights beside the groups in flight (in-process
agents: the evaluation's calls name their own sampling lane), so the agents' tools keep running through
it too, and the next update waits for it (`evaluation_phase`).

Up to `(S + 1) x batch_size` groups are held (running, or complete and not yet trained on); a step trains on
the first `batch_size` to complete. During the update the engine's gate holds every model call
(`RequestGate`): the call waits, and the new weights answer it. The groups that replace the ones taken
start then, once the gate is closed, so their first call is already answered by the new weights: a group
started at update k is k's age, not k-1's. A group with a trained call more than S updates old is left out
(`groups_too_old`; its episodes are stored).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any

from lightning_sdk.rollouts.pool import CompleteGroup, GroupRun, RolloutPool
from lightning_sdk.training.algorithm.prepare import PreparedGroup, mark_group_untrained
from lightning_sdk.training.algorithm.staleness import group_staleness, staleness_metrics
from lightning_sdk.training.data import TaskCursor
from lightning_sdk.training.step_rollouts import StepRollouts, evaluation_alone

if TYPE_CHECKING:
    from lightning_sdk.training.run.session import TrainingSession

__all__ = ["OverlappedRollouts", "check_overlap_possible"]

log = logging.getLogger("lightning_sdk.training")

TOO_OLD_WARNING_SHARE = 0.25
"""Warn once when more than this share of a step's groups were too old to train on."""


class OverlappedRollouts:
    """The pool of groups in flight for one run, and what a step takes from it."""

    def __init__(
        self,
        session: TrainingSession,
        cursor: TaskCursor,
        run_group: GroupRun,
        prepare: Callable[[Any, list[Any]], PreparedGroup],
    ) -> None:
        self.session, self.config, self.cursor = session, session.config, cursor
        self.prepare = prepare
        self.pool = RolloutPool(run_group, session.loop.submit)
        self.capacity = (self.config.max_staleness + 1) * self.config.batch_size
        self._phase = ExitStack()
        self._warned_too_old = False
        self.running_at_update = 0
        """Groups running (not complete) when the last update started: the agents it did not stop."""
        self.running = False
        """Between `start` and `stop`: the evaluations before and after have the engine to themselves."""

    # -- running -------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Wake the engine at the training temperature and fill the pool."""
        self._phase.enter_context(self.session.rollout_phase())
        self.running = True
        self.top_up()

    def top_up(self) -> None:
        """Start groups until `capacity` are held."""
        self._start(self.capacity - self.pool.held)

    def _start(self, count: int) -> None:
        """Start `count` groups of the next tasks (none for `count <= 0`)."""
        if count > 0:
            for task_id in self.cursor.next_indices(count):
                self.pool.start(task_id, self.cursor.tasks[task_id])

    def collect(self, step: int) -> StepRollouts:
        """The step's groups: the first `batch_size` to complete that are recent enough (with
        `dynamic_sampling_rounds`, that carry a learning signal, taking at most `rounds + 1` batches).

        A group too old to train does not count: a new group starts in its place at once (on the weights
        served now, so it cannot be too old for this step), and the step waits for it or for another one
        to complete. Every step thus trains as many groups as the step-by-step loop would."""
        config = self.config
        wanted, limit = config.batch_size, config.batch_size * (config.dynamic_sampling_rounds + 1)
        current = step - 1  # the weights the engine serves now, which this step updates
        rolled, ages, too_old, taken = StepRollouts(), [], 0, 0
        while taken - too_old < limit and _counted(rolled, config.dynamic_sampling_rounds) < wanted:
            if not self.pool.held:  # dynamic sampling took every group held and still wants more
                self.top_up()
            group = self.pool.next_complete()
            taken += 1
            prepared = self.prepare(group.task, [r.episode for r in group.rollouts])
            age = group_staleness(prepared, current)
            stale = age > config.max_staleness
            rolled.rollouts += self._numbered(group, taken - 1, dropped=stale)  # its place in the step
            if stale:
                too_old += 1
                mark_group_untrained(prepared, "too_old")  # its calls must not read as trained
                # One replacement, on the current weights; the step's other groups are replaced in the
                # update window as always (topping up here would start them a step early, on old weights).
                self._start(1)
                continue
            ages.append(age)
            rolled.groups.append(prepared)
        rolled.rounds = math.ceil((taken - too_old) / wanted)
        self._warn_if_too_old(step, too_old, taken)
        rolled.extra = staleness_metrics(ages, too_old, config.max_staleness)
        return rolled

    def _numbered(self, group: CompleteGroup, index: int, dropped: bool = False) -> list[Any]:
        """The group's rollouts with their position in the step (as the step-by-step loop numbers them)."""
        rollouts = [dataclasses.replace(r, task_index=index) for r in group.rollouts]
        if dropped:
            for rollout in rollouts:
                rollout.episode.metadata["not_trained"] = "too old (max_staleness)"
        return rollouts

    def _warn_if_too_old(self, step: int, too_old: int, taken: int) -> None:
        if self._warned_too_old or not taken or too_old / taken <= TOO_OLD_WARNING_SHARE:
            return
        self._warned_too_old = True
        log.warning(
            "Step %d: %d of %d groups were sampled more than max_staleness=%d updates ago and were left out "
            "(their episodes are stored, marked not_trained). Slow episodes outlast the updates: raise "
            "max_staleness, or lower episode_timeout_s.",
            step,
            too_old,
            taken,
            self.config.max_staleness,
        )

    # -- around the update and the evaluations ------------------------------------------------------------
    @contextmanager
    def update_window(self, last: bool = False) -> Iterator[None]:
        """The update and the weight push, with the engine asleep: new model calls wait at the gate (the
        ones running finish first), and are answered by the new weights once it opens again. The groups
        taken for this step are replaced here, so their agents start during the update (not after the
        `last` step: nothing would train them)."""
        engine: Any = self.session.engine  # `pause`/`resume` are `EngineBase`'s (checked when the run starts)
        engine.pause()
        try:  # whatever fails from here on (Ctrl+C included), the gate opens again: held calls never hang
            if not last:
                self.top_up()
            self.running_at_update = self.pool.in_flight
            engine.sleep()
            yield
        finally:
            try:
                engine.wake()
            finally:
                engine.resume()

    @contextmanager
    def evaluation_phase(self) -> Iterator[dict[str, float]]:
        """An evaluation on the new weights (the next update waits for it). In-process agents are evaluated
        beside the groups in flight: the evaluation's calls name its lane, so the engine samples them as
        evaluations do (greedy) and the groups' calls at the training temperature, on the same weights.
        Runners' calls name no lane: with runners the running groups finish first and the evaluation then
        has the engine alone. Yields what the evaluation's record adds: the groups that ran beside it, or
        the seconds waited for them."""
        session = self.session
        if not self.running:  # the first evaluation: no training rollout runs yet
            with evaluation_alone(session) as added:
                yield added
            return
        if session.remote is None:
            session.sample_as("eval")  # calls that name no lane: the agent's own HTTP, never trained
            try:
                yield {"eval_groups_in_flight": float(self.pool.in_flight)}
            finally:
                session.sample_as("train")
            return
        started = time.perf_counter()
        self.pool.wait_idle()
        waited = time.perf_counter() - started
        self._phase.close()
        try:
            with evaluation_alone(session) as added:
                added["time_eval_wait_s"] = waited
                yield added
        finally:
            self._phase.enter_context(session.rollout_phase())

    # -- the end -------------------------------------------------------------------------------------------
    def stop(self, finish_running: bool = True) -> None:
        """Give the tasks of the groups still held back to the cursor, so that a checkpoint taken now
        records them as not yet trained, and put the engine back to sleep. `finish_running`: let the running
        groups end first (a run that ends normally, after its final evaluation ran beside them: agents in
        threads cannot be cancelled); else cancel them (an error, Ctrl+C)."""
        self.running = False
        if finish_running:
            self.pool.wait_idle()
        held = self.pool.task_ids()
        self.pool.close()
        self.cursor.give_back(held)
        self._phase.close()

    def cursor_with_held_tasks(self) -> TaskCursor:
        """A copy of the cursor with the held groups' tasks given back: what a checkpoint saves."""
        cursor = dataclasses.replace(self.cursor, returned=list(self.cursor.returned))
        cursor.give_back(self.pool.task_ids())
        return cursor


def check_overlap_possible(session: TrainingSession) -> None:
    """Refuse, before anything runs, what rollouts that run on through the update cannot do yet."""
    if session.world_size > 1:
        raise ValueError(
            "max_staleness >= 1 is not supported under torchrun yet (each rank would train on groups that "
            "complete at different times); set max_staleness=0 or train in one process."
        )
    if not all(callable(getattr(session.engine, name, None)) for name in ("pause", "resume")):
        raise ValueError(
            "max_staleness >= 1 needs an engine that can hold model calls during the update (pause and "
            f"resume: the project's VLLMEngine and TransformersEngine); {type(session.engine).__name__} has "
            "no such methods. Set max_staleness=0."
        )


def _counted(rolled: StepRollouts, dynamic_sampling_rounds: int) -> int:
    """Groups that count towards the batch: those with a learning signal under dynamic sampling."""
    return rolled.groups_with_signal if dynamic_sampling_rounds else len(rolled.groups)
