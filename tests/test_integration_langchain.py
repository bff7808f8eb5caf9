"""LangChain / LangGraph integration, against the real packages and the local OpenAI-compatible server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any, TypedDict

import httpx
import pytest
from langchain.agents import create_agent
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableParallel
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI, OpenAI
from langgraph.graph import END, START, StateGraph
from pydantic import BaseModel

import lightning_sdk as ls
from lightning_sdk.integrations.langchain import (
    RUN_ID_KEY,
    LightningCallbackHandler,
    agent_name_of,
    instrument_langchain,
    is_langchain_instrumented,
    uninstrument_langchain,
)
from lightning_sdk.tracing.capture.openai_client import uninstrument_openai
from tests.fixtures.fake_openai_wire import fake_tokenize, render_chat_prompt, tool_call_text
from tests.fixtures.openai_server import OpenAITestServer, Reply


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class Answer(BaseModel):
    value: int


@pytest.fixture
async def llm(openai_server: OpenAITestServer) -> AsyncIterator[ChatOpenAI]:
    # Its own async HTTP client: langchain-openai's shared default one would outlive this test's event loop.
    async with httpx.AsyncClient() as http_async_client:
        yield ChatOpenAI(
            model="test-model",
            base_url=openai_server.base_url,
            api_key=openai_server.api_key,
            max_retries=0,
            http_async_client=http_async_client,
        )


@pytest.fixture
def global_langchain() -> Iterator[None]:
    instrument_langchain()
    yield
    uninstrument_langchain()


@pytest.fixture
def capture_off() -> Iterator[None]:
    uninstrument_openai()  # also stops @trace_agent from switching it back on
    yield
    uninstrument_openai()


def run_episode(fn: Any, *args: Any) -> ls.Episode:
    """Run `fn` as a traced agent named "solver" and return its episode."""
    with ls.capture() as episodes:
        ls.trace_agent(name="solver")(fn)(*args)
    assert len(episodes) == 1
    return episodes[0]


def assert_matches_server(calls: list[ls.LLMCall], server: OpenAITestServer) -> None:
    """One recorded call per request the server saw, with what was sent and the engine's token ids."""
    assert len(calls) == len(server.requests)
    for call, request in zip(calls, server.requests, strict=True):
        assert call.source == "openai" and call.trainable
        assert call.messages == request["messages"]
        assert call.prompt_token_ids == fake_tokenize(
            render_chat_prompt(request["messages"], request.get("tools"))
        )
        message = call.response_message or {}
        tool_texts = "".join(
            tool_call_text({"name": tc["function"]["name"], "arguments": tc["function"]["arguments"]})
            for tc in message.get("tool_calls") or []
        )
        assert call.completion_token_ids == fake_tokenize((call.text or "") + tool_texts)


@pytest.mark.parametrize("mode", ["invoke", "stream", "ainvoke", "astream"])
async def test_lcel_chain_is_one_named_call_with_token_ids(mode, llm, openai_server, instrumented):
    chain = ChatPromptTemplate.from_messages([("system", "Be brief."), ("user", "{q}")]) | llm
    config = {"callbacks": [LightningCallbackHandler()], "tags": ["agent:writer"]}

    async def agent(question: str) -> str:
        if mode == "invoke":
            return chain.invoke({"q": question}, config=config).content
        if mode == "stream":
            return "".join(chunk.content for chunk in chain.stream({"q": question}, config=config))
        if mode == "ainvoke":
            return (await chain.ainvoke({"q": question}, config=config)).content
        return "".join([chunk.content async for chunk in chain.astream({"q": question}, config=config)])

    with ls.capture() as episodes:
        assert await ls.trace_agent(name="solver")(agent)("hello there") == "hello there"
    (call,) = episodes[0].calls
    assert call.agent_name == "writer"
    assert call.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello there"},
    ]
    assert call.text == "hello there" and call.metadata[RUN_ID_KEY]
    assert_matches_server([call], openai_server)


