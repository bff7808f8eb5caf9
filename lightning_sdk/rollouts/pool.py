"""`RolloutPool`: groups of rollouts that run on while the trainer updates the model.

A group is one task's `group_size` runs of the agent. The pool starts groups on the run's event loop and
hands them back whole, in the order they complete; the caller decides how many to keep in flight and which
to train on. While the trainer updates, the agents' own code, their tools and their waits go on; their
model calls wait at the engine's gate (`lightning_sdk.engine.gate`) until the new weights are in.

The pool knows nothing of steps or staleness: it runs groups and says which tasks it holds (running, or
complete and not yet taken), so that a checkpoint can record them as not yet trained.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from lightning_sdk.rollouts.in_process import Rollout

__all__ = ["CompleteGroup", "GroupRun", "RolloutPool"]

GroupRun = Callable[[Any], Awaitable[list[Rollout]]]
"""Runs one task `group_size` times and returns its rollouts (`sample_index` set, `task_index` free)."""

Submit = Callable[[Coroutine[Any, Any, Any]], concurrent.futures.Future[Any]]
"""Starts a coroutine on the run's event loop (`RunLoop.submit`)."""


@dataclass
class CompleteGroup:
    """One task's group, every run of it finished."""

    task_id: int
    """The task's position in the training set (what a checkpoint records)."""
    task: Any
    rollouts: list[Rollout]
    """In `sample_index` order."""


class RolloutPool:
    """Runs groups in the background and returns them as they complete. Use from one thread (the loop's)."""

    def __init__(self, run_group: GroupRun, submit: Submit) -> None:
        self._run_group = run_group
        self._submit = submit
        self._running: dict[int, tuple[int, concurrent.futures.Future[Any]]] = {}  # serial -> (task_id, fut)
        self._complete: queue.SimpleQueue[tuple[int, CompleteGroup | BaseException]] = queue.SimpleQueue()
        self._waiting: list[CompleteGroup] = []  # complete, not yet taken (kept here across `wait_idle`)
        self._serial = 0
        self._lock = threading.Lock()

    def start(self, task_id: int, task: Any) -> None:
        """Start running a group of `task` (the task at `task_id` of the training set)."""
        serial, self._serial = self._serial, self._serial + 1
        future = self._submit(self._run(serial, task_id, task))
        with self._lock:
            self._running[serial] = (task_id, future)

    async def _run(self, serial: int, task_id: int, task: Any) -> None:
        try:
            outcome: CompleteGroup | BaseException = CompleteGroup(task_id, task, await self._run_group(task))
        except asyncio.CancelledError:
            raise  # `close`: nobody waits for it
        except BaseException as error:  # noqa: BLE001 - raised in the trainer's thread by `next_complete`
            outcome = error
        self._complete.put((serial, outcome))

    def next_complete(self) -> CompleteGroup:
        """The next group to complete (one already complete first); blocks until one does. A group whose
        run raised (a bug outside the agent: the agent's own errors are failed episodes) raises here."""
        if self._waiting:
            return self._waiting.pop(0)
        if not self.in_flight:
            raise RuntimeError("Internal error: waiting for a group while none is running.")
        return self._received(*self._complete.get())

    def wait_idle(self) -> None:
        """Wait until no group is running (each one completed is kept for `next_complete`)."""
        while self.in_flight:
            self._waiting.append(self._received(*self._complete.get()))

    def _received(self, serial: int, outcome: CompleteGroup | BaseException) -> CompleteGroup:
        with self._lock:
            self._running.pop(serial, None)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    @property
    def in_flight(self) -> int:
        """Groups running now."""
        with self._lock:
            return len(self._running)

    @property
    def held(self) -> int:
        """Groups running or complete and not yet taken."""
        return self.in_flight + len(self._waiting)  # a complete one not yet received still counts as running

    def task_ids(self) -> list[int]:
        """The training-set positions of every group held (running, or complete and not taken), oldest
        first: what a checkpoint records as not yet trained."""
        with self._lock:
            running = [(serial, task_id) for serial, (task_id, _) in self._running.items()]
        waiting = [group.task_id for group in self._waiting]
        return waiting + [task_id for _, task_id in sorted(running)]

    def close(self) -> None:
        """Cancel the groups still running (their tasks are in `task_ids()` until now)."""
        with self._lock:
            running, self._running = list(self._running.values()), {}
        for _, future in running:
            future.cancel()
        self._waiting.clear()
