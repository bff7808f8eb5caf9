"""GenAI content recorded as OpenTelemetry log records (events), joined to its model call span.

Some instrumentations keep a call's messages off the span and emit them as log records, exported beside
the spans (an `ExportLogsServiceRequest`: a collector's logs file, or the same file as the spans):

- the official `opentelemetry-instrumentation-openai-v2` in its default conventions (up to 2.3b0, or
  without the latest-conventions opt-in): one record per input message, `gen_ai.system.message`,
  `gen_ai.user.message`, `gen_ai.assistant.message` (its `tool_calls`), `gen_ai.tool.message` (`content`
  and the call's `id`), then one `gen_ai.choice` per choice (`index`, `finish_reason`, `message`);
- the latest conventions with `event_only` (or `span_and_event`) content: one
  `gen_ai.client.inference.operation.details` record whose attributes are the span's would-be
  `gen_ai.input.messages`, `gen_ai.output.messages`, `gen_ai.system_instructions`, ...

Each record carries the trace and span id of the call it belongs to, which is how it is found again. The
event name is the record's `eventName` (OTLP 1.5 and later) or its `event.name` attribute (older SDKs).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from lightning_sdk.tracing.formats.otlp_messages import TraceImportError, chat_tool_call, otlp_list

__all__ = ["DETAILS_EVENT", "MESSAGE_EVENTS", "CallEvent", "event_content", "events_by_span"]

DETAILS_EVENT = "gen_ai.client.inference.operation.details"
"""The latest conventions' one event per call, its content in attributes."""
MESSAGE_EVENTS = {
    "gen_ai.system.message": "system",
    "gen_ai.user.message": "user",
    "gen_ai.assistant.message": "assistant",
    "gen_ai.tool.message": "tool",
}
"""The default conventions' event per input message, and the message's role."""
CHOICE_EVENT = "gen_ai.choice"


@dataclass
class CallEvent:
    """One GenAI log record."""

    name: str
    body: Any
    attributes: dict[str, Any]


def events_by_span(
    documents: Iterable[Mapping[str, Any]], value: Callable[[Any], Any]
) -> dict[tuple[str, str], list[CallEvent]]:
    """The GenAI records of OTLP JSON logs documents (`{"resourceLogs": [...]}`), by (trace id, span id),
    in the order they were written; `value` unwraps an OTLP `AnyValue`. Records of no span, or of another
    kind than GenAI's, are left out."""
    found: dict[tuple[str, str], list[CallEvent]] = {}
    for document in documents:
        for resource in otlp_list(document, "resourceLogs"):
            for scope in otlp_list(resource, "scopeLogs"):
                for record in otlp_list(scope, "logRecords"):
                    if (
                        not isinstance(record, Mapping)
                        or not record.get("traceId")
                        or not record.get("spanId")
                    ):
                        continue
                    attributes = {
                        item["key"]: value(item.get("value"))
                        for item in record.get("attributes", [])
                        if isinstance(item, Mapping) and "key" in item
                    }
                    name = record.get("eventName") or attributes.pop("event.name", None)
                    if not isinstance(name, str) or not name.startswith("gen_ai."):
                        continue
                    key = (str(record["traceId"]), str(record["spanId"]))
                    found.setdefault(key, []).append(CallEvent(name, value(record.get("body")), attributes))
    return found


def event_content(
    events: list[CallEvent], where: str
) -> tuple[dict[str, Any], tuple[list[dict[str, Any]], list[dict[str, Any]]] | None]:
    """What a call's records add: attributes to read as the span's (the latest conventions' details
    record), and the chat messages and outputs of per-message records (None when there are none)."""
    attributes: dict[str, Any] = {}
    for event in events:
        if event.name == DETAILS_EVENT:
            attributes.update(event.attributes)
    per_message = [event for event in events if event.name in MESSAGE_EVENTS or event.name == CHOICE_EVENT]
    if not per_message:
        return attributes, None
    messages = [_message(event, where) for event in per_message if event.name in MESSAGE_EVENTS]
    choices = sorted(
        (
            event.body
            for event in per_message
            if event.name == CHOICE_EVENT and isinstance(event.body, Mapping)
        ),
        key=lambda body: int(body.get("index") or 0),
    )
    return attributes, (messages, [_choice(body, where) for body in choices])


def _message(event: CallEvent, where: str) -> dict[str, Any]:
    role = MESSAGE_EVENTS[event.name]
    body = event.body if isinstance(event.body, Mapping) else {}
    message: dict[str, Any] = {"role": role, "content": _content(body.get("content"), where)}
    calls = body.get("tool_calls")
    if role == "assistant" and isinstance(calls, list) and calls:
        message["tool_calls"] = [_tool_call(call, where) for call in calls]
    if role == "tool" and body.get("id") is not None:
        message["tool_call_id"] = str(body["id"])
    return message


def _choice(body: Mapping[str, Any], where: str) -> dict[str, Any]:
    inner = body.get("message")
    message = inner if isinstance(inner, Mapping) else {}
    reply: dict[str, Any] = {
        "role": str(message.get("role") or "assistant"),
        "content": _content(message.get("content"), where),
    }
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        reply["tool_calls"] = [_tool_call(call, where) for call in calls]
    if body.get("finish_reason") is not None:
        reply["finish_reason"] = str(body["finish_reason"])
    return reply


def _content(content: object, where: str) -> str | None:
    """A message's content: text, or a list of chat content parts of which only text can be imported."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind != "text":
                raise TraceImportError(
                    f"{where}: a {kind!r} content part cannot be imported (text and tool calls can); leave "
                    "such calls out with skip_invalid=True."
                )
            texts.append(str(part.get("text", "")))
        return "".join(texts)
    return json.dumps(content)


def _tool_call(call: object, where: str) -> dict[str, Any]:
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        raise TraceImportError(f"{where}: a tool call record without its function: {call!r:.200}")
    function = call["function"]
    return chat_tool_call(call.get("id"), function.get("name"), function.get("arguments"))