def test_tool_calling_agent_records_each_step_with_its_tool_calls(llm, openai_server, instrumented):
    calculator = create_agent(llm, tools=[add], system_prompt="Use the tools.", name="calculator")
    openai_server.queue(Reply(tool_calls=[{"name": "add", "arguments": {"a": 2, "b": 3}}]), Reply("It is 5."))

    def agent(question: str) -> str:
        result = calculator.invoke(
            {"messages": [{"role": "user", "content": question}]},
            config={"callbacks": [LightningCallbackHandler()]},
        )
        return result["messages"][-1].content

    episode = run_episode(agent, "What is 2 + 3?")
    first, second = episode.calls
    assert [first.agent_name, second.agent_name] == ["calculator", "calculator"]  # create_agent(name=...)
    (tool_call,) = first.response_message["tool_calls"]
    assert tool_call["function"]["name"] == "add" and tool_call["function"]["arguments"] == '{"a": 2, "b": 3}'
    assert first.finish_reason == "tool_calls" and first.tools[0]["function"]["name"] == "add"
    assert second.messages[-1] == {"role": "tool", "tool_call_id": tool_call["id"], "content": "5"}
    assert second.text == "It is 5." and episode.output == "It is 5."
    assert_matches_server(episode.calls, openai_server)


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_structured_output_call(method, llm, openai_server, instrumented):
    if method == "json_schema":
        openai_server.queue(Reply('{"value": 4}'))
    else:
        openai_server.queue(Reply(tool_calls=[{"name": "Answer", "arguments": {"value": 4}}]))
    extractor = llm.with_structured_output(Answer, method=method).with_config(tags=["agent:extractor"])

    def agent(question: str) -> int:
        return extractor.invoke(question, config={"callbacks": [LightningCallbackHandler()]}).value

    episode = run_episode(agent, "What is 2 + 2?")
    assert episode.output == 4
    (call,) = episode.calls
    assert call.agent_name == "extractor"
    assert_matches_server(episode.calls, openai_server)


class _Draft(TypedDict, total=False):
    topic: str
    draft: str
    verdict: str


def _writer_checker_graph(llm: ChatOpenAI) -> Any:
    def writer(state: _Draft) -> _Draft:
        return {"draft": llm.invoke(f"Write about {state['topic']}").content}

    def checker(state: _Draft) -> _Draft:
        return {"verdict": llm.invoke(f"Check: {state['draft']}").content}

    graph = StateGraph(_Draft)
    graph.add_node("writer", writer)
    graph.add_node("checker", checker)
    graph.add_edge(START, "writer")
    graph.add_edge("writer", "checker")
    graph.add_edge("checker", END)
    return graph.compile()


async def test_langgraph_nodes_name_their_calls_and_the_trainer_can_pick_one(
    llm, openai_server, instrumented, global_langchain
):
    graph = _writer_checker_graph(llm)

    @ls.trace_agent(name="essay")
    async def agent(topic: str) -> str:
        return (await graph.ainvoke({"topic": topic}))["verdict"]

    with ls.capture() as episodes:
        await agent("owls")
    calls = episodes[0].calls
    assert [call.agent_name for call in calls] == ["writer", "checker"]  # LangGraph node names
    writer_calls = [call for call in calls if call.agent_name == "writer"]  # what the trainer filters on
    assert [call.text for call in writer_calls] == ["Write about owls"]
    assert_matches_server(calls, openai_server)


def test_parallel_branches_keep_their_own_names(llm, openai_server, instrumented, global_langchain):
    branches = RunnableParallel(
        poem=(ChatPromptTemplate.from_messages([("user", "poem {q}")]) | llm).with_config(
            tags=["agent:poet"]
        ),
        fact=(ChatPromptTemplate.from_messages([("user", "fact {q}")]) | llm).with_config(
            tags=["agent:scholar"]
        ),
    )
    episode = run_episode(lambda q: branches.invoke({"q": q}), "owls")
    names = {call.text: call.agent_name for call in episode.calls}
    assert names == {"poem owls": "poet", "fact owls": "scholar"}
    assert len(episode.calls) == len(openai_server.requests) == 2


def test_batched_llm_prompts_in_one_request_are_each_recorded_once(openai_server, instrumented):
    completion_llm = OpenAI(
        model="test-model", base_url=openai_server.base_url, api_key=openai_server.api_key, max_retries=0
    )
    handler = LightningCallbackHandler(agent_name="batcher")
    episode = run_episode(lambda: completion_llm.batch(["alpha", "beta"], config={"callbacks": [handler]}))
    assert len(openai_server.requests) == 1  # LangChain sends both prompts in one request
    assert [(call.kind, call.text, call.agent_name) for call in episode.calls] == [
        ("completion", "alpha", "batcher"),
        ("completion", "beta", "batcher"),
    ]
    assert len({call.metadata[RUN_ID_KEY] for call in episode.calls}) == 2
    assert episode.calls[0].prompt_token_ids == fake_tokenize("alpha")


