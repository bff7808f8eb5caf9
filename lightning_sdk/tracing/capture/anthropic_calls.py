"""`client.messages.create` calls of the `anthropic` client as `LLMCall`s, whole or streamed.

A Messages call is recorded like the equivalent chat call (`lightning_sdk.tracing.formats.messages_items`, the
conversion the server uses too): `messages` are the system prompt and the conversation as chat messages,
`tools` the tools in chat format, `response_message` the answer as an assistant message with
`tool_calls`, and `finish_reason` in chat terms (`stop`, `length`, `tool_calls`; Anthropic's own
`stop_reason` is kept in `metadata`). Token ids come from the project's extras on the message
(`prompt_token_ids`, `token_ids`, `token_logprobs`), or on the stream's events when streamed, so credit
assignment and training treat the call exactly like a chat call to the same endpoint.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from lightning_sdk.tracing.episode import LLMCall
from lightning_sdk.tracing.formats.messages_items import (
    MessagesInputError,
    assistant_message,
    chat_messages,
    chat_tools,
)
from lightning_sdk.tracing.jsonable import jsonable as plain

__all__ = ["FINISH_REASONS", "MessagesStreamAssembler", "calls_from_message", "messages_request_record"]

API = "messages"
"""`LLMCall.metadata["api"]` of a recorded Messages call."""
FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "refusal": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
}
"""Anthropic's `stop_reason` as chat's `finish_reason` (truncation is `length` in both worlds)."""
_NOT_SAMPLING = frozenset({"model", "messages", "system", "tools", "stream"})
_TOKEN_FIELDS = ("prompt_token_ids", "token_ids", "token_logprobs", "weight_version")


def messages_request_record(body: Mapping[str, Any], base_url: str | None, started_at: float) -> LLMCall:
    """The request half of a Messages record, in chat terms (a body the conversion cannot read keeps its
    messages out of the record: the server refuses it, and the record keeps the error)."""
    try:
        messages: list[dict[str, Any]] | None = chat_messages(
            _as_data(body.get("messages")), _as_data(body.get("system"))
        )
    except MessagesInputError:
        messages = None
    try:
        tools = chat_tools(_as_data(body.get("tools"))) or None
    except MessagesInputError:
        tools = plain(body.get("tools"))
    return LLMCall(
        kind="chat",
        model=body.get("model"),
        base_url=base_url,
        messages=messages,
        tools=tools,
        sampling={key: plain(value) for key, value in body.items() if key not in _NOT_SAMPLING},
        started_at=started_at,
        metadata={"api": API},
    )


def _as_data(value: object) -> Any:
    """`value` as plain data. The client sends what the agent passed as it is (a message's content may be
    the blocks of an earlier reply, its own objects): those go through `jsonable`, while the usual
    messages of dicts and strings are checked, not copied (this runs on every call's path)."""
    if not isinstance(value, list):
        return value if value is None or isinstance(value, (str, dict)) else plain(value)
    for item in value:
        if not isinstance(item, dict):
            return plain(value)
        content = item.get("content")
        if isinstance(content, list) and not all(isinstance(block, dict) for block in content):
            return plain(value)
    return value


def _extras(obj: object) -> dict[str, Any]:
    return getattr(obj, "__pydantic_extra__", None) or {}


def _finish(call: LLMCall, stop_reason: str | None, started_at: float, error: str | None) -> None:
    call.finish_reason = FINISH_REASONS.get(stop_reason or "", stop_reason)
    if stop_reason is not None:
        call.metadata["stop_reason"] = stop_reason
    call.latency_s = time.time() - started_at
    call.error = error


def _usage(usage: object) -> dict[str, Any] | None:
    """`usage` in chat terms (the attributes read directly: this runs on every call's path)."""
    if usage is None:
        return None
    if isinstance(usage, dict):
        prompt, completion = usage.get("input_tokens"), usage.get("output_tokens")
    else:
        prompt, completion = getattr(usage, "input_tokens", None), getattr(usage, "output_tokens", None)
    total = prompt + completion if isinstance(prompt, int) and isinstance(completion, int) else None
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total}


def _block(block: Any) -> dict[str, Any]:
    """A response content block as plain data: text and tool_use read directly, any other kind through
    `jsonable` (this runs on every call's path)."""
    kind = getattr(block, "type", None)
    if kind == "text":
        return {"type": "text", "text": block.text}
    if kind == "tool_use":
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": plain(block.input)}
    return dict(plain(block))


