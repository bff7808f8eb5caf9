"""OpenTelemetry GenAI traces (OTLP JSON spans, and log records holding their content) become episodes.

An agent in production is often traced already: the OpenTelemetry SDK's OTLP JSON exporter, logfire or
OpenLLMetry write one span per model call, following the GenAI semantic conventions. `read_otlp_traces`
turns such a file into episodes:

- one episode per agent span (`gen_ai.operation.name = "invoke_agent"`, named by `gen_ai.agent.name`),
  with the agent spans under it as sub-agents; model calls outside any agent span make one episode per
  trace, named after the trace's root span;
- one `LLMCall` per model call span (`chat`, `text_completion`, `generate_content`; OpenLLMetry before
  0.55: `llm.request.type` `chat` or `completion`): its messages from `gen_ai.input.messages` /
  `gen_ai.system_instructions` and its reply from `gen_ai.output.messages` (the current conventions), or
  from OpenLLMetry's indexed `gen_ai.prompt.<i>.*` / `gen_ai.completion.<i>.*` attributes; its tools
  (`otlp_messages.span_tools`); model, sampling settings, usage, finish reason (in chat's spelling) and
  timing from the other `gen_ai.*` attributes.

Calls served by another model carry text, not the policy's token ids: an imported call has no token ids
(`LLMCall.trainable` is False) and says where it came from in `metadata["imported"]` (`"otlp"`).
Training never mixes the two kinds silently: text-only calls are re-tokenized by one stated rule when a
use needs tokens (supervised warm start), and GRPO trains only calls with the engine's own token ids.

Episode ids are derived from the trace and span ids, so importing the same file twice stores each episode
once (`trace_files.store_traces` keeps what was attached to it since). A file in another shape, or a model
call span without messages, is a `TraceImportError` that names the span and what is missing; nothing is
written unless every span reads (`skip_invalid=True` keeps the rest and reports what was skipped).
`trace_files` holds the import itself: JSONL exports, the checks of an empty import, the store.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_sdk.tracing.episode import Episode, LLMCall
from lightning_sdk.tracing.formats.otlp_events import CallEvent, event_content, events_by_span
from lightning_sdk.tracing.formats.otlp_messages import TraceImportError, otlp_list, span_messages, span_tools

__all__ = [
    "CALL_OPERATIONS",
    "CHAT_FINISH_REASONS",
    "CONTENT_HINT",
    "LEGACY_CALL_TYPES",
    "ImportReport",
    "TraceImportError",
    "TracePaths",
    "read_otlp_traces",
    "trace_paths",
]

TracePaths = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
"""One file, or several (spans and log records may be exported to separate files)."""
CALL_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
"""`gen_ai.operation.name` values of a model call span."""
CONTENT_HINT = (
    "Import needs the calls' content, on the spans or as log records beside them: OpenLLMetry records it "
    "on spans (TRACELOOP_TRACE_CONTENT, on by default); the official opentelemetry-instrumentation-openai-v2 "
    "with OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true (default conventions) writes it as log "
    "records, and with OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental and "
    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=span_only, span_and_event or event_only on the span "
    "or as log records. Give the logs file with the trace file (several files, or one file holding both)."
)
"""What an import without content says to do."""
CHAT_FINISH_REASONS = {"tool_call": "tool_calls"}
"""The semantic conventions' finish reasons spelled as chat's where they differ (an episode's calls say
`tool_calls`, whatever wrote the trace)."""
LEGACY_CALL_TYPES = frozenset({"chat", "completion"})
"""OpenLLMetry's `llm.request.type` of a model call span, for releases that write no operation name."""
AGENT_OPERATION = "invoke_agent"
IMPORTED_KEY = "imported"


@dataclass
class ImportReport:
    """What reading a trace file found."""

    episodes: list[Episode] = field(default_factory=list)
    """The episodes read, top-level ones only (sub-agents inside them)."""
    calls: int = 0
    """Model calls read."""
    skipped: list[str] = field(default_factory=list)
    """Problems of the spans left out (`skip_invalid=True`), one line each."""
    spans: int = 0
    """Spans in the file, of any kind."""
    span_names: list[str] = field(default_factory=list)
    """The distinct names of its spans that were not model calls (for the error when none was)."""


@dataclass
class _Span:
    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    start_s: float
    end_s: float | None
    attributes: dict[str, Any]

    @property
    def operation(self) -> str | None:
        value = self.attributes.get("gen_ai.operation.name")
        return value if isinstance(value, str) else None

    @property
    def is_model_call(self) -> bool:
        """A model call, by what each producer writes: `gen_ai.operation.name` (the semantic conventions,
        OpenLLMetry from 0.55), or OpenLLMetry's `llm.request.type` (`chat`, `completion`; releases up to
        0.54 write no operation name)."""
        if self.operation is not None:
            return self.operation in CALL_OPERATIONS
        return self.attributes.get("llm.request.type") in LEGACY_CALL_TYPES

    def where(self) -> str:
        return f"span {self.span_id} ({self.name!r}) of trace {self.trace_id}"


