"""`POST /v1/responses`: OpenAI's Responses API over the same engine and chat template as chat completions.

A request is turned into the equivalent chat request (`lightning_sdk.tracing.formats.responses_items`) and
goes through the chat route's steps, so the same conversation gives the same prompt token ids through either
API. The answer is a Response object, or its standard event stream, with the token-level extras of our chat
responses: `prompt_token_ids` on the response and `token_ids` / `token_logprobs` on each output item the model
produced (a message, or function calls).

Supported: text or item-list `input` (messages, `function_call`, `function_call_output`),
`instructions`, function tools and `tool_choice`, `max_output_tokens`, `temperature`, `top_p`,
`text.format` (text, json_object, json_schema), `store` (nothing is stored), `stream`. Refused with a
400 that says what to send instead: `previous_response_id` and `conversation` (send the conversation as
input items), hosted tools, reasoning, prompt templates, other item types.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel, ConfigDict

from lightning_sdk.engine.types import Completion, CompletionDelta
from lightning_sdk.serving.chat.bodies import finish_reason, usage
from lightning_sdk.serving.chat.schemas import ChatRequest, parse_request
from lightning_sdk.serving.chat.streaming import event_stream, first_and_rest, staged_events
from lightning_sdk.serving.context import PreparedChat, ServingContext, run_engine
from lightning_sdk.serving.errors import APIError, error_body
from lightning_sdk.serving.served import ServedCall, ServedChoice, ServedObserver, StreamedCall
from lightning_sdk.serving.tools.calls import ParsedOutput
from lightning_sdk.tracing.formats.responses_items import ResponsesInputError, chat_tools, input_messages

__all__ = ["ResponsesRequest", "serve_responses", "to_chat_request"]


class ResponsesRequest(BaseModel):
    """`POST /v1/responses` (fields this server reads; others are checked in `to_chat_request`)."""

    model_config = ConfigDict(extra="allow")

    model: str
    input: str | list[Any]
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    store: bool | None = None
    text: dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = None
    conversation: Any = None
    reasoning: dict[str, Any] | None = None
    prompt: Any = None
    include: list[str] | None = None
    truncation: str | None = None
    top_logprobs: int | None = None
    metadata: dict[str, Any] | None = None


_NO_STORE = (
    "This server does not store responses, so {field} cannot be honoured: send the whole conversation as "
    "input items (the model's function_call items and your function_call_output items included). The "
    "OpenAI Agents SDK does this by default."
)
_LOGPROBS_INCLUDE = "message.output_text.logprobs"


def _refuse_unsupported(req: ResponsesRequest) -> None:
    if req.previous_response_id is not None:
        raise APIError.bad_request(
            _NO_STORE.format(field="previous_response_id"), param="previous_response_id"
        )
    if req.conversation is not None:
        raise APIError.bad_request(_NO_STORE.format(field="conversation"), param="conversation")
    if req.prompt is not None:
        raise APIError.bad_request("Prompt templates live on OpenAI's servers; send input instead.", "prompt")
    if req.reasoning is not None:
        raise APIError.bad_request("This model has no reasoning options; leave reasoning unset.", "reasoning")
    if req.truncation not in (None, "disabled"):
        raise APIError.bad_request(
            "truncation='auto' is not supported: a prompt longer than the context is refused, never cut.",
            "truncation",
        )
    unknown = [item for item in req.include or [] if item != _LOGPROBS_INCLUDE]
    if unknown:
        raise APIError.bad_request(
            f"include {unknown} is not supported; only {_LOGPROBS_INCLUDE!r}.", param="include"
        )


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """Chat's `response_format` for Responses' `text.format`."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise APIError.bad_request("text.format must be an object.", param="text.format")
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": fmt.get("name"), "schema": fmt.get("schema")}}
    return {"type": fmt.get("type")}


def _tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def to_chat_request(req: ResponsesRequest) -> ChatRequest:
    """The chat request that asks the model exactly what this Responses request asks."""
    _refuse_unsupported(req)
    try:
        messages = input_messages(req.input, req.instructions)
        tools = chat_tools(req.tools)
    except ResponsesInputError as error:
        raise APIError.bad_request(str(error), param=error.param) from None
    body: dict[str, Any] = {
        "model": req.model,
        "messages": messages,
        "tools": tools or None,
        "tool_choice": _tool_choice(req.tool_choice),
        "parallel_tool_calls": req.parallel_tool_calls,
        "max_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "response_format": _response_format(req.text),
        "logprobs": _LOGPROBS_INCLUDE in (req.include or []),
        "top_logprobs": req.top_logprobs,
    }
    request: ChatRequest = parse_request(
        ChatRequest, {key: value for key, value in body.items() if value is not None}
    )
    return request


