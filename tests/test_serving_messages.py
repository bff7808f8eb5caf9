"""Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`): the translation to chat terms on
its own, then the real `anthropic` client over HTTP against our app on the shared vLLM engine: token ids on
every answer, the same prompt as chat completions, tool use, the documented event stream, Anthropic-shaped
errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from lightning_sdk.engine.text import complete_text
from lightning_sdk.serving.messages.schemas import MessagesInputError, MessagesRequest, parse_body
from lightning_sdk.serving.messages.translate import (
    chat_request,
    matched_stop_sequence,
    stop_reason,
)
from tests.fixtures.greedy import assert_greedy_agrees, top_two_margins
from tests.fixtures.tools import CHAT_ADD_STRICT as CHAT_ADD
from tests.fixtures.tools import MESSAGES_ADD as ADD

slow = pytest.mark.slow

SYSTEM = "Be brief."
QUESTION = "Name three colours."
ASK: dict[str, Any] = {
    "model": "default",
    "max_tokens": 12,
    "system": SYSTEM,
    "messages": [{"role": "user", "content": QUESTION}],
    "extra_body": {"temperature": 0},  # the client no longer has a temperature argument; the API has
}
CHAT = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]


# --- the translation, on its own -------------------------------------------------------------------------
def test_a_conversation_with_tools_becomes_the_chat_request_it_means() -> None:
    body = {
        "model": "default",
        "max_tokens": 30,
        "system": [{"type": "text", "text": "Be brief."}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "What is 12 + 7?"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Let me add."},
                    {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 12, "b": 7}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "19"},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": "boom", "is_error": True},
                    {"type": "text", "text": "So?"},
                ],
            },
        ],
        "tools": [ADD],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "stop_sequences": ["\n\n"],
        "temperature": 0.5,
    }
    parse_body(MessagesRequest, body)  # a body the server accepts
    assert chat_request(body) == {
        "model": "default",
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "content": [{"type": "text", "text": "What is 12 + 7?"}]},
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "Let me add."}],
                "tool_calls": [
                    {
                        "id": "toolu_1",
                        "type": "function",
                        "function": {"name": "add", "arguments": '{"a": 12, "b": 7}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "toolu_1", "content": "19"},
            {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: boom"},
            {"role": "user", "content": [{"type": "text", "text": "So?"}]},
        ],
        "tools": [CHAT_ADD],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_tokens": 30,
        "temperature": 0.5,
        "stop": ["\n\n"],
    }
    named = chat_request({**body, "tool_choice": {"type": "tool", "name": "add"}})
    assert named["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    assert "parallel_tool_calls" not in named


@pytest.mark.parametrize(
    ("change", "param", "mentions"),
    [
        ({"max_tokens": None}, "max_tokens", "Field required"),
        ({"messages": "hi"}, "messages", "valid list"),
        ({"messages": []}, "messages", "at least 1"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages.0.role", "'user' or 'assistant'"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "messages.0.content.0",
            "type 'image'",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "cache_control": {}}]}]},
            "messages.0.content.0.cache_control",
            "prompt caching",
        ),
        ({"system": [{"type": "text", "text": "x", "citations": [{}]}]}, "system.0.citations", "citations"),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "thinking", "thinking": "", "signature": ""}]}
                ]
            },
            "messages.0.content.0",
            "type 'thinking'",
        ),
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking", "extended thinking"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0.type", "server tools"),
        ({"tools": [{**ADD, "cache_control": {"type": "ephemeral"}}]}, "tools.0.cache_control", "caching"),
        ({"container": "c1"}, "container", "containers"),
        ({"mcp_servers": [{"type": "url", "url": "x", "name": "m"}]}, "mcp_servers", "MCP"),
        ({"service_tier": "priority"}, "service_tier", "one service tier"),
        ({"top_k": 5}, "top_k", "top_k"),
        ({"temperature": 1.5}, "temperature", "less than or equal to 1"),
        ({"tool_choice": {"type": "tool"}}, "tool_choice", "name is required"),
        ({"metadata": {"user_id": "u", "other": 1}}, "metadata.other", "Extra inputs"),
        ({"frequency_penalty": 1}, "frequency_penalty", "Extra inputs"),
    ],
)
def test_what_the_server_cannot_honour_is_refused_by_name(
    change: dict[str, Any], param: str, mentions: str
) -> None:
    body = {"model": "default", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], **change}
    body = {key: value for key, value in body.items() if value is not None}
    with pytest.raises(MessagesInputError) as caught:
        parse_body(MessagesRequest, body)
    assert caught.value.param == param
    assert str(caught.value).startswith(f"{param}: ") and mentions in str(caught.value)


def test_the_stop_reason_and_the_matched_stop_sequence() -> None:
    # The engine leaves a matched stop string out of the text; the sampled ids hold it (and maybe more).
    assert matched_stop_sequence("Red, green. Blue", "Red, green", [". ", "Blue", ","]) == ". "
    assert matched_stop_sequence("Red", "Red", ["."]) is None  # ended by the end-of-turn token
    assert matched_stop_sequence("Red.", "Red", []) is None
    assert stop_reason("length", True, None) == "max_tokens"
    assert stop_reason("stop", True, None) == "tool_use"
    assert stop_reason("stop", False, ".") == "stop_sequence"
    assert stop_reason("stop", False, None) == "end_turn"


# --- over HTTP, on the engine ----------------------------------------------------------------------------
@pytest.fixture
def client(served_endpoint: Any) -> Iterator[anthropic.Anthropic]:
    """The real `anthropic` client on our endpoint: it appends `/v1/messages` to the server's root."""
    endpoint = served_endpoint.endpoint
    root = endpoint.base_url.removesuffix("/v1")
    with anthropic.Anthropic(base_url=root, api_key=endpoint.api_key, max_retries=0) as client:
        yield client


