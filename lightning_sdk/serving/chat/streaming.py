"""Server-sent event streams for chat and text completions."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from fastapi.responses import StreamingResponse

from lightning_sdk.engine.types import CompletionDelta, Engine, SamplingParams
from lightning_sdk.serving.chat.bodies import (
    ResponseMeta,
    chat_chunk,
    chat_logprobs,
    completion_choice,
    completion_logprobs,
    finish_reason,
    usage,
)
from lightning_sdk.serving.errors import APIError, error_body
from lightning_sdk.serving.served import StreamedCall
from lightning_sdk.serving.tools.calls import ToolTextFilter

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "StagedEvents",
    "chat_events",
    "completion_events",
    "event_stream",
    "first_and_rest",
    "merged_streams",
    "sse",
    "staged_events",
]

log = logging.getLogger(__name__)
DONE = "data: [DONE]\n\n"


class StagedEvents(Protocol):
    """A stream whose events come in stages (the Responses and Messages APIs): an opening, events per
    engine delta, a closing, or an in-band error event once the status line is sent."""

    def opening(self) -> Iterable[str]: ...

    def on_delta(self, delta: CompletionDelta) -> Iterable[str]: ...

    def failed(self, error: Exception) -> str: ...

    def closing(self) -> Iterable[str]: ...


async def staged_events(deltas: AsyncIterator[CompletionDelta], stream: StagedEvents) -> AsyncIterator[str]:
    """The events of `stream`, driven by the engine's deltas."""
    for event in stream.opening():
        yield event
    try:
        async for delta in deltas:
            for event in stream.on_delta(delta):
                yield event
    except Exception as error:  # noqa: BLE001 - the status line is sent; report in-band
        yield stream.failed(error)
        return
    for event in stream.closing():
        yield event


def sse(payload: dict[str, Any]) -> str:
    """One server-sent event."""
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def event_stream(events: AsyncIterator[str], served: StreamedCall | None = None) -> StreamingResponse:
    """The answer that sends `events`; `served` (when the call is observed) is reported once they end."""
    return StreamingResponse(
        events if served is None else served.around(events), media_type="text/event-stream"
    )


async def first_and_rest(stream: AsyncIterator[Any]) -> tuple[Any, AsyncIterator[Any]]:
    """Wait for the first item, so errors before any output still get a proper status code."""
    first = await anext(stream)

    async def rest() -> AsyncIterator[Any]:
        yield first
        async for item in stream:
            yield item

    return first, rest()