def calls_from_message(template: LLMCall, message: object, error: str | None = None) -> list[LLMCall]:
    """The record of a whole `Message` (non-streamed)."""
    blocks = [_block(block) for block in getattr(message, "content", None) or []]
    call = template
    call.request_id = getattr(message, "id", None)
    call.response_message = assistant_message(blocks)
    call.text = call.response_message["content"]
    call.usage = _usage(getattr(message, "usage", None))
    extras = _extras(message)
    call.prompt_token_ids = extras.get("prompt_token_ids")
    call.completion_token_ids = extras.get("token_ids")
    call.logprobs = extras.get("token_logprobs")
    call.policy_version = extras.get("weight_version")
    _finish(call, getattr(message, "stop_reason", None), template.started_at, error)
    return [call]


class MessagesStreamAssembler:
    """The events of a streamed Messages call a user consumed; `calls()` turns them into one record.

    Blocks are assembled from `content_block_start` and the deltas (text, and a tool's input as partial
    JSON); `message_delta` gives the stop reason and the output token count; the project's token ids ride
    on `message_start.message` (the prompt's) and `message_delta` (all of them, for the whole message)."""

    def __init__(self, template: LLMCall, prompts: object = None) -> None:
        self.template = template
        self.request_id: str | None = None
        self.blocks: dict[int, dict[str, Any]] = {}
        self.partial_json: dict[int, list[str]] = {}
        self.stop_reason: str | None = None
        self.usage: dict[str, Any] = {}
        self.tokens: dict[str, Any] = {}
        self.failure: str | None = None

    def add(self, event: Any) -> None:
        kind = getattr(event, "type", None)
        if kind == "content_block_delta":  # most events: one per piece of text
            self._add_delta(event.index, event.delta)
        elif kind == "content_block_start":
            self.blocks[event.index] = _block(event.content_block)
        elif kind == "message_start":
            message = event.message
            self.request_id = getattr(message, "id", None)
            self._take_usage(getattr(message, "usage", None))
            self._take_tokens(message)
        elif kind == "message_delta":
            self.stop_reason = getattr(event.delta, "stop_reason", None) or self.stop_reason
            self._take_usage(getattr(event, "usage", None))
            self._take_tokens(event)
        elif kind == "error":
            self.failure = str(getattr(getattr(event, "error", None), "message", None) or "error event")

    def _take_usage(self, usage: object) -> None:
        for name in ("input_tokens", "output_tokens"):
            value = getattr(usage, name, None)
            if value is not None:
                self.usage[name] = value

    def _take_tokens(self, carrier: object) -> None:
        """The token-id extras `carrier` holds (a later event's replace an earlier one's)."""
        extras = _extras(carrier)
        for name in _TOKEN_FIELDS:
            if extras.get(name) is not None:
                self.tokens[name] = extras[name]

    def _add_delta(self, index: int, delta: Any) -> None:
        block = self.blocks.setdefault(index, {"type": "text", "text": ""})
        kind = getattr(delta, "type", None)
        if kind == "text_delta":
            block["text"] = (block.get("text") or "") + delta.text
        elif kind == "input_json_delta":
            self.partial_json.setdefault(index, []).append(delta.partial_json)

    def calls(self, error: str | None = None, closed_early: bool = False) -> list[LLMCall]:
        blocks = []
        for index in sorted(self.blocks):
            block = dict(self.blocks[index])
            if block.get("type") == "tool_use" and index in self.partial_json:
                text = "".join(self.partial_json[index])
                try:
                    block["input"] = json.loads(text) if text else {}
                except json.JSONDecodeError:  # closed mid-block: keep what was seen
                    block["input"] = {"partial_json": text}
            blocks.append(block)
        call = self.template
        call.request_id = self.request_id
        call.response_message = assistant_message(blocks)
        call.text = call.response_message["content"]
        call.usage = _usage(self.usage) if self.usage else None
        call.prompt_token_ids = self.tokens.get("prompt_token_ids")
        call.completion_token_ids = self.tokens.get("token_ids")
        call.logprobs = self.tokens.get("token_logprobs")
        call.policy_version = self.tokens.get("weight_version")
        _finish(call, self.stop_reason, self.template.started_at, error or self.failure)
        if closed_early:
            call.metadata["stream_closed_early"] = True
        return [call]