def read_otlp_traces(paths: TracePaths, *, skip_invalid: bool = False) -> ImportReport:
    """Read OTLP JSON files (each one `{"resourceSpans": [...]}` or `{"resourceLogs": [...]}` document, or
    one per line, as the OpenTelemetry file exporters write; spans and logs in one file or in several)
    into episodes; a call's content recorded as log records is joined to its span (`otlp_events`).
    Raises `TraceImportError` for a file in another shape, and for a model call span without messages
    unless `skip_invalid`."""
    documents = [document for path in trace_paths(paths) for document in _documents(path)]
    spans = list(_spans_of(document for document in documents if "resourceSpans" in document))
    events = events_by_span((document for document in documents if "resourceLogs" in document), _value)
    report = ImportReport(spans=len(spans))
    report.span_names = sorted({span.name for span in spans if not span.is_model_call})
    by_trace: dict[str, list[_Span]] = {}
    for span in spans:
        by_trace.setdefault(span.trace_id, []).append(span)
    for trace_spans in by_trace.values():
        report.episodes += _trace_episodes(trace_spans, events, report, skip_invalid)
    return report


def trace_paths(paths: TracePaths) -> list[Path]:
    """One path or several, as a list (refused when empty)."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not items:
        raise ValueError("no trace file given")
    return [Path(item) for item in items]


# --- reading the file ---------------------------------------------------------------------------------
def _documents(path: Path) -> Iterator[Mapping[str, Any]]:
    text = path.read_text(encoding="utf-8")
    try:
        documents: list[Any] = [json.loads(text)]
    except json.JSONDecodeError:
        documents = []
        for number, line in enumerate(text.split("\n"), start=1):
            if line.strip():
                try:
                    documents.append(json.loads(line))
                except json.JSONDecodeError as error:
                    raise TraceImportError(f"{path}, line {number}: not JSON ({error.msg}).") from None
    for document in documents:
        kinds = [key for key in ("resourceSpans", "resourceLogs") if isinstance(document, Mapping)]
        if not any(isinstance(document.get(key), list) for key in kinds):
            raise TraceImportError(
                f"{path} is not an OTLP JSON export: each document must be an object with a "
                '"resourceSpans" (traces) or "resourceLogs" (log records) list, as the OpenTelemetry '
                "OTLP/file exporters write. For our own episode exports use the JSONL import."
            )
        yield document


def _spans_of(documents: Iterable[Mapping[str, Any]]) -> Iterator[_Span]:
    for document in documents:
        for resource in document["resourceSpans"]:
            scopes = otlp_list(resource, "scopeSpans") + otlp_list(resource, "instrumentationLibrarySpans")
            for scope in scopes:
                for raw in otlp_list(scope, "spans"):
                    yield _span(raw)


def _span(raw: object) -> _Span:
    if not isinstance(raw, Mapping) or not raw.get("traceId") or not raw.get("spanId"):
        raise TraceImportError(f"a span without traceId and spanId: {str(raw)[:200]}")
    end = raw.get("endTimeUnixNano")
    return _Span(
        trace_id=str(raw["traceId"]),
        span_id=str(raw["spanId"]),
        parent_id=str(raw["parentSpanId"]) if raw.get("parentSpanId") else None,
        name=str(raw.get("name", "")),
        start_s=int(raw.get("startTimeUnixNano", 0)) / 1e9,
        end_s=int(end) / 1e9 if end else None,
        attributes={item["key"]: _value(item.get("value")) for item in raw.get("attributes", [])},
    )


def _value(value: object) -> Any:
    """An OTLP `AnyValue` as plain data (`{"stringValue": "x"}` -> `"x"`, arrays and maps unwrapped)."""
    if not isinstance(value, Mapping):
        return None
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        return int(value["intValue"])  # a string in OTLP JSON: 64-bit integers do not fit a JSON number
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "arrayValue" in value:
        return [_value(item) for item in value["arrayValue"].get("values", [])]
    if "kvlistValue" in value:
        return {item["key"]: _value(item.get("value")) for item in value["kvlistValue"].get("values", [])}
    return None


# --- spans to episodes --------------------------------------------------------------------------------
def _trace_episodes(
    spans: list[_Span],
    events: Mapping[tuple[str, str], list[CallEvent]],
    report: ImportReport,
    skip_invalid: bool,
) -> list[Episode]:
    by_id = {span.span_id: span for span in spans}
    episodes: dict[str, Episode] = {}
    for span in sorted(spans, key=lambda span: span.start_s):
        if span.operation == AGENT_OPERATION:
            episodes[span.span_id] = _agent_episode(span)
    for span_id, episode in episodes.items():
        owner = _owner(by_id[span_id].parent_id, by_id, episodes)
        if owner is not None:
            episode.parent_id = owner.id
            owner.children.append(episode)
    top = [episode for episode in episodes.values() if episode.parent_id is None]
    loose: Episode | None = None
    for span in sorted(spans, key=lambda span: span.start_s):
        if not span.is_model_call:
            continue
        try:
            call = _call(span, events.get((span.trace_id, span.span_id), []))
        except TraceImportError as problem:
            if not skip_invalid:
                raise
            report.skipped.append(str(problem))
            continue
        owner = _owner(span.parent_id, by_id, episodes)
        if owner is None:
            if loose is None:
                loose = _trace_episode(spans)
                top.append(loose)
            owner = loose
        call.agent_name = owner.name
        owner.calls.append(call)
        report.calls += 1
    return top


def _owner(parent_id: str | None, by_id: dict[str, _Span], episodes: dict[str, Episode]) -> Episode | None:
    """The episode of the nearest agent span above a span, or None."""
    seen = set()
    while parent_id is not None and parent_id not in seen:
        seen.add(parent_id)
        if parent_id in episodes:
            return episodes[parent_id]
        parent = by_id.get(parent_id)
        parent_id = parent.parent_id if parent is not None else None
    return None


def _agent_episode(span: _Span) -> Episode:
    name = span.attributes.get("gen_ai.agent.name") or span.name or "agent"
    return Episode(
        id=f"otlp-{span.trace_id}-{span.span_id}",
        name=str(name),
        started_at=span.start_s,
        ended_at=span.end_s,
        metadata={IMPORTED_KEY: "otlp", "trace_id": span.trace_id, "span_id": span.span_id},
    )


def _trace_episode(spans: list[_Span]) -> Episode:
    roots = [span for span in spans if span.parent_id is None] or spans
    root = min(roots, key=lambda span: span.start_s)
    episode = _agent_episode(root)
    episode.name = root.name or "trace"
    return episode


def _call(span: _Span, events: list[CallEvent]) -> LLMCall:
    extra, from_events = event_content(events, span.where())
    attributes = {**span.attributes, **extra}
    if from_events is not None and "gen_ai.input.messages" not in attributes:
        messages, output = from_events
    else:
        messages, output = span_messages(attributes, span.where())
    if not messages:
        raise TraceImportError(f"{span.where()} is a model call without messages. {CONTENT_HINT}")
    if not any(message.get("content") or message.get("tool_calls") for message in messages):
        raise TraceImportError(
            f"{span.where()}: its messages were recorded without their content. {CONTENT_HINT}"
        )
    reply = output[0] if output else None
    tools = span_tools(attributes, span.where())
    usage = {
        key: attributes[name]
        for key, name in (
            ("prompt_tokens", "gen_ai.usage.input_tokens"),
            ("completion_tokens", "gen_ai.usage.output_tokens"),
        )
        if isinstance(attributes.get(name), int)
    }
    sampling = {
        key: attributes[f"gen_ai.request.{key}"]
        for key in ("temperature", "top_p", "max_tokens", "seed", "presence_penalty", "frequency_penalty")
        if attributes.get(f"gen_ai.request.{key}") is not None
    }
    finish = reply.pop("finish_reason", None) if reply is not None else None
    if finish is None and isinstance(attributes.get("gen_ai.response.finish_reasons"), list):
        finish = next(iter(attributes["gen_ai.response.finish_reasons"]), None)
    finish = CHAT_FINISH_REASONS.get(finish, finish) if isinstance(finish, str) else finish
    return LLMCall(
        id=f"otlp-{span.trace_id}-{span.span_id}",
        request_id=attributes.get("gen_ai.response.id"),
        kind="chat",
        source="otlp",
        model=attributes.get("gen_ai.response.model") or attributes.get("gen_ai.request.model"),
        messages=messages,
        tools=tools or None,
        sampling=sampling,
        response_message=reply,
        text=reply.get("content") if reply is not None else None,
        finish_reason=finish,
        usage=usage or None,
        started_at=span.start_s,
        latency_s=(span.end_s - span.start_s) if span.end_s is not None else None,
        metadata={IMPORTED_KEY: "otlp", "trace_id": span.trace_id, "span_id": span.span_id},
    )
