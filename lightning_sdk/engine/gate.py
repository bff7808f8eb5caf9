"""`RequestGate`: hold new requests while the weights change, and know when none is in flight.

While rollouts run on through an update (`TrainerConfig(max_staleness >= 1)`), an agent may call the model
at any moment, also while the engine sleeps for the update or loads the new adapter. Such a call is held
here, before it reaches the engine, and starts once the gate opens again: so it is answered by the new
weights, and the weight version it reports (read as it starts) is the one that answered it. A call is never
failed or retried for this. Closing the gate waits for the requests already running, so the engine is idle
when the update begins.

The gate also keeps the time the engine had requests in flight, so a run can say how busy the engine was.
"""

from __future__ import annotations

import asyncio
import threading
import time

__all__ = ["RequestGate"]


class RequestGate:
    """Admits requests while open; holds them while closed. Safe to use from any thread and event loop."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._open = True
        self._in_flight = 0
        self._held = 0
        self._held_total = 0
        self._closes = 0
        # Async callers wait on a future of their own loop; opening the gate resolves them in their loop.
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._busy_s = 0.0
        self._busy_since: float | None = None
        self._closed_s = 0.0
        self._closed_since: float | None = None

    # -- the requests' side ---------------------------------------------------------------------------------
    async def enter(self) -> None:
        """Wait (without blocking the event loop) until the gate is open, then count a request in flight."""
        while True:
            with self._lock:
                if self._open:
                    self._admit()
                    return
                loop = asyncio.get_running_loop()
                waiter: asyncio.Future[None] = loop.create_future()
                self._waiters.append((loop, waiter))
                self._held += 1
                self._held_total += 1
            try:
                await waiter
            finally:
                with self._lock:
                    self._held -= 1

    def enter_blocking(self) -> None:
        """`enter` for a caller without an event loop (blocking generation)."""
        with self._lock:
            self._held += 1
            self._held_total += 1 if not self._open else 0
            self._lock.wait_for(lambda: self._open)
            self._held -= 1
            self._admit()

    def leave(self) -> None:
        """A request admitted by `enter` finished (or failed, or its caller went away)."""
        with self._lock:
            self._in_flight -= 1
            if self._in_flight == 0 and self._busy_since is not None:
                self._busy_s += time.perf_counter() - self._busy_since
                self._busy_since = None
            self._lock.notify_all()

    def _admit(self) -> None:
        if self._in_flight == 0:
            self._busy_since = time.perf_counter()
        self._in_flight += 1

    # -- the trainer's side ---------------------------------------------------------------------------------
    def close(self, timeout_s: float | None = None) -> None:
        """Hold every new request, and return once the running ones have finished.

        Raises `TimeoutError` (and opens the gate again) when they have not finished within `timeout_s`.
        """
        with self._lock:
            if self._open:
                self._closed_since = time.perf_counter()
            self._open = False
            self._closes += 1
            try:
                finished = self._lock.wait_for(lambda: self._in_flight == 0, timeout_s)
            except BaseException:  # Ctrl+C while waiting: nobody would open it again
                self._open_locked()
                raise
            if not finished:
                self._open_locked()
                raise TimeoutError(
                    f"{self._in_flight} model calls were still running after {timeout_s:g} s; the engine was "
                    "not paused."
                )

    def open(self) -> None:
        """Admit requests again, the held ones first."""
        with self._lock:
            self._open_locked()

    def _open_locked(self) -> None:
        if self._closed_since is not None:
            self._closed_s += time.perf_counter() - self._closed_since
            self._closed_since = None
        self._open = True
        waiters, self._waiters = self._waiters, []
        self._lock.notify_all()
        for loop, waiter in waiters:
            try:
                loop.call_soon_threadsafe(_resolve, waiter)
            except RuntimeError:  # that loop is closed: its caller is gone
                pass

    @property
    def is_open(self) -> bool:
        return self._open

    @property
    def in_flight(self) -> int:
        """Requests admitted and not yet finished."""
        return self._in_flight

    @property
    def held(self) -> int:
        """Requests waiting for the gate to open."""
        return self._held

    @property
    def held_total(self) -> int:
        """Requests that have waited for the gate since it was made."""
        return self._held_total

    @property
    def closes(self) -> int:
        """Times the gate was closed since it was made."""
        return self._closes

    def closed_seconds(self) -> float:
        """Seconds so far during which the gate was closed: the time a call could have been held. Episode
        time limits leave it out (`rollouts.in_process.run_episode`): the update's time is not the agent's."""
        with self._lock:
            closed = 0.0 if self._closed_since is None else time.perf_counter() - self._closed_since
            return self._closed_s + closed

    def busy_seconds(self) -> float:
        """Seconds so far during which at least one request was in flight."""
        with self._lock:
            running = 0.0 if self._busy_since is None else time.perf_counter() - self._busy_since
            return self._busy_s + running


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():  # its caller may have been cancelled meanwhile
        waiter.set_result(None)
