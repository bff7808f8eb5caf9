"""`client.responses.create` calls as `LLMCall`s, whole or streamed.

A Responses call is recorded like the equivalent chat call (`lightning_sdk.tracing.formats.responses_items`):
`messages` are the input items and `instructions` as chat messages, `tools` the function tools in chat
format, `response_message` the output as an assistant message with `tool_calls`. Token ids come from
the project's extras (`prompt_token_ids` on the response, `token_ids` / `token_logprobs` on the output
item that carries them), so credit assignment and training treat it exactly like a chat call.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from lightning_sdk.tracing.episode import LLMCall
from lightning_sdk.tracing.formats.responses_items import (
    ResponsesInputError,
    chat_tools,
    input_messages,
    output_message,
)
from lightning_sdk.tracing.jsonable import jsonable as plain

__all__ = ["ResponsesStreamAssembler", "calls_from_responses_api", "responses_request_record"]

# Request keys stored in their own LLMCall fields; the rest is `sampling`.
_NOT_SAMPLING = frozenset({"model", "input", "instructions", "tools", "stream", "stream_options"})


def responses_request_record(body: Mapping[str, Any], base_url: str | None, started_at: float) -> LLMCall:
    """The request half of a Responses record, in chat terms."""
    try:
        messages = input_messages(body.get("input"), body.get("instructions"))
    except ResponsesInputError:
        messages = None  # the server will refuse it; the record keeps the error
    try:
        tools = chat_tools(body.get("tools")) or None
    except ResponsesInputError:
        tools = plain(body.get("tools"))
    return LLMCall(
        kind="chat",
        model=body.get("model"),
        base_url=base_url,
        messages=messages,
        tools=tools,
        sampling={key: plain(value) for key, value in body.items() if key not in _NOT_SAMPLING},
        started_at=started_at,
        metadata={"api": "responses"},
    )


def _extras(obj: object) -> dict[str, Any]:
    return getattr(obj, "__pydantic_extra__", None) or {}


def _finish_reason(response: object, message: dict[str, Any]) -> str:
    if getattr(response, "status", None) == "incomplete":
        return "length"
    return "tool_calls" if message.get("tool_calls") else "stop"


def calls_from_responses_api(template: LLMCall, response: Any, error: str | None = None) -> list[LLMCall]:
    """The record of a whole Response object (non-streamed, or the last event of a stream)."""
    output = [plain(item) for item in getattr(response, "output", None) or []]
    message = output_message(output)
    carrier: dict[str, Any] = next((item for item in output if "token_ids" in item), {})
    call = template
    call.request_id = getattr(response, "id", None)
    call.response_message = message
    call.text = message["content"]
    call.finish_reason = _finish_reason(response, message)
    usage = plain(response.usage) if getattr(response, "usage", None) is not None else None
    if usage is not None:
        call.usage = {
            "prompt_tokens": usage.get("input_tokens"),
            "completion_tokens": usage.get("output_tokens"),
            "total_tokens": usage.get("total_tokens"),
        }
    call.prompt_token_ids = _extras(response).get("prompt_token_ids")
    call.policy_version = _extras(response).get("weight_version")
    call.completion_token_ids = carrier.get("token_ids")
    call.logprobs = carrier.get("token_logprobs")
    call.latency_s = time.time() - template.started_at
    call.error = error
    return [call]


class ResponsesStreamAssembler:
    """The events of a streamed Responses call a user consumed; `calls()` turns them into one record.

    The final event (`response.completed` or `response.incomplete`) carries the whole response; a stream
    closed before it gives the text deltas seen so far, without token ids."""

    def __init__(self, template: LLMCall, prompts: object = None) -> None:
        self.template = template
        self.final: Any = None
        self.texts: list[str] = []
        self.failure: str | None = None

    def add(self, event: Any) -> None:
        kind = getattr(event, "type", None)
        if kind in ("response.completed", "response.incomplete", "response.failed"):
            self.final = event.response
        elif kind == "response.output_text.delta":
            self.texts.append(event.delta)
        elif kind == "error":
            self.failure = getattr(event, "message", None) or "error event"

    def calls(self, error: str | None = None, closed_early: bool = False) -> list[LLMCall]:
        if self.final is not None:
            return calls_from_responses_api(self.template, self.final, error or self.failure)
        call = self.template
        call.text = "".join(self.texts)
        call.response_message = {"role": "assistant", "content": call.text}
        call.latency_s = time.time() - self.template.started_at
        call.error = error or self.failure
        if closed_early:
            call.metadata["stream_closed_early"] = True
        return [call]
