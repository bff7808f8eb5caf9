"""Traces from elsewhere become episodes: OTLP JSON written from spans the real OpenTelemetry SDK recorded
(current GenAI conventions and OpenLLMetry's attributes), our own JSONL exports, and files in other shapes."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import lightning_sdk as ls
from lightning_sdk.tracing.formats.otlp_import import TraceImportError, read_otlp_traces
from lightning_sdk.tracing.formats.trace_files import import_traces, read_jsonl_episodes

pytest.importorskip("opentelemetry.sdk.trace", reason="the dev extra installs opentelemetry-sdk")

QUESTION = [{"role": "user", "parts": [{"type": "text", "content": "What is 2 + 2?"}]}]
TOOL_CALL = [
    {
        "role": "assistant",
        "parts": [{"type": "tool_call", "id": "c1", "name": "add", "arguments": {"a": 2, "b": 2}}],
        "finish_reason": "tool_call",
    }
]


def chat_attributes(inputs: list[Any], outputs: list[Any], **extra: Any) -> dict[str, Any]:
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "gpt-4o-mini",
        "gen_ai.request.temperature": 0.2,
        "gen_ai.usage.input_tokens": 12,
        "gen_ai.usage.output_tokens": 5,
        "gen_ai.system_instructions": json.dumps([{"type": "text", "content": "Be brief."}]),
        "gen_ai.input.messages": json.dumps(inputs),
        "gen_ai.output.messages": json.dumps(outputs),
        **extra,
    }


@pytest.fixture
def tracer() -> Iterator[tuple[Any, Any]]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider.get_tracer("agent-in-production"), exporter
    provider.shutdown()


def write_otlp_json(exporter: Any, path: Path) -> Path:
    """The finished spans as an OTLP JSON file: the SDK's own protobuf encoding, with ids in hex as the
    OTLP/JSON encoding (and the collector's file exporter) writes them."""
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    document = MessageToDict(encode_spans(exporter.get_finished_spans()))
    for resource in document["resourceSpans"]:
        for scope in resource["scopeSpans"]:
            for span in scope["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    path.write_text(json.dumps(document))
    return path


def test_an_agent_trace_becomes_an_episode_with_its_calls_as_text(
    tracer: tuple[Any, Any], tmp_path: Path
) -> None:
    tracer_, exporter = tracer
    agent = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "solver"}
    with tracer_.start_as_current_span("invoke_agent solver", attributes=agent):
        with tracer_.start_as_current_span(
            "chat gpt-4o-mini", attributes=chat_attributes(QUESTION, TOOL_CALL)
        ):
            pass
        tool_result = (
            QUESTION
            + TOOL_CALL
            + [{"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": 4}]}]
        )
        answer = [{"role": "assistant", "parts": [{"type": "text", "content": "4"}], "finish_reason": "stop"}]
        with tracer_.start_as_current_span(
            "chat gpt-4o-mini", attributes=chat_attributes(tool_result, answer)
        ):
            pass
        reviewer = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "reviewer"}
        with (
            tracer_.start_as_current_span("invoke_agent reviewer", attributes=reviewer),
            tracer_.start_as_current_span("chat", attributes=chat_attributes(QUESTION, answer)),
        ):
            pass
    path = write_otlp_json(exporter, tmp_path / "traces.json")

    report = read_otlp_traces(path)
    [episode] = report.episodes
    assert episode.name == "solver" and report.calls == 3 and report.skipped == []
    [child] = episode.children
    assert child.name == "reviewer" and child.parent_id == episode.id and len(child.calls) == 1
    first, second = episode.calls
    assert first.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 2?"},
    ]
    assert first.response_message is not None
    assert first.response_message["tool_calls"][0]["function"] == {
        "name": "add",
        "arguments": '{"a": 2, "b": 2}',
    }
    assert first.finish_reason == "tool_calls"  # the conventions' "tool_call", spelled as chat's
    assert first.usage == {"prompt_tokens": 12, "completion_tokens": 5}
    assert first.sampling == {"temperature": 0.2} and first.model == "gpt-4o-mini"
    assert second.messages is not None and second.messages[-1] == {
        "role": "tool",
        "content": "4",
        "tool_call_id": "c1",
    }
    assert second.text == "4" and second.agent_name == "solver"
    # Text, not the policy's token ids, and it says so: never trained as if sampled by the policy.
    assert not any(call.trainable for call in episode.all_calls())
    assert {call.metadata["imported"] for call in episode.all_calls()} == {"otlp"}

    with ls.EpisodeStore(tmp_path / "episodes.db") as store:
        import_traces(path, store)
        ls.feedback(episode.id, 1.0, store=store, comment="late")  # a reward that came after the import
        import_traces(path, store)  # the same file again (a nightly import): stored once, feedback kept
        assert store.count() == 1
        stored = store.get(episode.id)
        assert stored is not None and stored.rewards == {"feedback": 1.0}
        assert [record["comment"] for record in stored.metadata["feedback"]] == ["late"]
        # A task for `store.tasks()`, the first user message, and where it came from.
        assert store.tasks() == ["What is 2 + 2?"] and stored.metadata["task_from"] == "first user message"
        assert stored.calls == episode.calls and stored.children == episode.children
        stored.task = {"question": "What is 2 + 2?"}  # the agent's own task, set by hand as the docs say
        store.add(stored)
        import_traces(path, store)
        assert store.tasks() == [{"question": "What is 2 + 2?"}]


