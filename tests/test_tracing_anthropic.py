"""Recording `anthropic` client calls: the real client over HTTP to our real endpoint's Messages API on the
real engine. A recorded call reads like the equivalent chat call (chat-format messages, the same prompt
token ids), whole or streamed, sync or async; a client built before a rollout, pointed at Anthropic's API,
reaches the policy and is trained."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import pytest

import lightning_sdk as ls
from lightning_sdk.tracing.capture.anthropic_client import messages_path, recorded_base_url
from lightning_sdk.tracing.routing import Router, routing
from lightning_sdk.tracing.urls import same_endpoint
from tests.fixtures.tools import CHAT_ADD_STRICT
from tests.fixtures.tools import MESSAGES_ADD as ADD

SYSTEM = "You answer in one word."
QUESTION = [{"role": "user", "content": "Name a colour."}]
GREEDY = {"temperature": 0.0}  # sent as extra_body: anthropic 2's create() has no temperature argument
NOWHERE = "http://127.0.0.1:9"  # a hosted API that is not there: a call that reaches it fails


def ask(client: anthropic.Anthropic, model: str, **options: Any) -> Any:
    settings = {"model": model, "max_tokens": 8, "system": SYSTEM, "extra_body": GREEDY}
    return client.messages.create(messages=QUESTION, **{**settings, **options})


def test_a_call_to_our_endpoint_is_recorded_as_its_chat_equivalent(
    served_endpoint: Any, chat_prompt_ids: Callable[[list[dict[str, Any]]], list[int]]
) -> None:
    endpoint = served_endpoint.endpoint
    client = endpoint.anthropic_client(max_retries=0)

    @ls.trace_agent(name="writer")
    def agent(task: str) -> str:
        return str(ask(client, endpoint.model).content[0].text)

    with ls.capture() as episodes:
        answer = agent("colour")
    [call] = episodes[0].calls
    assert call.metadata["api"] == "messages" and call.kind == "chat"
    assert call.messages == [{"role": "system", "content": SYSTEM}, *QUESTION]
    assert call.prompt_token_ids == chat_prompt_ids(call.messages)  # the chat route's exact prompt
    assert call.trainable and len(call.completion_token_ids or []) == len(call.logprobs or []) > 0
    assert same_endpoint(call.base_url, endpoint.base_url)  # so credit assignment trains it
    assert call.text == answer and call.response_message == {"role": "assistant", "content": answer}
    assert call.finish_reason in ("stop", "length") and call.metadata["stop_reason"] in (
        "end_turn",
        "max_tokens",
    )
    assert call.usage is not None and call.usage["completion_tokens"] == len(call.completion_token_ids or [])


def test_streams_are_recorded_with_what_the_user_saw(served_endpoint: Any) -> None:
    endpoint = served_endpoint.endpoint
    client = endpoint.anthropic_client(max_retries=0)

    @ls.trace_agent(name="writer")
    def agent(task: str) -> list[str]:
        whole = ask(client, endpoint.model).content[0].text
        with client.messages.stream(
            model=endpoint.model, max_tokens=8, system=SYSTEM, messages=QUESTION, extra_body=GREEDY
        ) as stream:
            streamed = stream.get_final_text()
        return [whole, streamed, asyncio.run(_async_stream(endpoint))]

    with ls.capture() as episodes:
        texts = agent("colour")
    whole, streamed, async_streamed = episodes[0].calls
    assert texts[0] == texts[1] == texts[2]  # greedy: the same answer three ways
    for call in (streamed, async_streamed):
        assert call.text == texts[0] and call.error is None
        assert call.completion_token_ids == whole.completion_token_ids
        assert call.prompt_token_ids == whole.prompt_token_ids and call.finish_reason == whole.finish_reason


async def _async_stream(endpoint: Any) -> str:
    async with endpoint.async_anthropic_client(max_retries=0) as client:
        stream = await client.messages.create(
            model=endpoint.model,
            max_tokens=8,
            system=SYSTEM,
            messages=QUESTION,
            stream=True,
            extra_body=GREEDY,
        )
        parts = [event.delta.text async for event in stream if event.type == "content_block_delta"]
    return "".join(parts)


def test_a_tool_round_trip_is_recorded_as_chat_tool_calls(served_endpoint: Any) -> None:
    endpoint = served_endpoint.endpoint
    client = endpoint.anthropic_client(max_retries=0)
    question = {"role": "user", "content": "What is 12 + 7? Use the add tool."}
    ask: dict[str, Any] = {"model": endpoint.model, "tools": [ADD], "extra_body": GREEDY}

    @ls.trace_agent(name="calculator")
    def agent(task: str) -> Any:
        forced = {"type": "tool", "name": "add"}
        first = client.messages.create(**ask, max_tokens=40, messages=[question], tool_choice=forced)
        [use] = first.content
        result = {"type": "tool_result", "tool_use_id": use.id, "content": str(sum(use.input.values()))}
        history = [
            question,
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": [result]},
        ]
        client.messages.create(**ask, max_tokens=8, messages=history)
        return use

    with ls.capture() as episodes:
        use = agent("12 + 7")
    first, second = episodes[0].calls
    [tool_call] = first.response_message["tool_calls"]
    assert tool_call["id"] == use.id and tool_call["function"]["name"] == "add"
    assert json.loads(tool_call["function"]["arguments"]) == use.input
    assert first.finish_reason == "tool_calls" and first.metadata["stop_reason"] == "tool_use"
    assert first.tools == [CHAT_ADD_STRICT]
    assert [message["role"] for message in second.messages] == ["user", "assistant", "tool"]
    assert second.messages[1]["tool_calls"][0]["id"] == use.id
    assert second.messages[2]["tool_call_id"] == use.id
    assert first.trainable and second.trainable


def test_a_refused_call_is_recorded_with_its_error_and_the_agent_sees_it(served_endpoint: Any) -> None:
    endpoint = served_endpoint.endpoint
    client = anthropic.Anthropic(base_url=endpoint.anthropic_base_url, api_key="wrong-key", max_retries=0)

    @ls.trace_agent(name="writer")
    def agent(task: str) -> Any:
        return ask(client, endpoint.model)

    with ls.capture() as episodes, pytest.raises(anthropic.AuthenticationError):
        agent("colour")
    [call] = episodes[0].calls
    assert call.error is not None and "AuthenticationError" in call.error and not call.trainable


def test_a_client_built_for_anthropics_api_reaches_the_policy_in_a_rollout(served_endpoint: Any) -> None:
    endpoint = served_endpoint.endpoint
    hosted = anthropic.Anthropic(base_url=NOWHERE, api_key="sk-ant-own-key", max_retries=0)

    @ls.trace_agent(name="writer")
    def agent(task: str) -> str:
        return str(ask(hosted, endpoint.model).content[0].text)

    with ls.capture() as episodes, routing(Router(endpoint.base_url, endpoint.api_key)):
        agent("colour")
    [call] = episodes[0].calls
    assert call.error is None and call.trainable and same_endpoint(call.base_url, endpoint.base_url)
    with pytest.raises(anthropic.APIConnectionError):  # outside the rollout it goes where it was built to
        ask(hosted, endpoint.model)


def test_only_messages_calls_are_recorded_and_under_the_api_root() -> None:
    class Options:
        def __init__(self, method: str, url: str) -> None:
            self.method, self.url = method, url

    assert messages_path(Options("post", "/v1/messages")) == "/v1/messages"
    assert messages_path(Options("post", "/v1/messages?beta=true")) == "/v1/messages"
    assert messages_path(Options("post", "/v1/messages/count_tokens")) is None
    assert messages_path(Options("get", "/v1/messages")) is None
    assert recorded_base_url("http://h:8000/", "/v1/messages") == "http://h:8000/v1"
    assert recorded_base_url("http://h:8000", "http://policy/v1/messages") == "http://policy/v1"


@pytest.mark.slow
def test_an_anthropic_agent_built_at_import_trains_with_its_calls_token_ids(
    vllm_engine: Any, tmp_path: Path
) -> None:
    from lightning_sdk.training.records.metrics import read_metrics

    hosted = anthropic.Anthropic(base_url=NOWHERE, api_key="sk-ant-own-key", max_retries=0)

    @ls.trace_agent(name="writer")
    def agent(task: dict[str, Any]) -> str:
        reply = hosted.messages.create(
            model="claude-agent-model", max_tokens=6, messages=[{"role": "user", "content": task["question"]}]
        )
        return "".join(block.text for block in reply.content if block.type == "text")

    config = ls.TrainerConfig(
        run_dir=str(tmp_path / "run"),
        max_steps=2,
        batch_size=2,
        group_size=2,
        max_tokens=6,
        eval_every=0,
        save_every=0,
        progress_bar=False,
    )
    tasks = [{"question": f"Name a colour number {i}."} for i in range(2)]
    ls.Trainer(config=config, engine=vllm_engine).fit(agent, tasks, reward=lambda task, out: len(out) / 30)
    steps = [record for record in read_metrics(tmp_path / "run") if "reward_mean" in record]
    assert len(steps) == 2
    for step in steps:  # no call went elsewhere (how many trained depends on the sampled rewards' spread)
        assert "calls_untrained_other_endpoint" not in step
    with ls.EpisodeStore(tmp_path / "run" / "episodes.sqlite") as store:
        calls = [call for episode in store.episodes() for call in episode.all_calls()]
    assert len(calls) == 8 and all(call.metadata["api"] == "messages" for call in calls)
    assert all(
        call.prompt_token_ids and call.completion_token_ids is not None for call in calls
    )  # the policy's
    # No system prompt and no tools given: none recorded (the client's markers of unset arguments dropped).
    assert calls[0].messages == [{"role": "user", "content": calls[0].messages[0]["content"]}]
    assert calls[0].tools is None and set(calls[0].sampling) == {"max_tokens"}
    assert all(call.prompt_token_ids and call.completion_token_ids is not None for call in calls)
