"""`RunLoop`: one asyncio event loop for all of a training run's rollouts and evaluations.

Agents keep async clients between episodes: the OpenAI Agents SDK shares one httpx client across all
its default models, and many agents make one `AsyncOpenAI` at import. Such a client is bound to the
event loop it first ran in; with a new loop per step (`asyncio.run` each time) the second step fails
with "Event loop is closed". So a run keeps one loop, from its first rollout to `close()`.

The loop runs in a thread of its own. The trainer either waits for a coroutine (`run`: a step's rollouts,
an evaluation) or leaves it running while it trains (`submit`: rollouts that run on through the update,
`TrainerConfig.max_staleness`). Each coroutine runs in a copy of its caller's context, as `asyncio.run`
would run it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["RunLoop"]

T = TypeVar("T")

_CLOSE_TIMEOUT_S = 30.0
"""How long `close` waits for the loop's tasks to end once cancelled (an agent's cleanup code)."""


class RunLoop:
    """Runs coroutines on one persistent event loop, in its own thread."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start `coroutine` on the run's loop and return at once; the future holds its result."""
        # `run_coroutine_threadsafe` schedules the task from a handle made here, so it runs in a copy of
        # this thread's context (the caller's context variables reach the agent, as with `asyncio.run`).
        return asyncio.run_coroutine_threadsafe(coroutine, self._started())

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run `coroutine` on the run's loop and wait for its result; also from inside a running loop (a
        notebook), since the run's loop has a thread of its own. Ctrl+C cancels it, as `asyncio.run` does."""
        future = self.submit(coroutine)
        try:
            return future.result()
        except KeyboardInterrupt:
            future.cancel()
            raise

    def close(self) -> None:
        """Cancel what is left on the loop, close it and end its thread."""
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(_cancel_everything(), loop).result(_CLOSE_TIMEOUT_S)
        except (concurrent.futures.TimeoutError, RuntimeError):
            pass  # tasks that ignore cancellation are left to the daemon thread's end
        loop.call_soon_threadsafe(loop.stop)
        thread.join(_CLOSE_TIMEOUT_S)
        if not thread.is_alive():
            loop.close()

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="lightning-sdk-run-loop", daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop


async def _cancel_everything() -> None:
    """What `asyncio.run` does at its end: cancel the other tasks, wait for them, close async generators."""
    loop = asyncio.get_running_loop()
    others = [task for task in asyncio.all_tasks(loop) if task is not asyncio.current_task()]
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)
    await loop.shutdown_asyncgens()
