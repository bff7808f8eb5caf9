"""Traces written elsewhere become episodes: OpenTelemetry GenAI spans (OTLP JSON) and our own JSONL exports.

An agent in production is often traced already: the OpenTelemetry SDK's OTLP JSON exporter, logfire or
OpenLLMetry write one span per model call, following the GenAI semantic conventions. `read_otlp_traces`
turns such a file into episodes:

- one episode per agent span (`gen_ai.operation.name = "invoke_agent"`, named by `gen_ai.agent.name`),
  with the agent spans under it as sub-agents; model calls outside any agent span make one episode per
  trace, named after the trace's root span;
- one `LLMCall` per model call span (`chat`, `text_completion`, `generate_content`): its messages from
  `gen_ai.input.messages` / `gen_ai.system_instructions` and its reply from `gen_ai.output.messages`
  (the current conventions), or from OpenLLMetry's indexed `gen_ai.prompt.<i>.*` / `gen_ai.completion.<i>.*`
  attributes; model, sampling settings, usage, finish reason and timing from the other `gen_ai.*`
  attributes.

Calls served by another model carry text, not the policy's token ids: an imported call has no token ids
(`LLMCall.trainable` is False) and says where it came from in `metadata["imported"]` (`"otlp"`).
Training never mixes the two kinds silently: text-only calls are re-tokenized by one stated rule when a
use needs tokens (supervised warm start), and GRPO trains only calls with the engine's own token ids.

Episode ids are derived from the trace and span ids, so importing the same file twice stores each episode
once. A file in another shape, or a model call span without messages, is a `TraceImportError` that names
the span and what is missing; nothing is written unless every span reads (`skip_invalid=True` writes the
rest and returns what was skipped).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_sdk.tracing.episode import Episode, LLMCall
from lightning_sdk.tracing.formats.otlp_messages import TraceImportError, span_messages
from lightning_sdk.tracing.store import EpisodeStore

__all__ = [
    "CALL_OPERATIONS",
    "ImportReport",
    "TraceImportError",
    "import_traces",
    "read_jsonl_episodes",
    "read_otlp_traces",
]

CALL_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
"""`gen_ai.operation.name` values of a model call span."""
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

    def where(self) -> str:
        return f"span {self.span_id} ({self.name!r}) of trace {self.trace_id}"


def read_otlp_traces(path: str | os.PathLike[str], *, skip_invalid: bool = False) -> ImportReport:
    """Read an OTLP JSON trace file (one `{"resourceSpans": [...]}` document, or one per line, as the
    OpenTelemetry file exporters write) into episodes. Raises `TraceImportError` for a file in another
    shape, and for a model call span without messages unless `skip_invalid`."""
    spans = list(_spans_of(_documents(Path(path))))
    report = ImportReport()
    by_trace: dict[str, list[_Span]] = {}
    for span in spans:
        by_trace.setdefault(span.trace_id, []).append(span)
    for trace_spans in by_trace.values():
        report.episodes += _trace_episodes(trace_spans, report, skip_invalid)
    return report


def read_jsonl_episodes(path: str | os.PathLike[str]) -> list[Episode]:
    """Episodes from a JSON Lines file written by `EpisodeStore.export_jsonl` (one `Episode.to_json()`
    per line); a line that is not one is a `TraceImportError` naming its line number."""
    episodes = []
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            try:
                episodes.append(Episode.from_json(line))
            except (ValueError, TypeError) as error:
                raise TraceImportError(f"{path}, line {number}: not an episode ({error}).") from None
    return episodes


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
        if not isinstance(document, Mapping) or not isinstance(document.get("resourceSpans"), list):
            raise TraceImportError(
                f"{path} is not an OTLP JSON trace export: each document must be an object with a "
                '"resourceSpans" list (as the OpenTelemetry OTLP/file exporters write). For our own '
                "episode exports use the JSONL import."
            )
        yield document


def _spans_of(documents: Iterable[Mapping[str, Any]]) -> Iterator[_Span]:
    for document in documents:
        for resource in document["resourceSpans"]:
            for scope in _list(resource, "scopeSpans") + _list(resource, "instrumentationLibrarySpans"):
                for raw in _list(scope, "spans"):
                    yield _span(raw)


def _list(holder: Any, key: str) -> list[Any]:
    value = holder.get(key) if isinstance(holder, Mapping) else None
    return value if isinstance(value, list) else []


def _span(raw: Any) -> _Span:
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


def _value(value: Any) -> Any:
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
def _trace_episodes(spans: list[_Span], report: ImportReport, skip_invalid: bool) -> list[Episode]:
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
        if span.operation not in CALL_OPERATIONS:
            continue
        try:
            call = _call(span)
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


def _call(span: _Span) -> LLMCall:
    attributes = span.attributes
    messages, output = span_messages(span.attributes, span.where())
    if not messages:
        raise TraceImportError(
            f"{span.where()} is a model call without messages: record content on spans "
            "(gen_ai.input.messages, or OpenLLMetry's gen_ai.prompt.<i>.*; OpenTelemetry instrumentations "
            "capture it when OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true)."
        )
    reply = output[0] if output else None
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
    return LLMCall(
        id=f"otlp-{span.trace_id}-{span.span_id}",
        request_id=attributes.get("gen_ai.response.id"),
        kind="chat",
        source="otlp",
        model=attributes.get("gen_ai.response.model") or attributes.get("gen_ai.request.model"),
        messages=messages,
        sampling=sampling,
        response_message=reply,
        text=reply.get("content") if reply is not None else None,
        finish_reason=finish,
        usage=usage or None,
        started_at=span.start_s,
        latency_s=(span.end_s - span.start_s) if span.end_s is not None else None,
        metadata={IMPORTED_KEY: "otlp", "trace_id": span.trace_id, "span_id": span.span_id},
    )


def import_traces(
    path: str | os.PathLike[str],
    store: EpisodeStore,
    *,
    format: str = "auto",
    skip_invalid: bool = False,
) -> ImportReport:
    """Read a trace file and add its episodes to `store`; returns what was read.

    Args:
        path: an OTLP JSON trace file, or a JSONL file of episodes (`EpisodeStore.export_jsonl`).
        store: where the episodes go (an episode already there, by id, is replaced: importing a file
            twice stores it once).
        format: `"otlp"`, `"jsonl"`, or `"auto"` (JSONL when the first line is an episode).
        skip_invalid: store the spans that read and report the others (default: nothing is stored
            unless every span reads).
    """
    if format not in ("auto", "otlp", "jsonl"):
        raise ValueError(f"format={format!r} must be 'auto', 'otlp' or 'jsonl'.")
    if format == "jsonl" or (format == "auto" and _looks_like_episodes(Path(path))):
        episodes = read_jsonl_episodes(path)
        report = ImportReport(episodes, sum(len(episode.all_calls()) for episode in episodes))
    else:
        report = read_otlp_traces(path, skip_invalid=skip_invalid)
    store.add_many(report.episodes)
    return report


def _looks_like_episodes(path: Path) -> bool:
    with open(path, encoding="utf-8") as file:
        first = next((line for line in file if line.strip()), "")
    try:
        data = json.loads(first)
    except json.JSONDecodeError:
        return False
    return isinstance(data, dict) and "calls" in data and "resourceSpans" not in data