def test_openllmetry_attributes_and_calls_outside_an_agent(tracer: tuple[Any, Any], tmp_path: Path) -> None:
    tracer_, exporter = tracer
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.prompt.0.role": "user",
        "gen_ai.prompt.0.content": "Hi",
        "gen_ai.completion.0.role": "assistant",
        "gen_ai.completion.0.content": "Hello!",
        "gen_ai.completion.0.finish_reason": "stop",
    }
    with (
        tracer_.start_as_current_span("POST /ask"),
        tracer_.start_as_current_span("openai.chat", attributes=attributes),
    ):
        pass
    report = read_otlp_traces(write_otlp_json(exporter, tmp_path / "traces.json"))
    [episode] = report.episodes
    assert episode.name == "POST /ask"  # no agent span: the trace's root names the episode
    [call] = episode.calls
    assert call.messages == [{"role": "user", "content": "Hi"}] and call.text == "Hello!"
    assert call.finish_reason == "stop" and call.agent_name == "POST /ask"


def test_openllmetry_before_0_55_is_read_by_its_request_type_and_keeps_the_tools(
    tracer: tuple[Any, Any], tmp_path: Path
) -> None:
    # Releases up to 0.54 write llm.request.type and the indexed attributes, and no operation name.
    tracer_, exporter = tracer
    add = {"type": "object", "properties": {"a": {"type": "integer"}}}
    attributes = {
        "llm.request.type": "chat",
        "gen_ai.request.model": "gpt-4o",
        "llm.request.functions.0.name": "add",
        "llm.request.functions.0.description": "Add.",
        "llm.request.functions.0.parameters": json.dumps(add),
        "gen_ai.prompt.0.role": "user",
        "gen_ai.prompt.0.content": "Add 2",
        "gen_ai.completion.0.role": "assistant",
        "gen_ai.completion.0.finish_reason": "tool_calls",
        "gen_ai.completion.0.tool_calls.0.id": "c1",
        "gen_ai.completion.0.tool_calls.0.name": "add",
        "gen_ai.completion.0.tool_calls.0.arguments": '{"a": 2}',
    }
    with tracer_.start_as_current_span("openai.chat", attributes=attributes):
        pass
    with tracer_.start_as_current_span("embeddings", attributes={"llm.request.type": "embedding"}):
        pass
    report = read_otlp_traces(write_otlp_json(exporter, tmp_path / "traces.json"))
    [call] = [call for episode in report.episodes for call in episode.calls]
    assert call.tools == [
        {"type": "function", "function": {"name": "add", "description": "Add.", "parameters": add}}
    ]
    assert call.response_message is not None and call.response_message["tool_calls"][0]["id"] == "c1"
    assert call.finish_reason == "tool_calls" and report.calls == 1


