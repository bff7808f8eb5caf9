"""openai capture: the real openai client over HTTP to the local test server, recorded into episodes."""

from __future__ import annotations

import json

import openai
import pytest

import lightning_sdk as ls
from tests.fixtures.fake_openai_wire import (
    FAKE_WEIGHT_VERSION,
    ErrorReply,
    Reply,
    fake_logprobs,
    fake_tokenize,
    render_chat_prompt,
    tool_call_text,
)

USER = [{"role": "user", "content": "What is 2 + 2?"}]
TOOLS = [
    {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}
]
ADD_CALL = {"name": "add", "arguments": {"a": 2, "b": 2}, "id": "call_add"}


def in_episode(fn):
    """Run `fn()` as a traced agent; return its single episode."""
    with ls.capture() as episodes:
        ls.trace_agent(name="probe")(lambda: fn())()
    assert len(episodes) == 1
    return episodes[0]


async def in_async_episode(fn):
    async def probe():
        return await fn()

    with ls.capture() as episodes:
        await ls.trace_agent(name="probe")(probe)()
    return episodes[0]


def test_chat_call_records_request_response_and_token_ids(openai_server, openai_client, instrumented):
    openai_server.queue(Reply("4"))
    episode = in_episode(
        lambda: openai_client.chat.completions.create(
            model="test-model", messages=USER, temperature=0.7, max_tokens=16, seed=3, extra_body={"top_k": 5}
        )
    )
    [call] = episode.calls
    assert (call.kind, call.model, call.agent_name, call.source) == ("chat", "test-model", "probe", "openai")
    assert call.base_url == openai_server.base_url
    assert call.messages == USER
    assert call.sampling == {"temperature": 0.7, "max_tokens": 16, "seed": 3, "top_k": 5}
    assert call.response_message == {"role": "assistant", "content": "4"}
    assert (call.text, call.finish_reason, call.error) == ("4", "stop", None)
    assert call.prompt_token_ids == fake_tokenize(render_chat_prompt(USER))
    assert call.completion_token_ids == fake_tokenize("4")
    assert call.logprobs == fake_logprobs(fake_tokenize("4"))
    assert call.usage["completion_tokens"] == 1
    assert call.request_id.startswith("chatcmpl-") and call.latency_s > 0 and call.trainable
    assert call.policy_version == FAKE_WEIGHT_VERSION  # the weights that answered, as the server said


def test_request_is_sent_unaltered(openai_server, openai_client, instrumented):
    in_episode(lambda: openai_client.chat.completions.create(model="test-model", messages=USER))
    in_episode(
        lambda: list(openai_client.chat.completions.create(model="test-model", messages=USER, stream=True))
    )
    assert openai_server.requests == [
        {"model": "test-model", "messages": USER},
        {"model": "test-model", "messages": USER, "stream": True},
    ]


def test_recorded_messages_do_not_follow_later_changes(openai_client, instrumented):
    messages = [{"role": "user", "content": "first"}]
    episode = in_episode(lambda: openai_client.chat.completions.create(model="test-model", messages=messages))
    messages.append({"role": "assistant", "content": "changed later"})
    assert episode.calls[0].messages == [{"role": "user", "content": "first"}]


def test_recorded_requests_are_plain_json_even_with_openai_objects_in_them(
    openai_server, openai_client, instrumented
):
    openai_server.queue(Reply(tool_calls=[ADD_CALL]), Reply("4"))

    def two_turns():
        first = openai_client.chat.completions.create(model="test-model", messages=USER, tools=TOOLS)
        messages = [
            *USER,
            first.choices[0].message,  # the pydantic message object itself, as agents often do
            {"role": "tool", "tool_call_id": "call_add", "content": "4"},
        ]
        return openai_client.chat.completions.create(model="test-model", messages=messages, tools=TOOLS)

    episode = in_episode(two_turns)
    assistant = episode.calls[1].messages[1]
    assert isinstance(assistant, dict) and assistant["tool_calls"][0]["function"]["name"] == "add"
    assert ls.Episode.from_json(episode.to_json()) == episode


def test_tool_calls_whole_and_streamed_are_recorded_alike(openai_server, openai_client, instrumented):
    openai_server.queue(Reply(tool_calls=[ADD_CALL]), Reply(tool_calls=[ADD_CALL]))

    def both():
        whole = openai_client.chat.completions.create(model="test-model", messages=USER, tools=TOOLS)
        stream = openai_client.chat.completions.create(
            model="test-model", messages=USER, tools=TOOLS, stream=True
        )
        return whole, list(stream)

    episode = in_episode(both)
    whole, streamed = episode.calls
    expected_tool_call = {
        "id": "call_add",
        "type": "function",
        "function": {"name": "add", "arguments": json.dumps(ADD_CALL["arguments"])},
    }
    assert whole.response_message == {
        "role": "assistant",
        "content": None,
        "tool_calls": [expected_tool_call],
    }
    assert streamed.response_message == whole.response_message
    assert whole.finish_reason == streamed.finish_reason == "tool_calls"
    assert whole.tools == streamed.tools == TOOLS
    assert (
        whole.completion_token_ids == streamed.completion_token_ids == fake_tokenize(tool_call_text(ADD_CALL))
    )
    assert (
        whole.prompt_token_ids == streamed.prompt_token_ids == fake_tokenize(render_chat_prompt(USER, TOOLS))
    )
    assert whole.policy_version == streamed.policy_version == FAKE_WEIGHT_VERSION


