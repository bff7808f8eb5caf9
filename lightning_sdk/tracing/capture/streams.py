"""Streams of openai's and anthropic's clients (their stream classes have one shape): record a streamed
call when the user has consumed it or closed it, with exactly what they saw.

The user keeps the client's own `Stream` / `AsyncStream` object (so `isinstance` checks, `with` blocks
and helpers such as `.stream()` keep working): only its private chunk iterator and its `close` are
replaced on that one instance.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from lightning_sdk.tracing.capture.anthropic_calls import MessagesStreamAssembler
from lightning_sdk.tracing.capture.openai_calls import StreamAssembler
from lightning_sdk.tracing.capture.openai_responses import ResponsesStreamAssembler
from lightning_sdk.tracing.episode import LLMCall

__all__ = ["Recording", "tap_async_stream", "tap_stream"]

_ASSEMBLERS: dict[Any, Any] = {"responses": ResponsesStreamAssembler, "messages": MessagesStreamAssembler}
"""The assembler of each API's events, by `LLMCall.metadata["api"]` (chat and text completions: none)."""


class Recording(Protocol):
    """What a stream needs from the request's recording (see `openai_client._Recording`)."""

    template: LLMCall
    prompts: Any
    recorded: bool

    def record(self, calls: list[LLMCall]) -> None: ...

    def guarded(self, step: Callable[..., Any], *args: Any) -> None: ...


def tap_stream(stream: Any, recording: Recording) -> None:
    """Make an `openai.Stream` record its call once consumed or closed (the user keeps the object)."""
    tap, inner, original_close = _StreamTap(recording), stream._iterator, stream.close

    def iterate() -> Any:
        try:
            for chunk in inner:
                tap.seen(chunk)
                yield chunk
            tap.exhausted = True
        except Exception as error:
            tap.error = error
            raise
        finally:
            tap.finish()

    def close() -> None:
        tap.finish()
        original_close()

    stream._iterator, stream.close = iterate(), close


def tap_async_stream(stream: Any, recording: Recording) -> None:
    """The same for an `openai.AsyncStream`."""
    tap, inner, original_close = _StreamTap(recording), stream._iterator, stream.close

    async def iterate() -> Any:
        try:
            async for chunk in inner:
                tap.seen(chunk)
                yield chunk
            tap.exhausted = True
        except Exception as error:
            tap.error = error
            raise
        finally:
            tap.finish()

    async def close() -> None:
        tap.finish()
        await original_close()

    stream._iterator, stream.close = iterate(), close


class _StreamTap:
    """What the sync and async stream wrappers share: keep the chunks the user consumed, and turn
    them into records once, at the end. Keeping references per chunk and assembling them in one go
    costs less on the user's path than parsing each chunk as it passes."""

    def __init__(self, recording: Recording) -> None:
        self.recording = recording
        self.chunks: list[Any] = []
        self.seen = self.chunks.append
        self.exhausted = False
        self.error: BaseException | None = None

    def finish(self) -> None:
        if self.recording.recorded:  # consumed to the end, then closed: recorded once, at the end
            return
        self.recording.guarded(self._record)

    def _record(self) -> None:
        api = self.recording.template.metadata.get("api")
        assembler_class = _ASSEMBLERS.get(api, StreamAssembler)
        assembler = assembler_class(self.recording.template, self.recording.prompts)
        for chunk in self.chunks:
            assembler.add(chunk)
        error = f"{type(self.error).__name__}: {self.error}" if self.error is not None else None
        closed_early = not self.exhausted and self.error is None
        self.recording.record(assembler.calls(error, closed_early))