# --- the Response object ------------------------------------------------------------------------------
class _Ids:
    """Ids of one response and its output items."""

    def __init__(self) -> None:
        self.response = f"resp_{uuid.uuid4().hex}"
        self.created_at = int(time.time())

    @staticmethod
    def item(prefix: str) -> str:
        return f"{prefix}_{uuid.uuid4().hex[:24]}"


def _message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": []}]
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def _function_call_item(item_id: str, call: dict[str, Any], status: str = "completed") -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call["id"],
        "name": call["function"]["name"],
        "arguments": call["function"]["arguments"],
        "status": status,
    }


def _output_items(parsed: ParsedOutput, completion: Completion | None) -> list[dict[str, Any]]:
    """The answer's items; the first carries the completion's token ids (the extras of this server)."""
    items: list[dict[str, Any]] = []
    if parsed.content or not parsed.tool_calls:
        items.append(_message_item(_Ids.item("msg"), parsed.content or ""))
    items += [_function_call_item(_Ids.item("fc"), call) for call in parsed.tool_calls]
    if completion is not None:
        items[0].update(token_ids=completion.token_ids, token_logprobs=completion.logprobs)
    return items


def _response(
    ids: _Ids,
    req: ResponsesRequest,
    ctx: ServingContext,
    output: list[dict[str, Any]],
    *,
    status: str,
    prompt_token_ids: list[int],
    output_tokens: int,
    weight_version: Any,
) -> dict[str, Any]:
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        "id": ids.response,
        "object": "response",
        "created_at": ids.created_at,
        "status": status,
        "error": None,
        "incomplete_details": incomplete,
        "model": ctx.served,
        "instructions": req.instructions,
        "output": output,
        "parallel_tool_calls": req.parallel_tool_calls if req.parallel_tool_calls is not None else True,
        "tool_choice": req.tool_choice or "auto",
        "tools": req.tools or [],
        "temperature": req.temperature,
        "top_p": req.top_p,
        "max_output_tokens": req.max_output_tokens,
        "previous_response_id": None,
        "store": False,
        "text": req.text or {"format": {"type": "text"}},
        "truncation": "disabled",
        "metadata": req.metadata or {},
        "usage": {
            "input_tokens": len(prompt_token_ids),
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": len(prompt_token_ids) + output_tokens,
        },
        "prompt_token_ids": prompt_token_ids,
        "weight_version": weight_version,
    }


def _status(finish_reason: str | None) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


# --- the route ----------------------------------------------------------------------------------------
async def serve_responses(ctx: ServingContext, body: Any, observe: ServedObserver | None = None) -> Any:
    """`POST /v1/responses`: a Response object, or its event stream; `observe` is handed what was served
    (one choice, in chat terms: the message text and the function calls)."""
    req: ResponsesRequest = ctx.parse(body, ResponsesRequest)
    chat = to_chat_request(req)
    prepared = ctx.prepare_chat(chat)
    if prepared.params.n != 1:
        raise APIError.bad_request("n is not part of the Responses API; leave it unset.", param="n")
    ids = _Ids()
    if req.stream:
        _, deltas = await run_engine(first_and_rest(ctx.engine.astream(prepared.prompt, prepared.params)))
        served = StreamedCall(ids.response, observe) if observe is not None else None
        return event_stream(_events(deltas, ids, req, ctx, prepared, served), served)
    result = await run_engine(ctx.engine.agenerate(prepared.prompt, prepared.params))
    completion = result.completions[0]
    parsed = prepared.parse(completion.text)
    response = _response(
        ids,
        req,
        ctx,
        _output_items(parsed, completion),
        status=_status(completion.finish_reason),
        prompt_token_ids=result.prompt_token_ids,
        output_tokens=len(completion.token_ids),
        weight_version=result.weight_version,
    )
    if observe is not None:
        choice = ServedChoice(
            0,
            result.prompt_token_ids,
            parsed.content,
            parsed.tool_calls,
            completion.token_ids,
            completion.logprobs,
            finish_reason(completion.finish_reason, bool(parsed.tool_calls)),
        )
        observe(
            ServedCall(ids.response, [choice], usage(len(result.prompt_token_ids), len(completion.token_ids)))
        )
    return response


# --- streaming ------------------------------------------------------------------------------------------
class _EventWriter:
    """Numbers the events of one stream and renders them as server-sent events."""

    def __init__(self) -> None:
        self.sequence = 0

    def __call__(self, kind: str, **fields: Any) -> str:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


async def _events(
    deltas: AsyncIterator[CompletionDelta],
    ids: _Ids,
    req: ResponsesRequest,
    ctx: ServingContext,
    prepared: PreparedChat,
    served: StreamedCall | None = None,
) -> AsyncIterator[str]:
    """The standard event sequence: created, in_progress, the text message streamed delta by delta
    (when the model answers in text), function calls whole at the end, then completed. `served`, when
    given, is told what the events send."""
    async for event in staged_events(deltas, _EventStream(ids, req, ctx, prepared, served)):
        yield event


