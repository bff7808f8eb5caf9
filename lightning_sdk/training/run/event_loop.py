"""`RunLoop`: one asyncio event loop for all of a training run's rollouts and evaluations.

Agents keep async clients between episodes: the OpenAI Agents SDK shares one httpx client across all
its default models, and many agents make one `AsyncOpenAI` at import. Such a client is bound to the
event loop it first ran in; with a new loop per step (`asyncio.run` each time) the second step fails
with "Event loop is closed". So a run keeps one loop, from its first rollout to `close()`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar, cast

__all__ = ["RunLoop"]

T = TypeVar("T")


class RunLoop:
    """Runs coroutines to completion on one persistent event loop (`asyncio.Runner`)."""

    def __init__(self) -> None:
        self._runner: asyncio.Runner | None = None

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run `coroutine` on the run's loop; also when the caller already runs a loop (a notebook), in
        which case the run's loop runs it in a helper thread while the caller waits."""
        if self._runner is None:
            self._runner = asyncio.Runner()
        runner = self._runner
        return _outside_any_loop(lambda: runner.run(coroutine))  # Ctrl+C cancels it, as asyncio.run does

    def close(self) -> None:
        """Cancel what is left on the loop and close it."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            _outside_any_loop(runner.close)


def _outside_any_loop(call: Callable[[], T]) -> T:
    """`call()` here, or in a helper thread when this thread runs an event loop (asyncio allows one
    running loop per thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return call()
    result: dict[str, Any] = {}

    def in_thread() -> None:
        try:
            result["value"] = call()
        except BaseException as error:  # noqa: BLE001 - re-raised in the caller's thread below
            result["error"] = error

    thread = threading.Thread(target=in_thread, name="lightning-sdk-rollout")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return cast(T, result["value"])