def test_stream_consumed_fully_records_what_the_user_saw(openai_server, openai_client, instrumented):
    openai_server.queue(Reply("The answer is 4."))

    def consume():
        stream = openai_client.chat.completions.create(
            model="test-model", messages=USER, stream=True, stream_options={"include_usage": True}
        )
        return "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)

    episode = in_episode(consume)
    [call] = episode.calls
    assert call.text == episode.output == "The answer is 4."
    assert call.completion_token_ids == fake_tokenize("The answer is 4.")
    assert call.logprobs == fake_logprobs(fake_tokenize("The answer is 4."))
    assert call.usage == {
        "prompt_tokens": len(call.prompt_token_ids),
        "completion_tokens": 16,
        "total_tokens": len(call.prompt_token_ids) + 16,
    }
    assert call.finish_reason == "stop" and "stream_closed_early" not in call.metadata


def test_stream_closed_early_records_only_the_consumed_part(openai_server, openai_client, instrumented):
    openai_server.queue(Reply("abcdefghijklmnop"))

    def read_two_chunks_then_close():
        with openai_client.chat.completions.create(model="test-model", messages=USER, stream=True) as stream:
            chunks = [next(stream), next(stream), next(stream)]  # role chunk, "abcd", "efgh"
        return "".join(chunk.choices[0].delta.content or "" for chunk in chunks)

    episode = in_episode(read_two_chunks_then_close)
    [call] = episode.calls
    assert call.text == episode.output == "abcdefgh"
    assert call.completion_token_ids == fake_tokenize("abcdefgh")
    assert call.finish_reason is None and call.metadata["stream_closed_early"] is True


def test_text_completions_whole_and_streamed(openai_server, openai_client, instrumented):
    def both():
        whole = openai_client.completions.create(model="test-model", prompt="2 + 2 =", max_tokens=8)
        streamed = openai_client.completions.create(
            model="test-model", prompt="2 + 2 =", max_tokens=8, stream=True
        )
        return whole.choices[0].text, "".join(chunk.choices[0].text for chunk in streamed if chunk.choices)

    episode = in_episode(both)
    whole, streamed = episode.calls
    for call in (whole, streamed):
        assert (call.kind, call.prompt, call.text, call.messages) == (
            "completion",
            "2 + 2 =",
            "2 + 2 =",
            None,
        )
        assert call.prompt_token_ids == fake_tokenize("2 + 2 =")
        assert call.completion_token_ids == fake_tokenize("2 + 2 =")
        assert call.logprobs == fake_logprobs(fake_tokenize("2 + 2 ="))
        assert call.sampling == {"max_tokens": 8}


def test_n_choices_give_one_call_each_sharing_the_request_id(openai_server, openai_client, instrumented):
    openai_server.responder = lambda request: [Reply("first"), Reply("second"), Reply("third")]
    episode = in_episode(
        lambda: openai_client.chat.completions.create(model="test-model", messages=USER, n=3)
    )
    assert [call.text for call in episode.calls] == ["first", "second", "third"]
    assert [call.choice_index for call in episode.calls] == [0, 1, 2]
    assert len({call.request_id for call in episode.calls}) == 1
    assert len({call.id for call in episode.calls}) == 3
    assert [call.completion_token_ids for call in episode.calls] == [
        fake_tokenize(t) for t in ("first", "second", "third")
    ]


def test_n_choices_streamed_are_assembled_per_choice(openai_server, openai_client, instrumented):
    openai_server.responder = lambda request: [Reply("left side"), Reply("right")]
    episode = in_episode(
        lambda: list(
            openai_client.chat.completions.create(model="test-model", messages=USER, n=2, stream=True)
        )
    )
    assert [(c.choice_index, c.text, bytes(c.completion_token_ids).decode()) for c in episode.calls] == [
        (0, "left side", "left side"),
        (1, "right", "right"),
    ]


def test_list_prompt_completions_give_each_choice_its_prompt(openai_client, instrumented):
    episode = in_episode(
        lambda: openai_client.completions.create(model="test-model", prompt=["ab", "cd"], n=2)
    )
    assert [(call.prompt, call.text) for call in episode.calls] == [
        ("ab", "ab"),
        ("ab", "ab"),
        ("cd", "cd"),
        ("cd", "cd"),
    ]


