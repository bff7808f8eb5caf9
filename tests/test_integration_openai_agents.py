"""OpenAI Agents SDK integration: `OpenAIChatCompletionsModel` on a custom `AsyncOpenAI(base_url=...)`,
against the local OpenAI-compatible server. The SDK's export of traces to OpenAI is switched off."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from agents import (
    Agent,
    ModelSettings,
    ModelTracing,
    OpenAIChatCompletionsModel,
    RunConfig,
    Runner,
    add_trace_processor,
    function_tool,
    set_trace_processors,
    set_tracing_disabled,
    trace,
)
from agents.tracing import TracingProcessor, get_trace_provider, set_trace_provider
from agents.tracing.processors import default_processor
from agents.tracing.provider import DefaultTraceProvider
from openai import AsyncOpenAI

import lightning_sdk as ls
from lightning_sdk.integrations import openai_agents as agents_integration
from lightning_sdk.integrations.openai_agents import (
    SPAN_ID_KEY,
    instrument_openai_agents,
    is_openai_agents_instrumented,
    uninstrument_openai_agents,
)
from lightning_sdk.tracing.capture.openai_client import uninstrument_openai
from tests.fixtures.fake_openai_wire import fake_tokenize, render_chat_prompt
from tests.fixtures.openai_server import OpenAITestServer, Reply

HANDOFF_TOOL_ANSWER = (
    Reply(tool_calls=[{"name": "transfer_to_writer", "arguments": {}}]),
    Reply(tool_calls=[{"name": "add", "arguments": {"a": 2, "b": 3}}]),
    Reply("The sum is 5."),
)


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@pytest.fixture(scope="module", autouse=True)
def no_trace_export() -> Iterator[None]:
    """No internet here: keep the SDK's exporter from sending traces to OpenAI during these tests.
    Tracing itself is on (an example run earlier in the session may have switched it off)."""
    set_trace_processors([])
    set_tracing_disabled(False)
    yield
    set_trace_processors([default_processor()])


@pytest.fixture
def agents_on() -> Iterator[None]:
    instrument_openai_agents()
    yield
    uninstrument_openai_agents()


@pytest.fixture
def capture_off() -> Iterator[None]:
    uninstrument_openai()  # also stops @trace_agent from switching it back on
    yield
    uninstrument_openai()


@pytest.fixture
async def client(openai_server: OpenAITestServer) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(
        base_url=openai_server.base_url, api_key=openai_server.api_key, max_retries=0
    ) as client:
        yield client


def triage_desk(client: AsyncOpenAI) -> Agent:
    model = OpenAIChatCompletionsModel(model="test-model", openai_client=client)
    writer = Agent(name="writer", instructions="You answer with tools.", model=model, tools=[add])
    return Agent(name="triage", instructions="You route questions.", model=model, handoffs=[writer])


async def run_episode(
    agent: Agent, task: str, streamed: bool = False, after: Any = None, run_config: RunConfig | None = None
) -> ls.Episode:
    @ls.trace_agent(name="desk")
    async def desk(task: str) -> Any:
        if streamed:
            result = Runner.run_streamed(agent, task, run_config=run_config)
            async for _ in result.stream_events():
                pass
        else:
            result = await Runner.run(agent, task, run_config=run_config)
        if after is not None:
            await after()
        return result.final_output

    with ls.capture() as episodes:
        await desk(task)
    return episodes[0]


def assert_matches_requests(calls: list[ls.LLMCall], requests: list[dict[str, Any]]) -> None:
    assert len(calls) == len(requests)  # one LLMCall per model call
    for call, request in zip(calls, requests, strict=True):
        assert call.source == "openai" and call.messages == request["messages"]
        assert call.prompt_token_ids == fake_tokenize(
            render_chat_prompt(request["messages"], request.get("tools"))
        )
        assert call.completion_token_ids


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_handoff_keeps_agent_names_with_tool_calls_and_token_ids(
    streamed, client, openai_server, instrumented, agents_on
):
    openai_server.queue(*HANDOFF_TOOL_ANSWER)

    def plain() -> Any:
        return client.chat.completions.create(model="test-model", messages=[{"role": "user", "content": "p"}])

    episode = await run_episode(triage_desk(client), "What is 2 + 3?", streamed=streamed, after=plain)

    assert episode.output == "The sum is 5."
    *agent_calls, plain_call = episode.calls
    assert [c.agent_name for c in agent_calls] == ["triage", "writer", "writer"]
    assert all(c.metadata[SPAN_ID_KEY] for c in agent_calls)
    handoff, tool_use, answer = agent_calls
    assert handoff.response_message["tool_calls"][0]["function"]["name"] == "transfer_to_writer"
    assert {t["function"]["name"] for t in handoff.tools} == {"transfer_to_writer"}
    (tool_call,) = tool_use.response_message["tool_calls"]
    assert tool_call["function"] == {"name": "add", "arguments": '{"a": 2, "b": 3}'}
    assert answer.messages[-1] == {"role": "tool", "tool_call_id": tool_call["id"], "content": "5"}
    assert answer.text == "The sum is 5."
    assert_matches_requests(episode.calls, openai_server.requests)
    # A plain openai call made after the run, in the same task, is not attributed to any agent.
    assert plain_call.agent_name == "desk" and SPAN_ID_KEY not in plain_call.metadata


async def test_agent_used_as_a_tool_names_its_own_calls(client, openai_server, instrumented, agents_on):
    model = OpenAIChatCompletionsModel(model="test-model", openai_client=client)
    checker = Agent(name="checker", instructions="You check sums.", model=model)
    manager = Agent(
        name="manager",
        instructions="You delegate checks.",
        model=model,
        tools=[checker.as_tool(tool_name="check", tool_description="Check a sum.")],
    )
    openai_server.queue(
        Reply(tool_calls=[{"name": "check", "arguments": {"input": "2 + 3 = 5"}}]),
        Reply("Correct."),
        Reply("Done."),
    )
    episode = await run_episode(manager, "Is 2 + 3 = 5?")
    assert [c.agent_name for c in episode.calls] == ["manager", "checker", "manager"]
    assert [c.text for c in episode.calls[1:]] == ["Correct.", "Done."]
    writer_calls = [c for c in episode.trainable_calls() if c.agent_name == "manager"]  # what a trainer picks
    assert len(writer_calls) == 2
    assert_matches_requests(episode.calls, openai_server.requests)


async def test_without_openai_capture_the_integration_records_each_call(
    client, openai_server, capture_off, agents_on
):
    openai_server.queue(*HANDOFF_TOOL_ANSWER)
    episode = await run_episode(triage_desk(client), "What is 2 + 3?")
    calls = episode.calls
    assert [(c.source, c.agent_name) for c in calls] == [
        ("openai_agents", "triage"),
        ("openai_agents", "writer"),
        ("openai_agents", "writer"),
    ]
    assert calls[1].response_message["tool_calls"][0]["function"] == {
        "name": "add",
        "arguments": '{"a": 2, "b": 3}',
    }
    assert calls[2].text == "The sum is 5." and calls[2].model == "test-model"
    for call, request in zip(calls, openai_server.requests, strict=True):
        assert call.messages == request["messages"]  # what the SDK sent
        assert not call.trainable and call.usage["prompt_tokens"] > 0 and call.metadata[SPAN_ID_KEY]


async def test_turning_the_integration_off_stops_attribution(client, openai_server, instrumented):
    assert instrument_openai_agents() is True and instrument_openai_agents() is False
    assert is_openai_agents_instrumented()
    assert uninstrument_openai_agents() is True and uninstrument_openai_agents() is False
    openai_server.queue(*HANDOFF_TOOL_ANSWER)
    episode = await run_episode(triage_desk(client), "What is 2 + 3?")
    # The openai capture still records every call, under the episode's name and without a span link.
    assert [c.agent_name for c in episode.calls] == ["desk", "desk", "desk"]
    assert all(SPAN_ID_KEY not in c.metadata for c in episode.calls)


async def test_instrumenting_after_replacing_the_processors_still_attributes(
    client, openai_server, instrumented, agents_on
):
    set_trace_processors([])  # drops ours too; instrumenting again puts it back
    assert instrument_openai_agents() is False
    openai_server.queue(*HANDOFF_TOOL_ANSWER)
    episode = await run_episode(triage_desk(client), "What is 2 + 3?")
    assert [c.agent_name for c in episode.calls] == ["triage", "writer", "writer"]


class SpanLog(TracingProcessor):
    """Stands where the SDK's exporter would: every trace and span it would send to OpenAI."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def on_trace_start(self, trace: Any) -> None:
        self.seen.append(trace)

    def on_trace_end(self, trace: Any) -> None:
        return

    def on_span_start(self, span: Any) -> None:
        self.seen.append(span)

    def on_span_end(self, span: Any) -> None:
        return

    def shutdown(self) -> None:
        return

    def force_flush(self) -> None:
        return


