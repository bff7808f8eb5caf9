"""Record an agent's two chat calls with a real OpenTelemetry GenAI instrumentation, as OTLP JSON files.

Run by tests/test_tracing_otlp_recorded.py, one fresh process per producer: instrumentations read their
environment once and patch the openai client for the whole process.

    python tests/scripts/record_genai_traces.py <producer> <out_dir>

Producers (the test sets each one's environment, as its documentation tells a user to):

- `openai-v2`: opentelemetry-instrumentation-openai-v2 in its default conventions, content captured: the
  messages are log records (`gen_ai.<role>.message`, `gen_ai.choice`), the span has none;
- `openai-v2-latest-span` / `openai-v2-latest-event`: the same package in the latest experimental
  conventions, content on the span (`span_only`) or in one `gen_ai.client.inference.operation.details`
  log record (`event_only`);
- `openllmetry`: Traceloop's opentelemetry-instrumentation-openai (OpenLLMetry): the release installed,
  or the one first on PYTHONPATH (the test records 0.62.4 and 0.54.0, the last of the indexed form).

The agent asks the local fake OpenAI server (tests/fixtures/openai_server.py) to add two numbers with a
tool: one call answered by a tool call, one after the tool's result answered with text. Writes
`spans.json` and `logs.json` (OTLP JSON, ids in hex as the collector's file exporter writes them) and
`sent.json`: the requests the server received and each reply's message as the client parsed it.
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.fixtures.openai_server import OpenAITestServer, Reply

SYSTEM = "You add numbers with the add tool."
QUESTION = "What is 2 + 3?"
ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


def instrument(producer: str, tracer_provider: Any, logger_provider: Any) -> Any:
    if producer.startswith("openai-v2"):
        from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

        instrumentor = OpenAIInstrumentor()
        instrumentor.instrument(tracer_provider=tracer_provider, logger_provider=logger_provider)
        return instrumentor
    if producer == "openllmetry":
        from opentelemetry.instrumentation.openai import OpenAIInstrumentor as TraceloopInstrumentor

        traceloop = TraceloopInstrumentor()
        traceloop.instrument(tracer_provider=tracer_provider, logger_provider=logger_provider)
        return traceloop
    raise SystemExit(f"unknown producer {producer!r}")


def run_agent(base_url: str, api_key: str) -> list[dict[str, Any]]:
    """The agent's two calls; returns each reply's message and usage as the client parsed them."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key=api_key)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
    ]
    replies = []
    first = client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=[ADD_TOOL])
    call = first.choices[0].message
    replies.append({"message": call.model_dump(exclude_none=True), "usage": first.usage.model_dump()})
    messages.append(call.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.tool_calls[0].id, "content": "5"})
    second = client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=[ADD_TOOL])
    message = second.choices[0].message.model_dump(exclude_none=True)
    replies.append({"message": message, "usage": second.usage.model_dump()})
    return replies


def hex_ids(records: list[dict[str, Any]], keys: tuple[str, ...]) -> None:
    for record in records:
        for key in keys:
            if record.get(key):
                record[key] = base64.b64decode(record[key]).hex()


def main() -> None:
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    producer, out = sys.argv[1], Path(sys.argv[2])
    spans, logs = InMemorySpanExporter(), InMemoryLogRecordExporter()
    tracer_provider, logger_provider = TracerProvider(), LoggerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
    instrumentor = instrument(producer, tracer_provider, logger_provider)

    server = OpenAITestServer()
    server.start()
    try:
        server.queue(
            Reply(tool_calls=[{"name": "add", "arguments": {"a": 2, "b": 3}, "id": "call_add_1"}]),
            Reply("2 + 3 = 5"),
        )
        with tracer_provider.get_tracer("calculator-agent").start_as_current_span("calculator run"):
            replies = run_agent(server.base_url, server.api_key)
        received = list(server.requests)
    finally:
        server.stop()
        instrumentor.uninstrument()

    span_document = MessageToDict(encode_spans(spans.get_finished_spans()))
    for resource in span_document.get("resourceSpans", []):
        for scope in resource["scopeSpans"]:
            hex_ids(scope["spans"], ("traceId", "spanId", "parentSpanId"))
    log_document = MessageToDict(encode_logs(logs.get_finished_logs()))
    for resource in log_document.get("resourceLogs", []):
        for scope in resource["scopeLogs"]:
            hex_ids(scope["logRecords"], ("traceId", "spanId"))
    out.mkdir(parents=True, exist_ok=True)
    # A file exporter that received nothing leaves its file empty.
    (out / "spans.json").write_text(json.dumps(span_document) if span_document else "")
    (out / "logs.json").write_text(json.dumps(log_document) if log_document else "")
    (out / "sent.json").write_text(json.dumps({"requests": received, "replies": replies}, indent=1))


if __name__ == "__main__":
    main()
