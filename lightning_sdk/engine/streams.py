"""Hand-over of sampled tokens from an engine's worker thread to a waiting caller (thread or event loop).

Both engines run their model on one worker thread and report progress as `CompletionDelta`s; this module
turns that stream into blocking results, awaitable results and async iterators, so the two engines share
the bookkeeping.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace

from lightning_sdk.engine.types import Completion, CompletionDelta, GenerationResult, WeightVersion

__all__ = ["RequestStream", "ResultBuilder"]

_DONE = object()


class RequestStream:
    """Deltas of one request, pushed by the worker thread and consumed by one caller.

    Created on the caller's side: `asynchronous=True` delivers the deltas to the running event loop (for
    `async for`), otherwise to a blocking queue (for `wait()`, even when called from inside an event loop).
    `push`, `finish` and `fail` are called from the worker thread. With `copies > 1` the worker decodes one
    completion (index 0) and every delta reaches the consumer once per index `0 .. copies - 1` (greedy
    requests with `n > 1`, see `SamplingParams.distinct_samples`).
    """

    def __init__(
        self, asynchronous: bool, on_cancel: Callable[[], None] | None = None, copies: int = 1
    ) -> None:
        self._copies = copies
        self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop() if asynchronous else None
        self._async_queue: asyncio.Queue[object] | None = asyncio.Queue() if self._loop else None
        self._sync_queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._on_cancel = on_cancel
        self._finished = False
        self.answered_by: tuple[WeightVersion] | None = None
        """The weights version that answers the request, once the engine knows it (a request held while
        the engine slept is answered by the weights loaded at the wake); None: the one known at submit."""
        self.cancelled = False
        """True once the consumer stopped reading before the end (workers may stop generating)."""

    def version_or(self, version: WeightVersion) -> WeightVersion:
        """`answered_by` when the engine set it, else `version` (the one known when it was submitted)."""
        return version if self.answered_by is None else self.answered_by[0]

    # -- worker side -------------------------------------------------------------------------------------
    def push(self, delta: CompletionDelta) -> None:
        """Deliver new tokens."""
        if self._copies == 1:
            self._deliver(delta)
            return
        for index in range(self._copies):  # own lists per copy, so consumers never share mutable state
            self._deliver(
                replace(
                    delta,
                    index=index,
                    token_ids=list(delta.token_ids),
                    logprobs=list(delta.logprobs),
                    top_logprobs=None if delta.top_logprobs is None else list(delta.top_logprobs),
                )
            )

    def finish(self) -> None:
        """Every completion of the request is done."""
        self._deliver(_DONE)

    def fail(self, error: BaseException) -> None:
        """The request failed; the consumer sees `error` raised."""
        self._deliver(error)

    def _deliver(self, item: object) -> None:
        if self._loop is None:
            self._sync_queue.put(item)
            return
        try:
            self._loop.call_soon_threadsafe(self._async_queue.put_nowait, item)  # type: ignore[union-attr]
        except RuntimeError:
            pass  # The caller's event loop is closed: nobody is waiting for these tokens any more.

    # -- caller side -------------------------------------------------------------------------------------
    def __aiter__(self) -> AsyncIterator[CompletionDelta]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[CompletionDelta]:
        assert self._async_queue is not None, "RequestStream was created outside an event loop"
        try:
            while True:
                item = await self._async_queue.get()
                if item is _DONE:
                    self._finished = True
                    return
                if isinstance(item, BaseException):
                    self._finished = True
                    raise item
                yield item  # type: ignore[misc]
        finally:
            # The consumer stopped early (client disconnected, task cancelled): free the engine's slot.
            if not self._finished:
                self.cancelled = True
                if self._on_cancel is not None:
                    self._on_cancel()

    def wait(self) -> list[CompletionDelta]:
        """Block until the request is done and return all its deltas."""
        deltas: list[CompletionDelta] = []
        while True:
            item = self._sync_queue.get()
            if item is _DONE:
                return deltas
            if isinstance(item, BaseException):
                raise item
            deltas.append(item)  # type: ignore[arg-type]


@dataclass
class ResultBuilder:
    """Accumulates the deltas of one request into a `GenerationResult`."""

    prompt_token_ids: list[int]
    n: int
    weight_version: WeightVersion = None
    _completions: dict[int, Completion] = field(default_factory=dict)

    def add(self, delta: CompletionDelta) -> None:
        """Append a delta to its completion."""
        completion = self._completions.get(delta.index)
        if completion is None:
            completion = Completion(index=delta.index, token_ids=[], logprobs=[], text="", finish_reason="")
            self._completions[delta.index] = completion
        completion.token_ids.extend(delta.token_ids)
        completion.logprobs.extend(delta.logprobs)
        completion.text += delta.text
        if delta.top_logprobs is not None:
            completion.top_logprobs = (completion.top_logprobs or []) + delta.top_logprobs
        if delta.finish_reason is not None:
            completion.finish_reason = delta.finish_reason

    def build(self) -> GenerationResult:
        """The finished result, completions ordered by index."""
        completions = [
            self._completions.get(i)
            or Completion(index=i, token_ids=[], logprobs=[], text="", finish_reason="abort")
            for i in range(self.n)
        ]
        return GenerationResult(list(self.prompt_token_ids), completions, self.weight_version)

    @classmethod
    def collect(
        cls, deltas: list[CompletionDelta], prompt_token_ids: list[int], n: int, version: WeightVersion
    ) -> GenerationResult:
        """Build a result from a finished list of deltas."""
        builder = cls(prompt_token_ids, n, version)
        for delta in deltas:
            builder.add(delta)
        return builder.build()