def test_the_tool_definitions_of_the_current_conventions_are_kept(
    tracer: tuple[Any, Any], tmp_path: Path
) -> None:
    tracer_, exporter = tracer
    tools = [{"type": "function", "name": "add", "parameters": {"type": "object"}}]
    extra = {"gen_ai.tool.definitions": json.dumps(tools)}
    with tracer_.start_as_current_span("chat", attributes=chat_attributes(QUESTION, TOOL_CALL, **extra)):
        pass
    [episode] = read_otlp_traces(write_otlp_json(exporter, tmp_path / "traces.json")).episodes
    assert episode.calls[0].tools == [
        {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    ]


def test_a_file_with_no_model_call_is_an_error_that_says_what_it_holds(
    tracer: tuple[Any, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lightning_sdk.cli import main

    tracer_, exporter = tracer
    with tracer_.start_as_current_span("GET /health"), tracer_.start_as_current_span("db.query"):
        pass
    spans_only = write_otlp_json(exporter, tmp_path / "spans.json")
    empty = tmp_path / "empty.json"
    empty.write_text('{"resourceSpans": []}')
    store = tmp_path / "episodes.db"
    assert main(["import", str(spans_only), "--store", str(store)]) == 2
    said = capsys.readouterr().err
    assert "holds 2 span(s) but no model call" in said and "'GET /health', 'db.query'" in said
    assert main(["import", str(empty), "--store", str(store)]) == 2
    assert "holds no spans (an empty export?)" in capsys.readouterr().err
    assert not store.exists()  # refused: no store file made
    assert main(["import", str(empty), "--store", str(store), "--allow-empty"]) == 0
    assert "imported 0 episode(s)" in capsys.readouterr().out
    with ls.EpisodeStore(store) as opened:
        assert opened.count() == 0


def test_a_call_without_messages_is_refused_by_name_unless_skipped(
    tracer: tuple[Any, Any], tmp_path: Path
) -> None:
    tracer_, exporter = tracer
    with tracer_.start_as_current_span("chat", attributes={"gen_ai.operation.name": "chat"}):
        pass
    with tracer_.start_as_current_span("chat", attributes=chat_attributes(QUESTION, [])):
        pass
    path = write_otlp_json(exporter, tmp_path / "traces.json")
    with ls.EpisodeStore(tmp_path / "episodes.db") as store:
        with pytest.raises(
            TraceImportError, match=r"span \w+ \('chat'\) .* is a model call without messages"
        ):
            import_traces(path, store)
        assert store.count() == 0  # nothing written
        report = import_traces(path, store, skip_invalid=True)
        assert store.count() == 1 and len(report.skipped) == 1


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"spans": []}', "is not an OTLP JSON export"),
        ("not json at all", "line 1: not JSON"),
        ('{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "x"}]}]}]}', "without traceId and spanId"),
    ],
)
def test_a_file_in_another_shape_is_a_clear_error(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "traces.json"
    path.write_text(content)
    with pytest.raises(TraceImportError, match=message):
        read_otlp_traces(path)


def test_a_part_that_is_not_text_is_refused(tracer: tuple[Any, Any], tmp_path: Path) -> None:
    tracer_, exporter = tracer
    image = [{"role": "user", "parts": [{"type": "blob", "modality": "image", "content": "..."}]}]
    with tracer_.start_as_current_span("chat", attributes=chat_attributes(image, [])):
        pass
    with pytest.raises(TraceImportError, match="a 'blob' part cannot be imported"):
        read_otlp_traces(write_otlp_json(exporter, tmp_path / "traces.json"))


def test_our_own_jsonl_exports_round_trip(tmp_path: Path) -> None:
    @ls.trace_agent(name="solver")
    def solver(task: str) -> str:
        return task

    with ls.capture() as episodes:
        solver("a")
        solver("b")
    with ls.EpisodeStore(tmp_path / "a.db") as source:
        source.add_many(episodes)
        source.export_jsonl(tmp_path / "episodes.jsonl")
    from lightning_sdk.cli import main

    assert main(["import", str(tmp_path / "episodes.jsonl"), "--store", str(tmp_path / "b.db")]) == 0
    with ls.EpisodeStore(tmp_path / "b.db") as target:
        assert target.episodes() == episodes
    (tmp_path / "bad.jsonl").write_text(episodes[0].to_json() + '\n{"name": 3, "wrong": true}\n')
    with pytest.raises(TraceImportError, match=r"bad\.jsonl, line 2: not an episode"):
        read_jsonl_episodes(tmp_path / "bad.jsonl")