@pytest.fixture(scope="module")
def reference(served_endpoint: Any) -> tuple[Any, list[float]]:
    """The greedy chat completion of the same conversation, and its best-two margins (for near ties)."""
    reply = served_endpoint.endpoint.openai_client().chat.completions.create(
        model="default", messages=CHAT, max_tokens=12, temperature=0, logprobs=True, top_logprobs=2
    )
    return reply, top_two_margins(reply.choices[0].logprobs.content)


def _text(message: Any) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


@slow
def test_a_message_is_the_chat_answer_with_its_token_ids(client, served_endpoint, reference) -> None:
    chat, margins = reference
    message = client.messages.create(**ASK)
    extra = message.model_extra
    ids = extra["token_ids"]
    assert message.id.startswith("msg_") and message.type == "message" and message.role == "assistant"
    assert message.model == served_endpoint.endpoint.model
    assert extra["prompt_token_ids"] == chat.prompt_token_ids  # the same prompt through either API
    assert message.usage.input_tokens == len(extra["prompt_token_ids"])
    assert message.usage.output_tokens == len(ids) == len(extra["token_logprobs"]) > 0
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == complete_text(served_endpoint.engine.tokenizer, ids)
    assert_greedy_agrees(chat.choices[0].token_ids, ids, margins)
    if ids == chat.choices[0].token_ids:
        assert (
            message.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[chat.choices[0].finish_reason]
        )
        assert message.stop_sequence is None


@slow
def test_a_stop_sequence_ends_the_message_and_is_named(client, reference) -> None:
    chat, margins = reference
    text, chat_ids = chat.choices[0].message.content, chat.choices[0].token_ids
    stop = text.split()[1]  # a word the greedy answer writes after some text
    message = client.messages.create(**ASK, stop_sequences=["never written", stop])
    ids = message.model_extra["token_ids"]
    if ids != chat_ids[: len(ids)]:  # parted at a near tie before the stop (tests/fixtures/greedy.py)
        assert_greedy_agrees(chat_ids[: len(ids)], ids, margins)
        return
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == stop
    assert _text(message) == text[: text.index(stop)]


@slow
def test_a_streamed_message_is_the_whole_message(client, reference) -> None:
    chat, margins = reference
    whole = client.messages.create(**ASK)
    with client.messages.stream(**ASK) as stream:
        deltas = [event for event in stream if event.type == "message_delta"]
        final = stream.get_final_message()
    [delta] = deltas
    ids, whole_ids = delta.model_extra["token_ids"], whole.model_extra["token_ids"]
    assert len(delta.model_extra["token_logprobs"]) == len(ids) == final.usage.output_tokens > 0
    prompt = whole.model_extra["prompt_token_ids"]
    assert final.model_extra["prompt_token_ids"] == delta.model_extra["prompt_token_ids"] == prompt
    assert final.usage.input_tokens == len(prompt)
    if ids != whole_ids:  # two greedy runs may part at a near tie, and only there
        assert_greedy_agrees(chat.choices[0].token_ids, ids, margins)
        assert_greedy_agrees(chat.choices[0].token_ids, whole_ids, margins)
        return
    assert _text(final) == _text(whole) and final.content[0].type == "text"
    assert (final.stop_reason, final.stop_sequence) == (whole.stop_reason, whole.stop_sequence)
    # `create(stream=True)`: the raw events, in the documented order.
    kinds = [event.type for event in client.messages.create(**ASK, stream=True)]
    assert kinds[:2] == ["message_start", "content_block_start"] and "content_block_delta" in kinds
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]