def test_global_instrumentation_turns_on_and_off(llm, openai_server, instrumented):
    chain = (ChatPromptTemplate.from_messages([("user", "{q}")]) | llm).with_config(tags=["agent:writer"])
    assert instrument_langchain() is True and instrument_langchain() is False
    assert is_langchain_instrumented()
    try:
        on = run_episode(
            lambda q: chain.invoke({"q": q}, config={"callbacks": [LightningCallbackHandler()]}), "a"
        )
        on_global = run_episode(lambda q: chain.invoke({"q": q}), "b")
    finally:
        assert uninstrument_langchain() is True and uninstrument_langchain() is False
    off = run_episode(lambda q: chain.invoke({"q": q}), "c")
    assert len(on.calls) == 1  # a per-call handler and the global one do not both record
    assert [c.agent_name for c in on.calls + on_global.calls] == ["writer", "writer"]
    # Off: the openai capture still records the call, but nothing names it after the LangChain run.
    (plain,) = off.calls
    assert plain.agent_name == "solver" and RUN_ID_KEY not in plain.metadata


def test_without_openai_capture_the_handler_records_the_call_itself(llm, openai_server, capture_off):
    openai_server.queue(Reply(tool_calls=[{"name": "add", "arguments": {"a": 1, "b": 2}}]))
    bound = llm.bind_tools([add])
    handler = LightningCallbackHandler(agent_name="planner")
    episode = run_episode(lambda q: bound.invoke(q, config={"callbacks": [handler]}), "1 + 2?")
    (call,) = episode.calls
    assert (call.source, call.agent_name, call.kind, call.model) == (
        "langchain",
        "planner",
        "chat",
        "test-model",
    )
    assert call.messages == [{"role": "user", "content": "1 + 2?"}]
    assert call.request_id.startswith("chatcmpl-") and call.finish_reason == "tool_calls"
    (tool_call,) = call.response_message["tool_calls"]
    assert tool_call["function"] == {"name": "add", "arguments": '{"a": 1, "b": 2}'}
    assert call.tools[0]["function"]["name"] == "add"
    assert not call.trainable  # LangChain does not pass the engine's token ids on
    assert call.usage["prompt_tokens"] > 0 and call.latency_s is not None


def test_failed_call_is_recorded_once_with_its_error(llm, openai_server, instrumented):
    from tests.fixtures.openai_server import ErrorReply

    openai_server.queue(ErrorReply(status=400, message="bad request", type="invalid_request_error"))
    handler = LightningCallbackHandler(agent_name="writer")

    def agent(question: str) -> None:
        with pytest.raises(Exception, match="bad request"):
            llm.invoke(question, config={"callbacks": [handler]})

    episode = run_episode(agent, "hi")
    (call,) = episode.calls
    assert call.agent_name == "writer" and "bad request" in call.error


def test_outside_an_episode_nothing_is_recorded_or_kept(llm, openai_server, instrumented):
    handler = LightningCallbackHandler()
    with ls.capture() as episodes:
        assert llm.invoke("hi", config={"callbacks": [handler]}).content == "hi"
    assert episodes == [] and handler._runs == {}


async def test_a_finished_run_leaves_no_naming_behind(llm, openai_server, instrumented):
    handler = LightningCallbackHandler(agent_name="writer")

    @ls.trace_agent(name="solver")
    async def agent() -> None:
        await llm.ainvoke("named", config={"callbacks": [handler]})
        await llm.ainvoke("plain")  # a later call without the handler, in the same task
        llm.invoke("plain sync")

    with ls.capture() as episodes:
        await agent()
    assert [(c.text, c.agent_name) for c in episodes[0].calls] == [
        ("named", "writer"),
        ("plain", "solver"),
        ("plain sync", "solver"),
    ]
    assert [RUN_ID_KEY in c.metadata for c in episodes[0].calls] == [True, False, False]


def test_agent_name_rule_precedence():
    meta = {"agent_name": "m", "lc_agent_name": "lc", "langgraph_node": "node"}
    assert agent_name_of("fixed", ["agent:tag"], meta, "run") == "fixed"
    assert agent_name_of(None, ["agent:outer", "x", "agent:inner"], meta, "run") == "inner"
    assert agent_name_of(None, ["agent:"], meta, "run") == "m"
    assert agent_name_of(None, None, {"lc_agent_name": "lc", "langgraph_node": "n"}, "run") == "run"
    assert agent_name_of(None, None, {"lc_agent_name": "lc", "langgraph_node": "n"}, None) == "lc"
    assert agent_name_of(None, None, {"langgraph_node": "n"}, None) == "n"
    assert agent_name_of(None, [], {}, None) is None
