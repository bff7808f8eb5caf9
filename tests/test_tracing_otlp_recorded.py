"""Trace files written by the real GenAI instrumentations import into the calls the agent really made.

Each producer records the same agent (two chat calls: a tool call, then an answer after the tool's
result) against the local fake OpenAI server in its own process (tests/scripts/record_genai_traces.py),
with the pinned packages of the dev extra (OpenLLMetry 0.62.4, openai-v2 2.3b0) and the Makefile
(openai-v2 2.4b0 with util-genai 1.1b0, for the latest conventions; OpenLLMetry 0.54.0, the last release
of its indexed attributes). The import must give back, call by
call, the messages sent (system prompt, tool calls with ids and arguments, tool results), the reply, the
model and the usage; and the tools where the producer records them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest

from lightning_sdk.tracing.formats.otlp_messages import TraceImportError
from lightning_sdk.tracing.formats.trace_files import import_traces, read_traces
from lightning_sdk.tracing.store import EpisodeStore

ROOT = Path(__file__).resolve().parents[1]
LATEST = Path(sys.prefix) / "otel-genai-latest"  # the Makefile installs these beside the dev extra's
OPENLLMETRY_0_54 = Path(sys.prefix) / "otel-openllmetry-0.54"
CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
LATEST_OPT_IN = {"OTEL_SEMCONV_STABILITY_OPT_IN": "gen_ai_latest_experimental"}
PRODUCERS: dict[str, dict[str, str]] = {
    # What each producer's documentation tells a user to set for content to be recorded.
    "openai-v2": {CONTENT: "true"},
    "openai-v2-latest-span": {**LATEST_OPT_IN, CONTENT: "span_only"},
    "openai-v2-latest-event": {**LATEST_OPT_IN, CONTENT: "event_only"},
    "openllmetry": {"TRACELOOP_TRACE_CONTENT": "true"},
    "openllmetry-0.54": {"TRACELOOP_TRACE_CONTENT": "true"},  # the indexed gen_ai.prompt.<i>.* form
}
PACKAGES = {
    "openai-v2-latest-span": LATEST,
    "openai-v2-latest-event": LATEST,
    "openllmetry-0.54": OPENLLMETRY_0_54,
}
"""Producers whose release is installed apart (one environment holds one version of a package)."""
RECORDS_TOOLS = {"openllmetry", "openllmetry-0.54"}
"""Producers that record the tools a call offered (openai-v2 records none, in either conventions)."""


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("opentelemetry.instrumentation.openai_v2", reason="the dev extra installs it")
    pytest.importorskip("opentelemetry.instrumentation.openai", reason="the dev extra installs OpenLLMetry")
    missing = [str(path) for path in PACKAGES.values() if not path.is_dir()]
    if missing:
        pytest.skip(f"{', '.join(sorted(set(missing)))} missing: `make install` puts those releases there")
    folders = {}
    for producer, settings in PRODUCERS.items():
        folder = tmp_path_factory.mktemp(producer)
        environment = {**os.environ, **settings}
        environment["PYTHONPATH"] = str(PACKAGES.get(producer, ""))
        script = ROOT / "tests" / "scripts" / "record_genai_traces.py"
        done = subprocess.run(
            [sys.executable, str(script), producer.split("-0.")[0], str(folder)],
            env=environment,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        folders[producer] = folder
    return folders


def chat_message(message: dict[str, Any]) -> dict[str, Any]:
    """A chat message reduced to what the import promises: role, text, tool calls (id, name, parsed
    arguments), the tool call answered."""
    kept: dict[str, Any] = {"role": message["role"], "content": message.get("content") or None}
    if message.get("tool_calls"):
        kept["tool_calls"] = [
            (call["id"], call["function"]["name"], json.loads(call["function"]["arguments"]))
            for call in message["tool_calls"]
        ]
    if message.get("tool_call_id"):
        kept["tool_call_id"] = message["tool_call_id"]
    return kept


@pytest.mark.parametrize("producer", list(PRODUCERS))
def test_each_producer_imports_into_the_calls_the_agent_made(
    recorded: dict[str, Path], producer: str, tmp_path: Path
) -> None:
    folder = recorded[producer]
    sent = json.loads((folder / "sent.json").read_text())
    with EpisodeStore(tmp_path / "episodes.db") as store:
        [read] = import_traces([folder / "spans.json", folder / "logs.json"], store).episodes
        episode = store.get(read.id)
    assert episode.name == "calculator run"  # the agent's own root span
    calls = episode.all_calls()
    assert len(calls) == len(sent["requests"]) == 2
    for call, request, reply in zip(calls, sent["requests"], sent["replies"], strict=True):
        assert [chat_message(m) for m in call.messages] == [chat_message(m) for m in request["messages"]]
        assert chat_message(call.response_message) == chat_message(reply["message"])
        assert call.model == request["model"]
        assert call.usage == {
            "prompt_tokens": reply["usage"]["prompt_tokens"],
            "completion_tokens": reply["usage"]["completion_tokens"],
        }
        assert call.tools == (request["tools"] if producer in RECORDS_TOOLS else None)
        assert call.finish_reason == ("tool_calls" if reply["message"].get("tool_calls") else "stop")
    assert episode.task == "What is 2 + 3?"


def test_content_in_log_records_needs_the_logs_and_reads_from_one_file_too(
    recorded: dict[str, Path], tmp_path: Path
) -> None:
    folder = recorded["openai-v2"]
    with pytest.raises(TraceImportError, match="as log records") as refused:
        read_traces(folder / "spans.json")
    assert "Give the logs file with the trace file" in str(refused.value)
    both = tmp_path / "collector.jsonl"  # a collector's file exporter writing both kinds, one per line
    lines = [json.dumps(json.loads((folder / name).read_text())) for name in ("spans.json", "logs.json")]
    both.write_text("\n".join(lines) + "\n")
    assert read_traces(both).calls == 2


def test_logs_recorded_without_content_say_what_to_set(tmp_path: Path, recorded: dict[str, Path]) -> None:
    folder = recorded["openai-v2"]
    logs = json.loads((folder / "logs.json").read_text())
    for resource in logs["resourceLogs"]:
        for scope in resource["scopeLogs"]:
            for record in scope["logRecords"]:
                record.pop("body", None)  # what the instrumentation writes with content capture off
    stripped = tmp_path / "logs.json"
    stripped.write_text(json.dumps(logs))
    with pytest.raises(TraceImportError, match=f"recorded without their content.*{CONTENT}=true"):
        read_traces([folder / "spans.json", stripped])


@pytest.mark.slow
def test_the_walkthrough_imports_takes_late_feedback_and_warm_starts_from_it(
    recorded: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], vllm_engine: Any
) -> None:
    # docs/production.md as written, on files the official instrumentation wrote: import the spans and
    # the log records, attach a late reward, import again (a nightly import), SFT on the rewarded
    # episodes with the bundled model, then a GRPO step from that adapter (on the session's engine).
    import lightning_sdk as ls
    from lightning_sdk.cli import main

    folder, store_path = recorded["openai-v2"], tmp_path / "episodes.db"
    files = [str(folder / "spans.json"), str(folder / "logs.json")]
    assert main(["import", *files, "--store", str(store_path)]) == 0
    with EpisodeStore(store_path) as store:
        [episode] = store.episodes()
        ls.feedback(episode.id, 1.0, store=store, comment="solved it")
    assert main(["import", *files, "--store", str(store_path)]) == 0
    with EpisodeStore(store_path) as store:
        assert store.get(episode.id).reward == 1.0  # kept through the second import
    run_dir = tmp_path / "sft"
    assert main(["sft", "--store", str(store_path), "--min-reward", "1", "--run-dir", str(run_dir)]) == 0
    said = capsys.readouterr().out
    assert "adapter:" in said and (run_dir / "adapter" / "adapter_model.safetensors").is_file()

    @ls.trace_agent
    def support(task: dict[str, Any]) -> str:
        reply = openai.OpenAI().chat.completions.create(
            model="policy", messages=[{"role": "user", "content": task["question"]}], max_tokens=8
        )
        return reply.choices[0].message.content or ""

    config = ls.TrainerConfig(
        init_adapter=run_dir / "adapter",
        run_dir=str(tmp_path / "grpo"),
        group_size=2,
        batch_size=2,
        max_steps=1,
        max_tokens=8,
        eval_every=0,
        progress_bar=False,
    )
    tasks = [{"question": "What is 2 + 3?"}, {"question": "What is 4 + 4?"}]
    try:
        result = ls.Trainer(config=config, engine=vllm_engine).fit(
            support, tasks, val_dataset=tasks[:1], reward=lambda task, answer: len(answer) / 40
        )
    finally:
        vllm_engine.load_adapter(None, version=None)  # the session's engine serves the base model again
    assert result.adapter_path.is_dir() and result.best_step is not None
