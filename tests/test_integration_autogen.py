"""AutoGen integration: autogen-agentchat 0.7 with autogen-ext's OpenAIChatCompletionClient, against the
local OpenAI-compatible server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_ext.models.openai import OpenAIChatCompletionClient

import lightning_sdk as ls
from lightning_sdk.integrations.autogen import (
    CALL_ID_KEY,
    STEP_KEY,
    instrument_autogen,
    is_autogen_instrumented,
    uninstrument_autogen,
)
from lightning_sdk.tracing.capture.openai_client import uninstrument_openai
from tests.fixtures.fake_openai_wire import fake_tokenize, render_chat_prompt
from tests.fixtures.openai_server import OpenAITestServer, Reply

# The model name is unknown to AutoGen, so it needs to be told what the model can do.
MODEL_INFO = {
    "vision": False,
    "function_calling": True,
    "json_output": False,
    "family": "unknown",
    "structured_output": False,
}
TOOL_THEN_ANSWERS = (
    Reply(tool_calls=[{"name": "add", "arguments": {"a": 2, "b": 3}}]),
    Reply("The sum is 5."),
    Reply("Correct."),
)


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@pytest.fixture
async def model_client(openai_server: OpenAITestServer) -> AsyncIterator[OpenAIChatCompletionClient]:
    client = OpenAIChatCompletionClient(
        model="test-model",
        base_url=openai_server.base_url,
        api_key=openai_server.api_key,
        model_info=MODEL_INFO,
        max_retries=0,
    )
    yield client
    await client.close()


@pytest.fixture
def autogen_on() -> Iterator[None]:
    instrument_autogen()
    yield
    uninstrument_autogen()


@pytest.fixture
def capture_off() -> Iterator[None]:
    uninstrument_openai()  # also stops @trace_agent from switching it back on
    yield
    uninstrument_openai()


def writer_checker_team(model_client: Any, stream: bool = False) -> RoundRobinGroupChat:
    writer = AssistantAgent(
        "writer",
        model_client=model_client,
        tools=[add],
        reflect_on_tool_use=True,
        system_message="You write answers; use tools.",
        model_client_stream=stream,
    )
    checker = AssistantAgent("checker", model_client=model_client, system_message="You check answers.")
    # Chat messages: the task, the writer's reflected answer, the checker's verdict (tool events do not
    # count).
    return RoundRobinGroupChat([writer, checker], termination_condition=MaxMessageTermination(3))


async def run_team(team: RoundRobinGroupChat, task: str) -> ls.Episode:
    @ls.trace_agent(name="team")
    async def agent(task: str) -> str:
        result = await team.run(task=task)
        return result.messages[-1].content

    with ls.capture() as episodes:
        await agent(task)
    return episodes[0]


@pytest.mark.parametrize("stream", [False, True], ids=["create", "create_stream"])
async def test_team_calls_carry_agent_names_steps_tool_calls_and_token_ids(
    stream, model_client, openai_server, instrumented, autogen_on
):
    openai_server.queue(*TOOL_THEN_ANSWERS)
    episode = await run_team(writer_checker_team(model_client, stream=stream), "What is 2 + 3?")

    assert episode.output == "Correct."
    calls = episode.calls
    assert len(calls) == len(openai_server.requests) == 3  # one LLMCall per model call
    assert [(c.agent_name, c.metadata[STEP_KEY]) for c in calls] == [
        ("writer", "inference"),
        ("writer", "reflection"),
        ("checker", "inference"),
    ]
    (tool_call,) = calls[0].response_message["tool_calls"]
    assert tool_call["function"] == {"name": "add", "arguments": '{"a": 2, "b": 3}'}
    assert calls[0].tools[0]["function"]["name"] == "add"
    assert calls[1].messages[-1] == {"role": "tool", "tool_call_id": tool_call["id"], "content": "5"}
    assert [c.text for c in calls[1:]] == ["The sum is 5.", "Correct."]
    assert calls[2].messages[0] == {"role": "system", "content": "You check answers."}
    for call, request in zip(calls, openai_server.requests, strict=True):
        assert call.source == "openai" and call.messages == request["messages"]
        assert call.prompt_token_ids == fake_tokenize(
            render_chat_prompt(request["messages"], request.get("tools"))
        )
        assert call.completion_token_ids and call.logprobs
    trainable_writer = [c for c in episode.trainable_calls() if c.agent_name == "writer"]
    assert len(trainable_writer) == 2  # what a trainer that trains "writer", not "checker", picks


async def test_without_openai_capture_the_integration_records_each_call(
    model_client, openai_server, capture_off, autogen_on
):
    openai_server.queue(*TOOL_THEN_ANSWERS)
    episode = await run_team(writer_checker_team(model_client), "What is 2 + 3?")

    calls = episode.calls
    assert [(c.source, c.agent_name, c.metadata[STEP_KEY]) for c in calls] == [
        ("autogen", "writer", "inference"),
        ("autogen", "writer", "reflection"),
        ("autogen", "checker", "inference"),
    ]
    assert calls[0].finish_reason == "tool_calls"
    assert calls[0].response_message["tool_calls"][0]["function"]["name"] == "add"
    assert calls[0].tools[0]["function"]["name"] == "add"
    assert [c.text for c in calls[1:]] == ["The sum is 5.", "Correct."]
    for call, request in zip(calls, openai_server.requests, strict=True):
        assert call.messages == request["messages"]  # AutoGen's messages, in the OpenAI format it sent
        assert not call.trainable and call.usage["prompt_tokens"] > 0


async def test_turning_the_integration_off_stops_attribution(model_client, openai_server, instrumented):
    assert instrument_autogen() is True and instrument_autogen() is False
    assert is_autogen_instrumented()
    assert uninstrument_autogen() is True and uninstrument_autogen() is False
    assert not is_autogen_instrumented()
    openai_server.queue(*TOOL_THEN_ANSWERS)
    episode = await run_team(writer_checker_team(model_client), "What is 2 + 3?")
    # The openai capture still records every call, but under the episode's name and without AutoGen's link.
    assert [c.agent_name for c in episode.calls] == ["team", "team", "team"]
    assert all(CALL_ID_KEY not in c.metadata for c in episode.calls)


async def test_with_both_off_nothing_is_recorded(model_client, openai_server, capture_off):
    openai_server.queue(*TOOL_THEN_ANSWERS)
    episode = await run_team(writer_checker_team(model_client), "What is 2 + 3?")
    assert episode.calls == [] and len(openai_server.requests) == 3


async def test_outside_an_episode_the_agent_runs_unrecorded(
    model_client, openai_server, instrumented, autogen_on
):
    agent = AssistantAgent("solo", model_client=model_client)
    with ls.capture() as episodes:
        result = await agent.run(task="hello")
    assert result.messages[-1].content == "hello" and episodes == []


async def test_a_failed_model_call_is_recorded_once_with_its_agent(
    model_client, openai_server, instrumented, autogen_on
):
    from tests.fixtures.openai_server import ErrorReply

    openai_server.queue(ErrorReply(status=400, message="bad request", type="invalid_request_error"))
    agent = AssistantAgent("solo", model_client=model_client)

    @ls.trace_agent(name="solver")
    async def run(task: str) -> None:
        with pytest.raises(Exception, match="bad request"):
            await agent.run(task=task)

    with ls.capture() as episodes:
        await run("hello")
    (call,) = episodes[0].calls
    assert call.agent_name == "solo" and "bad request" in call.error