class _EventStream:
    """The state of one streamed response, and the events each stage of it sends (see `_events`)."""

    def __init__(
        self,
        ids: _Ids,
        req: ResponsesRequest,
        ctx: ServingContext,
        prepared: PreparedChat,
        served: StreamedCall | None,
    ) -> None:
        self.ids, self.req, self.ctx, self.prepared, self.served = ids, req, ctx, prepared, served
        self.emit = _EventWriter()
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.text_filter = prepared.text_filter()
        self.message_id = _Ids.item("msg")
        self.streamed = ""
        self.finish: str | None = None

    def snapshot(self, output: list[dict[str, Any]], status: str) -> dict[str, Any]:
        return _response(
            self.ids,
            self.req,
            self.ctx,
            output,
            status=status,
            prompt_token_ids=self.prepared.prompt,
            output_tokens=len(self.token_ids),
            weight_version=self.ctx.answering_version(self.prepared.params),
        )

    def opening(self) -> list[str]:
        return [
            self.emit("response.created", response=self.snapshot([], "in_progress")),
            self.emit("response.in_progress", response=self.snapshot([], "in_progress")),
        ]

    def on_delta(self, delta: CompletionDelta) -> list[str]:
        """Record a delta; the text it adds to the message, as events (the message opens at its first)."""
        self.token_ids += delta.token_ids
        self.logprobs += delta.logprobs
        self.finish = delta.finish_reason or self.finish
        piece = self.text_filter.feed(delta.text) if self.prepared.tools else delta.text
        if self.served is not None:
            self.served.add(
                0, self.prepared.prompt, text=piece, token_ids=delta.token_ids, logprobs=delta.logprobs
            )
        return self._text(piece) if piece else []

    def failed(self, error: Exception) -> str:
        if self.served is not None:
            self.served.error = str(error)
        return self.emit("error", **error_body(str(error), "server_error", code="engine_error")["error"])

    def closing(self) -> list[str]:
        """The rest of the text, the function calls, and the final response."""
        prepared = self.prepared
        rest, parsed = self.text_filter.finish() if prepared.tools else ("", ParsedOutput(self.streamed, []))
        if self.served is not None:
            finish = finish_reason(self.finish, bool(parsed.tool_calls))
            self.served.add(0, prepared.prompt, text=rest, tool_calls=parsed.tool_calls, finish_reason=finish)
            self.served.usage = usage(len(prepared.prompt), len(self.token_ids))
        events: list[str] = []
        output: list[dict[str, Any]] = []
        if self.streamed or rest or not parsed.tool_calls:
            events += self._text(rest) if rest else ([] if self.streamed else self._opened())
            events += _message_closed(self.emit, self.message_id, self.streamed)
            output.append(_message_item(self.message_id, self.streamed))
        for call in parsed.tool_calls:
            events += self._function_call(call, output)
        output[0].update(token_ids=self.token_ids, token_logprobs=self.logprobs)
        status = _status(self.finish)
        events.append(self.emit(f"response.{status}", response=self.snapshot(output, status)))
        return events

    def _opened(self) -> list[str]:
        return _message_opened(self.emit, self.message_id)

    def _text(self, piece: str) -> list[str]:
        events = [] if self.streamed else self._opened()
        self.streamed += piece
        delta = {"item_id": self.message_id, "output_index": 0, "content_index": 0, "delta": piece}
        return [*events, self.emit("response.output_text.delta", **delta, logprobs=[])]

    def _function_call(self, call: Any, output: list[dict[str, Any]]) -> list[str]:
        item = _function_call_item(_Ids.item("fc"), call)
        index = len(output)
        output.append(item)
        arguments, name = item["arguments"], item["name"]
        return [
            self.emit(
                "response.output_item.added", output_index=index, item={**item, "status": "in_progress"}
            ),
            self.emit(
                "response.function_call_arguments.delta",
                item_id=item["id"],
                output_index=index,
                delta=arguments,
            ),
            self.emit(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                arguments=arguments,
                name=name,
            ),
            self.emit("response.output_item.done", output_index=index, item=item),
        ]


def _message_opened(emit: _EventWriter, message_id: str) -> list[str]:
    item = {"type": "message", "id": message_id, "status": "in_progress", "role": "assistant", "content": []}
    part = {"type": "output_text", "text": "", "annotations": []}
    return [
        emit("response.output_item.added", output_index=0, item=item),
        emit("response.content_part.added", item_id=message_id, output_index=0, content_index=0, part=part),
    ]


def _message_closed(emit: _EventWriter, message_id: str, text: str) -> list[str]:
    part = {"type": "output_text", "text": text, "annotations": []}
    return [
        emit(
            "response.output_text.done",
            item_id=message_id,
            output_index=0,
            content_index=0,
            text=text,
            logprobs=[],
        ),
        emit("response.content_part.done", item_id=message_id, output_index=0, content_index=0, part=part),
        emit("response.output_item.done", output_index=0, item=_message_item(message_id, text)),
    ]