async def chat_events(
    deltas: AsyncIterator[CompletionDelta],
    *,
    meta: ResponseMeta,
    tokenizer: PreTrainedTokenizerBase,
    prompt_token_ids: list[int],
    n: int,
    text_filter: Callable[[], ToolTextFilter] | None,
    top_logprobs: int | None,
    include_usage: bool,
    served: StreamedCall | None = None,
) -> AsyncIterator[str]:
    """SSE chunks of a chat completion; `top_logprobs=None` leaves out the standard logprobs.

    With tools, `text_filter()` makes each choice's filter that holds back tool calls (`PreparedChat`).
    `served`, when given, is told what each chunk sends."""
    filters = {index: text_filter() for index in range(n)} if text_filter is not None else {}
    first = [
        {"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None} for i in range(n)
    ]
    if served is not None:
        for index in range(n):
            served.add(index, prompt_token_ids)
    yield sse(chat_chunk(meta, first, prompt_token_ids=prompt_token_ids))
    generated = 0
    try:
        async for delta in deltas:
            generated += len(delta.token_ids)
            choice, tool_calls = _chat_delta(delta, filters.get(delta.index), tokenizer, top_logprobs)
            if served is not None:
                served.add(
                    delta.index,
                    prompt_token_ids,
                    text=choice["delta"]["content"],
                    tool_calls=tool_calls,
                    token_ids=delta.token_ids,
                    logprobs=delta.logprobs,
                    finish_reason=choice["finish_reason"],
                )
            yield sse(chat_chunk(meta, [choice]))
    except Exception as error:  # noqa: BLE001 - the status line is sent; report in-band, as OpenAI does
        yield _error_event(error, served)
        return
    if include_usage:
        counts = usage(len(prompt_token_ids), generated)
        if served is not None:
            served.usage = counts
        yield sse(chat_chunk(meta, [], usage=counts))
    yield DONE


def _chat_delta(
    delta: CompletionDelta,
    text_filter: ToolTextFilter | None,
    tokenizer: PreTrainedTokenizerBase,
    top_logprobs: int | None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One chunk's choice, and the tool calls it sends (at the end of a choice with tools)."""
    content = text_filter.feed(delta.text) if text_filter is not None else delta.text
    message: dict[str, Any] = {"content": content}
    tool_calls: list[dict[str, Any]] = []
    if delta.finish_reason is not None and text_filter is not None:
        rest, parsed = text_filter.finish()
        message["content"] = content + rest
        tool_calls = parsed.tool_calls
        if tool_calls:
            message["tool_calls"] = [{"index": k, **call} for k, call in enumerate(tool_calls)]
    logprobs = None
    if top_logprobs is not None:
        logprobs = chat_logprobs(tokenizer, delta.token_ids, delta.logprobs, delta.top_logprobs, top_logprobs)
    choice = {
        "index": delta.index,
        "delta": message,
        "logprobs": logprobs,
        "finish_reason": finish_reason(delta.finish_reason, bool(tool_calls)),
        "token_ids": delta.token_ids,
        "token_logprobs": delta.logprobs,
    }
    return choice, tool_calls


async def merged_streams(
    engine: Engine, prompts: Sequence[list[int]], params: SamplingParams
) -> AsyncIterator[tuple[int, CompletionDelta]]:
    """Deltas of several prompts' streams as they come, tagged with the prompt's position."""
    if len(prompts) == 1:
        async for delta in engine.astream(prompts[0], params):
            yield 0, delta
        return
    queue: asyncio.Queue[Any] = asyncio.Queue()

    async def pump(position: int) -> None:
        try:
            async for delta in engine.astream(prompts[position], params):
                await queue.put((position, delta))
        except Exception as error:  # noqa: BLE001 - handed to the consumer below
            await queue.put(error)
        await queue.put(None)

    tasks = [asyncio.create_task(pump(i)) for i in range(len(prompts))]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()


async def completion_events(
    deltas: AsyncIterator[tuple[int, CompletionDelta]],
    *,
    meta: ResponseMeta,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[list[int]],
    n: int,
    top_logprobs: int | None,
    include_usage: bool,
    served: StreamedCall | None = None,
) -> AsyncIterator[str]:
    """SSE chunks of a text completion; each choice's first chunk carries its `prompt_token_ids`.
    `served`, when given, is told what each chunk sends."""
    started: set[int] = set()
    offsets: dict[int, int] = {}
    generated = 0
    try:
        async for position, delta in deltas:
            index = position * n + delta.index
            generated += len(delta.token_ids)
            logprobs = None
            if top_logprobs is not None:
                logprobs = completion_logprobs(
                    tokenizer,
                    delta.token_ids,
                    delta.logprobs,
                    delta.top_logprobs,
                    top_logprobs,
                    offsets.get(index, 0),
                )
            offsets[index] = offsets.get(index, 0) + len(delta.text)
            choice = completion_choice(
                index, prompts[position], delta, logprobs, with_prompt=index not in started
            )
            started.add(index)
            if served is not None:
                served.add(
                    index,
                    prompts[position],
                    text=delta.text,
                    token_ids=delta.token_ids,
                    logprobs=delta.logprobs,
                    finish_reason=choice["finish_reason"],
                )
            yield sse({**meta.fields("text_completion"), "choices": [choice]})
    except Exception as error:  # noqa: BLE001 - the status line is sent; report in-band
        yield _error_event(error, served)
        return
    if include_usage:
        counts = usage(sum(len(p) for p in prompts), generated)
        if served is not None:
            served.usage = counts
        yield sse({**meta.fields("text_completion"), "choices": [], "usage": counts})
    yield DONE


def _error_event(error: Exception, served: StreamedCall | None) -> str:
    if isinstance(error, APIError):
        body = error.body()
    else:
        log.exception("engine failed during a streamed response", exc_info=error)
        body = error_body(f"The engine failed: {error}", "server_error", code="engine_error")
    if served is not None:
        served.error = body["error"]["message"]
    return sse(body)