@slow
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_forced_tool_call_and_its_result_round_trip(client, served_endpoint, stream) -> None:
    question = {"role": "user", "content": "What is 12 + 7? Use the add tool."}
    ask: dict[str, Any] = {
        "model": "default",
        "system": SYSTEM,
        "tools": [ADD],
        "extra_body": {"temperature": 0},
    }
    forced = {**ask, "max_tokens": 60, "messages": [question], "tool_choice": {"type": "tool", "name": "add"}}
    if stream:
        with client.messages.stream(**forced) as events:
            final_ids = next(e for e in events if e.type == "message_delta").model_extra["token_ids"]
            first = events.get_final_message()
    else:
        first = client.messages.create(**forced)
        final_ids = first.model_extra["token_ids"]
    [call] = first.content
    assert call.type == "tool_use" and call.name == "add" and call.id.startswith("toolu_")
    assert first.stop_reason == "tool_use" and final_ids
    assert set(call.input) == {"a", "b"} and all(isinstance(value, int) for value in call.input.values())
    result = call.input["a"] + call.input["b"]
    history = [
        question,
        {"role": "assistant", "content": first.content},  # sent back as the client received it
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": str(result)}],
        },
    ]
    second = client.messages.create(**ask, max_tokens=16, messages=history)
    assert second.stop_reason in ("end_turn", "max_tokens", "tool_use") and second.model_extra["token_ids"]
    # The same conversation through chat completions is the same prompt, token for token.
    chat = served_endpoint.endpoint.openai_client().chat.completions.create(
        model="default",
        messages=[
            {"role": "system", "content": SYSTEM},
            question,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {"name": "add", "arguments": json.dumps(call.input)},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call.id, "content": str(result)},
        ],
        tools=[CHAT_ADD],
        max_tokens=1,
        temperature=0,
    )
    assert second.model_extra["prompt_token_ids"] == chat.prompt_token_ids


@slow
def test_count_tokens_is_the_length_of_the_prompt_served(client) -> None:
    plain = {"model": "default", "system": SYSTEM, "messages": ASK["messages"]}
    tool = {**plain, "tools": [ADD], "tool_choice": {"type": "tool", "name": "add"}}
    served = client.messages.create(**plain, max_tokens=1)
    served_with_tool = client.messages.create(**tool, max_tokens=1)
    assert client.messages.count_tokens(**plain).input_tokens == len(served.model_extra["prompt_token_ids"])
    counted = client.messages.count_tokens(**tool).input_tokens
    assert counted == len(served_with_tool.model_extra["prompt_token_ids"]) > served.usage.input_tokens


@slow
@pytest.mark.parametrize(
    ("content", "status", "kind", "mentions"),
    [
        (b"{not json", 400, "invalid_request_error", "not valid JSON"),
        (b"[1, 2]", 400, "invalid_request_error", "JSON object"),
        (
            json.dumps({"model": "default", "messages": [{"role": "user", "content": "hi"}]}),
            400,
            "",
            "max_tokens",
        ),
        (json.dumps({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}), 400, "", "model"),
        (
            json.dumps(
                {
                    "model": "default",
                    "max_tokens": 5,
                    "messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}],
                }
            ),
            400,
            "",
            "type 'document'",
        ),
        (
            json.dumps(
                {
                    "model": "default",
                    "max_tokens": 5,
                    "messages": [
                        {"role": "user", "content": "hi"},
                        {"role": "assistant", "content": "Sure,"},
                    ],
                }
            ),
            400,
            "",
            "prefill",
        ),
        (
            json.dumps(
                {
                    "model": "default",
                    "max_tokens": 5,
                    "messages": [{"role": "user", "content": "hi"}],
                    "tools": [ADD],
                    "tool_choice": {"type": "tool", "name": "multiply"},
                }
            ),
            400,
            "",
            "'multiply' is not one of the tools",
        ),
        (
            json.dumps(
                {"model": "claude-sonnet-4", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
            ),
            404,
            "not_found_error",
            "claude-sonnet-4",
        ),
    ],
)
def test_a_bad_request_gets_an_anthropic_error_and_the_server_goes_on(
    client, served_endpoint, content, status, kind, mentions
) -> None:
    endpoint = served_endpoint.endpoint
    response = httpx.post(
        f"{endpoint.base_url}/messages",
        content=content,
        headers={"x-api-key": endpoint.api_key, "anthropic-version": "2023-06-01"},
        timeout=60,
    )
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == (kind or "invalid_request_error") and mentions in body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError, match="extended thinking"):
        client.messages.create(**ASK, thinking={"type": "enabled", "budget_tokens": 1024})
    again = client.messages.create(**{**ASK, "max_tokens": 2})
    assert again.model_extra["token_ids"]


@slow
def test_a_wrong_key_is_an_authentication_error_in_anthropic_form(served_endpoint) -> None:
    endpoint = served_endpoint.endpoint
    root = endpoint.base_url.removesuffix("/v1")
    with anthropic.Anthropic(base_url=root, api_key="not-the-key", max_retries=0) as stranger:
        with pytest.raises(anthropic.AuthenticationError) as caught:
            stranger.messages.create(**ASK)
        with pytest.raises(anthropic.AuthenticationError):
            stranger.messages.count_tokens(model="default", messages=ASK["messages"])
    assert caught.value.body["type"] == "error"  # type: ignore[index]
    assert caught.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    # No key at all: the same; the OpenAI routes keep OpenAI's shape.
    unkeyed = httpx.post(f"{endpoint.base_url}/messages", json={}, timeout=30)
    assert unkeyed.status_code == 401 and unkeyed.json()["error"]["type"] == "authentication_error"
    openai_route = httpx.post(f"{endpoint.base_url}/chat/completions", json={}, timeout=30)
    assert openai_route.status_code == 401 and openai_route.json()["error"]["code"] == "invalid_api_key"