@contextmanager
def exporter_in_place() -> Iterator[SpanLog]:
    """A `SpanLog` registered with the SDK's current trace provider, as its exporter would be."""
    exporter = SpanLog()
    add_trace_processor(exporter)
    try:
        yield exporter
    finally:
        remaining = agents_integration._registered_processors() or ()
        set_trace_processors([p for p in remaining if p is not exporter])


@contextmanager
def tracing_off(how: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[RunConfig | None]:
    """The three ways users switch the SDK's tracing off; yields the RunConfig to run with."""
    if how == "set_tracing_disabled":
        set_tracing_disabled(True)
        try:
            yield None
        finally:
            set_tracing_disabled(False)
    elif how == "environment":
        # The SDK reads the variable once per provider, on first use: a fresh provider reads it.
        monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
        previous = get_trace_provider()
        set_trace_provider(DefaultTraceProvider())
        instrument_openai_agents()  # wraps the new provider and registers our processor with it
        try:
            yield None
        finally:
            set_trace_provider(previous)
    else:
        yield RunConfig(tracing_disabled=True)


@pytest.mark.parametrize("how", ["set_tracing_disabled", "environment", "run_config"])
@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_agents_are_named_with_sdk_tracing_off_and_nothing_is_exported(
    how, streamed, client, openai_server, instrumented, agents_on, monkeypatch
):
    with tracing_off(how, monkeypatch) as run_config, exporter_in_place() as exporter:
        openai_server.queue(*HANDOFF_TOOL_ANSWER)
        episode = await run_episode(
            triage_desk(client), "What is 2 + 3?", streamed=streamed, run_config=run_config
        )
    assert [c.agent_name for c in episode.calls] == ["triage", "writer", "writer"]
    assert all(c.metadata[SPAN_ID_KEY] for c in episode.calls)
    assert_matches_requests(episode.calls, openai_server.requests)
    assert exporter.seen == []  # the SDK's processors, an exporter among them, saw nothing


async def test_with_tracing_on_the_sdk_processors_still_see_every_span(
    client, openai_server, instrumented, agents_on
):
    with exporter_in_place() as exporter:
        openai_server.queue(*HANDOFF_TOOL_ANSWER)
        episode = await run_episode(triage_desk(client), "What is 2 + 3?")
    assert [c.agent_name for c in episode.calls] == ["triage", "writer", "writer"]
    kinds = [type(item.span_data).__name__ for item in exporter.seen if hasattr(item, "span_data")]
    assert kinds.count("GenerationSpanData") == 3 and kinds.count("AgentSpanData") == 2


async def test_turning_the_integration_off_restores_the_sdk_trace_provider(instrumented):
    provider = get_trace_provider()
    instrument_openai_agents()
    assert get_trace_provider() is not provider and get_trace_provider().inner is provider
    uninstrument_openai_agents()
    assert get_trace_provider() is provider


async def test_a_model_call_outside_any_agent_span_is_recorded_and_warned_once(
    client, openai_server, instrumented, agents_on
):
    model = OpenAIChatCompletionsModel(model="test-model", openai_client=client)
    openai_server.queue(Reply("one"), Reply("two"))

    @ls.trace_agent(name="direct")
    async def direct(task: str) -> None:
        with trace("no agent"):
            for _ in range(2):
                await model.get_response(
                    None, task, ModelSettings(), [], None, [], ModelTracing.ENABLED, previous_response_id=None
                )

    agents_integration._processor.warned_unattributed = False
    with ls.capture() as episodes, pytest.warns(RuntimeWarning, match="outside any agent span") as warned:
        await direct("hi")
    assert len([w for w in warned if "agent span" in str(w.message)]) == 1
    assert [c.agent_name for c in episodes[0].calls] == ["direct", "direct"]
