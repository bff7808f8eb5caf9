"""The server-sent events of a streamed message (`POST /v1/messages` with `stream: true`).

The sequence Anthropic documents, each frame `event: <type>` and `data: <json with that type>`:
`message_start` (the message, no content yet), then per content block `content_block_start`, its
`content_block_delta`s (`text_delta` for text, `input_json_delta` for a tool's input) and
`content_block_stop`, then `message_delta` (the stop reason and the output tokens) and `message_stop`.
Text streams as the engine samples it; with tools, text that may be a tool call is held back
(`ToolTextFilter`) and the calls are sent whole at the end, their input in one delta. An engine failure
after the first event is sent in-band as an `error` event, as Anthropic's API does.

The token-level extras ride on `message_start.message` (`prompt_token_ids`, `weight_version`) and on
`message_delta` (`prompt_token_ids`, `token_ids`, `token_logprobs`, `weight_version` of the whole message).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from lightning_sdk.engine.text import decode
from lightning_sdk.engine.types import CompletionDelta
from lightning_sdk.serving.chat.bodies import finish_reason, usage
from lightning_sdk.serving.context import PreparedChat
from lightning_sdk.serving.errors import APIError
from lightning_sdk.serving.messages.errors import messages_error
from lightning_sdk.serving.messages.schemas import (
    ContentBlockDeltaEvent,
    ContentBlockStartEvent,
    ContentBlockStopEvent,
    ErrorResponse,
    InputJSONDelta,
    Message,
    MessageDelta,
    MessageDeltaEvent,
    MessageDeltaUsage,
    MessageStartEvent,
    MessageStopEvent,
    TextBlock,
    TextDelta,
    ToolUseBlock,
    Usage,
)
from lightning_sdk.serving.messages.translate import answer_parts, matched_stop_sequence, stop_reason
from lightning_sdk.serving.served import StreamedCall
from lightning_sdk.serving.tools.calls import ParsedOutput

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["MessageStream", "ending", "sse_event"]

log = logging.getLogger(__name__)

_Event = (
    MessageStartEvent
    | ContentBlockStartEvent
    | ContentBlockDeltaEvent
    | ContentBlockStopEvent
    | MessageDeltaEvent
    | MessageStopEvent
    | ErrorResponse
)


def sse_event(event: _Event) -> str:
    """One server-sent event, named by its type."""
    return f"event: {event.type}\ndata: {event.model_dump_json()}\n\n"


def ending(
    tokenizer: PreTrainedTokenizerBase,
    engine_finish: str | None,
    token_ids: list[int],
    text: str,
    stop_sequences: Sequence[str],
    tool_use: bool,
) -> MessageDelta:
    """Why a message ended: the stop reason, and the stop sequence that ended it. `text` is the text the
    engine returned (a matched stop string left out), `token_ids` the ids it sampled (the string's
    included)."""
    matched = None
    if engine_finish == "stop" and stop_sequences and not tool_use:
        sampled = decode(tokenizer, token_ids, skip_special_tokens=True)
        matched = matched_stop_sequence(sampled, text, stop_sequences)
    return MessageDelta(stop_reason=stop_reason(engine_finish, tool_use, matched), stop_sequence=matched)


class MessageStream:
    """The state of one streamed message, and the events each stage of it sends (driven by
    `lightning_sdk.serving.chat.streaming.staged_events`). `served`, when given, is told what the events
    send."""

    def __init__(
        self,
        message_id: str,
        model: str,
        prepared: PreparedChat,
        tokenizer: PreTrainedTokenizerBase,
        stop_sequences: Sequence[str],
        weight_version: Any,
        served: StreamedCall | None = None,
    ) -> None:
        self.message_id, self.model, self.prepared = message_id, model, prepared
        self.tokenizer, self.stop_sequences, self.weight_version = tokenizer, stop_sequences, weight_version
        self.served = served
        self.text_filter = prepared.text_filter() if prepared.tools else None
        self.streamed = ""
        """The text sent so far (in content block 0, once it opened)."""
        self.engine_text = ""
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.finish: str | None = None
        self.blocks = 0
        """Content blocks opened so far."""

    def opening(self) -> list[str]:
        prompt = self.prepared.prompt
        message = Message(
            id=self.message_id,
            model=self.model,
            content=[],
            stop_reason=None,
            stop_sequence=None,
            usage=Usage(input_tokens=len(prompt), output_tokens=0),
            prompt_token_ids=prompt,
            weight_version=self.weight_version,
        )
        if self.served is not None:
            self.served.add(0, prompt)
        return [sse_event(MessageStartEvent(message=message))]

    def on_delta(self, delta: CompletionDelta) -> list[str]:
        """Record a delta; the text it adds, as events (the text block opens at the first text)."""
        self.token_ids += delta.token_ids
        self.logprobs += delta.logprobs
        self.engine_text += delta.text
        self.finish = delta.finish_reason or self.finish
        piece = self.text_filter.feed(delta.text) if self.text_filter is not None else delta.text
        if self.served is not None:
            self.served.add(
                0, self.prepared.prompt, text=piece, token_ids=delta.token_ids, logprobs=delta.logprobs
            )
        return self._text(piece)

    def failed(self, error: Exception) -> str:
        if isinstance(error, APIError):
            status, message = error.status, error.message
        else:
            log.exception("engine failed during a streamed message", exc_info=error)
            status, message = 500, f"The engine failed: {error}"
        if self.served is not None:
            self.served.error = message
        return sse_event(messages_error(status, message))

    def closing(self) -> list[str]:
        """The rest of the text, the tool calls, and the message's end."""
        if self.text_filter is not None:
            rest, parsed = self.text_filter.finish()
            # What the model wrote and was not sent yet: served as text when a call cannot be a tool_use.
            held = self.text_filter.text[len(self.streamed) :]
        else:
            rest, parsed, held = "", ParsedOutput(self.streamed, []), ""
        text, calls = answer_parts(rest, parsed.tool_calls, held)
        events = self._text(text or "")
        if self.streamed:
            events.append(sse_event(ContentBlockStopEvent(index=0)))
        for call in calls:
            events += self._tool_use(call)
        end = ending(
            self.tokenizer, self.finish, self.token_ids, self.engine_text, self.stop_sequences, bool(calls)
        )
        if self.served is not None:
            finish = finish_reason(self.finish, bool(calls))
            self.served.add(0, self.prepared.prompt, text=text or "", tool_calls=calls, finish_reason=finish)
            self.served.usage = usage(len(self.prepared.prompt), len(self.token_ids))
        closing = MessageDeltaEvent(
            delta=end,
            usage=MessageDeltaUsage(output_tokens=len(self.token_ids)),
            prompt_token_ids=self.prepared.prompt,
            token_ids=self.token_ids,
            token_logprobs=self.logprobs,
            weight_version=self.weight_version,
        )
        return [*events, sse_event(closing), sse_event(MessageStopEvent())]

    def _text(self, piece: str) -> list[str]:
        if not piece:
            return []
        events = []
        if not self.streamed:
            events.append(sse_event(ContentBlockStartEvent(index=0, content_block=TextBlock(text=""))))
            self.blocks = 1
        self.streamed += piece
        events.append(sse_event(ContentBlockDeltaEvent(index=0, delta=TextDelta(text=piece))))
        return events

    def _tool_use(self, call: dict[str, Any]) -> list[str]:
        index, self.blocks = self.blocks, self.blocks + 1
        function = call["function"]
        block = ToolUseBlock(id=call["id"], name=function["name"], input={})
        return [
            sse_event(ContentBlockStartEvent(index=index, content_block=block)),
            sse_event(
                ContentBlockDeltaEvent(index=index, delta=InputJSONDelta(partial_json=function["arguments"]))
            ),
            sse_event(ContentBlockStopEvent(index=index)),
        ]