def test_standard_logprobs_are_the_fallback(openai_server, openai_client, instrumented):
    from tests.fixtures.fake_openai_wire import RawReply, chat_completion

    body = chat_completion({"model": "m", "messages": USER, "logprobs": True}, [Reply("hi")], "chatcmpl-x")
    for key in ("token_ids", "token_logprobs"):
        body["choices"][0].pop(key)
    openai_server.queue(RawReply(body))
    episode = in_episode(
        lambda: openai_client.chat.completions.create(model="m", messages=USER, logprobs=True)
    )
    [call] = episode.calls
    assert call.logprobs == fake_logprobs(fake_tokenize("hi"))
    assert call.completion_token_ids is None and not call.trainable


@pytest.mark.parametrize(
    ("reply", "error_type"),
    [
        (ErrorReply(500, "engine fell over"), openai.InternalServerError),
        (ErrorReply(401, "bad key"), openai.AuthenticationError),
    ],
)
def test_failed_request_is_recorded_and_the_error_propagates(
    openai_server, openai_client, instrumented, reply, error_type
):
    openai_server.queue(reply)
    agent = ls.trace_agent(lambda: openai_client.chat.completions.create(model="test-model", messages=USER))
    with ls.capture() as episodes, pytest.raises(error_type, match=reply.message):
        agent()
    [call] = episodes[0].calls
    assert call.error.startswith(error_type.__name__) and reply.message in call.error
    assert call.messages == USER and call.completion_token_ids is None
    assert episodes[0].error["type"] == error_type.__name__


def test_raw_response_path_used_by_langchain_is_recorded(openai_server, openai_client, instrumented):
    openai_server.queue(Reply("raw"), Reply("raw stream"))

    def raw_calls():
        raw = openai_client.chat.completions.with_raw_response.create(model="test-model", messages=USER)
        completion = raw.parse()
        raw_stream = openai_client.chat.completions.with_raw_response.create(
            model="test-model", messages=USER, stream=True
        )
        text = "".join(chunk.choices[0].delta.content or "" for chunk in raw_stream.parse() if chunk.choices)
        return completion.choices[0].message.content, text

    episode = in_episode(raw_calls)
    assert episode.output == ["raw", "raw stream"]
    assert [call.text for call in episode.calls] == ["raw", "raw stream"]
    assert all(call.trainable for call in episode.calls)


def test_raw_response_wrapper_made_before_instrumenting_is_still_recorded(openai_client):
    raw_create = openai_client.chat.completions.with_raw_response.create  # bound before any patch
    ls.instrument_openai()
    episode = in_episode(lambda: raw_create(model="test-model", messages=USER).parse())
    assert [call.text for call in episode.calls] == [USER[0]["content"]]


def test_streaming_response_and_stream_helper_are_recorded(openai_client, instrumented):
    def helpers():
        with openai_client.chat.completions.with_streaming_response.create(
            model="test-model", messages=USER
        ) as response:
            first = response.parse().choices[0].message.content
        with openai_client.chat.completions.stream(model="test-model", messages=USER) as stream:
            second = stream.get_final_completion().choices[0].message.content
        return [first, second]

    episode = in_episode(helpers)
    assert [call.text for call in episode.calls] == episode.output == [USER[0]["content"]] * 2


async def test_async_chat_stream_and_raw(openai_server, async_openai_client, instrumented):
    openai_server.queue(Reply("one"), Reply("two words"), Reply("three"))

    async def calls():
        first = await async_openai_client.chat.completions.create(model="test-model", messages=USER)
        stream = await async_openai_client.chat.completions.create(
            model="test-model", messages=USER, stream=True
        )
        second = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
        raw = await async_openai_client.chat.completions.with_raw_response.create(
            model="test-model", messages=USER
        )
        return [first.choices[0].message.content, second, raw.parse().choices[0].message.content]

    episode = await in_async_episode(calls)
    assert [call.text for call in episode.calls] == episode.output == ["one", "two words", "three"]
    assert [call.completion_token_ids for call in episode.calls] == [fake_tokenize(t) for t in episode.output]


async def test_async_streaming_response_is_recorded(async_openai_client, instrumented):
    async def streaming_response():
        async with async_openai_client.chat.completions.with_streaming_response.create(
            model="test-model", messages=USER, stream=True
        ) as response:
            stream = await response.parse()
            return "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])

    episode = await in_async_episode(streaming_response)
    assert [call.text for call in episode.calls] == [episode.output] == [USER[0]["content"]]
    assert episode.calls[0].completion_token_ids == fake_tokenize(USER[0]["content"])


async def test_async_stream_closed_early(openai_server, async_openai_client, instrumented):
    openai_server.queue(Reply("abcdefghijkl"))

    async def read_one_piece():
        stream = await async_openai_client.completions.create(model="test-model", prompt="x", stream=True)
        chunk = await stream.__anext__()
        await stream.close()
        return chunk.choices[0].text

    episode = await in_async_episode(read_one_piece)
    [call] = episode.calls
    assert call.text == episode.output == "abcd"
    assert call.completion_token_ids == fake_tokenize("abcd") and call.metadata["stream_closed_early"]
