"""The real openai client over HTTP against our app on the shared vLLM engine."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

import lightning_sdk as ls
from lightning_sdk.engine.text import complete_text
from lightning_sdk.tracing.routing import LANE_HEADER
from tests.fixtures.greedy import assert_greedy_agrees, first_token_penalties_must_change, top_two_margins

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is 12 + 7?"}]


def _decode(served_endpoint, ids: list[int]) -> str:
    return served_endpoint.engine.tokenizer.decode(ids, skip_special_tokens=True)


def _text(served_endpoint, ids: list[int]) -> str:
    """The text a reply carries for its ids: a sampled reply may end inside a multi-byte character, whose
    bytes are not text yet (see lightning_sdk.engine.text and tests/test_engine_text.py)."""
    return complete_text(served_endpoint.engine.tokenizer, ids)


def test_sync_chat_returns_prompt_and_completion_ids(served_endpoint, chat_prompt_ids) -> None:
    endpoint = served_endpoint.endpoint
    client = endpoint.openai_client()
    reply = client.chat.completions.create(
        model=endpoint.model, messages=QUESTION, max_tokens=20, temperature=0
    )
    choice = reply.choices[0]
    assert reply.prompt_token_ids == chat_prompt_ids(QUESTION)
    assert _decode(served_endpoint, choice.token_ids) == choice.message.content
    assert len(choice.token_logprobs) == len(choice.token_ids)
    assert choice.logprobs is None  # standard logprobs only when asked
    assert reply.usage.prompt_tokens == len(reply.prompt_token_ids)
    assert reply.usage.completion_tokens == len(choice.token_ids)


def test_prompt_plus_completion_ids_are_what_the_model_attended_to(served_endpoint) -> None:
    endpoint = served_endpoint.endpoint
    client = endpoint.openai_client()
    reply = client.chat.completions.create(
        model=endpoint.model, messages=QUESTION, max_tokens=16, temperature=0, logprobs=True, top_logprobs=2
    )
    prompt, completion = reply.prompt_token_ids, reply.choices[0].token_ids
    margins = top_two_margins(reply.choices[0].logprobs.content)
    # Continue greedily from the concatenated ids: the model must produce exactly the rest.
    half = len(completion) // 2
    rest = client.completions.create(
        model=endpoint.model,
        prompt=prompt + completion[:half],
        max_tokens=len(completion) - half,
        temperature=0,
    )
    assert rest.choices[0].prompt_token_ids == prompt + completion[:half]
    assert_greedy_agrees(completion[half:], rest.choices[0].token_ids, margins[half:])


async def test_async_chat_with_logprobs(served_endpoint) -> None:
    endpoint = served_endpoint.endpoint
    client = endpoint.async_openai_client()
    reply = await client.chat.completions.create(
        model=endpoint.model,
        messages=QUESTION,
        max_tokens=12,
        temperature=0.8,
        seed=3,
        logprobs=True,
        top_logprobs=2,
    )
    choice = reply.choices[0]
    assert _text(served_endpoint, choice.token_ids) == choice.message.content
    entries = choice.logprobs.content
    assert [e.logprob for e in entries] == pytest.approx(choice.token_logprobs)
    assert all(len(e.top_logprobs) == 2 for e in entries)
    await client.close()


def test_streamed_chat_chunks_carry_ids(served_endpoint) -> None:
    endpoint = served_endpoint.endpoint
    stream = endpoint.openai_client().chat.completions.create(
        model=endpoint.model,
        messages=QUESTION,
        max_tokens=20,
        temperature=1.0,
        n=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, ids, logprobs, finish, prompt_ids, usage = (
        {0: "", 1: ""},
        {0: [], 1: []},
        {0: [], 1: []},
        {},
        None,
        None,
    )
    for chunk in stream:
        if getattr(chunk, "prompt_token_ids", None) is not None:
            prompt_ids = chunk.prompt_token_ids
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text[choice.index] += choice.delta.content or ""
            ids[choice.index] += getattr(choice, "token_ids", None) or []
            logprobs[choice.index] += getattr(choice, "token_logprobs", None) or []
            if choice.finish_reason:
                finish[choice.index] = choice.finish_reason
    assert prompt_ids
    for index in (0, 1):
        assert ids[index] and _text(served_endpoint, ids[index]) == text[index]
        assert len(logprobs[index]) == len(ids[index])
        assert finish[index] in ("stop", "length")
    assert usage.completion_tokens == len(ids[0]) + len(ids[1])


def test_greedy_chat_with_n_returns_n_equal_choices(served_endpoint) -> None:
    # OpenAI accepts temperature=0 with n > 1 (agents evaluated greedily with a group size do this); vLLM
    # on its own answers "n must be 1 when using greedy sampling".
    endpoint = served_endpoint.endpoint
    client = endpoint.openai_client(max_retries=0)
    ask = {"model": endpoint.model, "messages": QUESTION, "max_tokens": 12, "temperature": 0}
    single = client.chat.completions.create(**ask, logprobs=True, top_logprobs=2).choices[0]
    margins = top_two_margins(single.logprobs.content)
    reply = client.chat.completions.create(**ask, n=3)
    assert [choice.index for choice in reply.choices] == [0, 1, 2]
    # The n choices of one request are the same answer; against a separate request, greedy up to near ties.
    first = reply.choices[0]
    for choice in reply.choices:
        assert choice.token_ids == first.token_ids
        assert choice.message.content == first.message.content
        assert choice.token_logprobs == pytest.approx(first.token_logprobs)
    assert_greedy_agrees(single.token_ids, first.token_ids, margins)
    assert reply.usage.completion_tokens == 3 * len(first.token_ids)
    streamed: dict[int, list[int]] = {0: [], 1: []}
    for chunk in client.chat.completions.create(**ask, n=2, stream=True):
        for choice in chunk.choices:
            streamed[choice.index] += getattr(choice, "token_ids", None) or []
    assert streamed[0] == streamed[1]
    assert_greedy_agrees(single.token_ids, streamed[0], margins)


async def test_32_concurrent_chats_all_succeed(served_endpoint) -> None:
    endpoint = served_endpoint.endpoint
    client = endpoint.async_openai_client()
    questions = [[{"role": "user", "content": f"What is {i} + {i}?"}] for i in range(32)]
    replies = await asyncio.gather(
        *(
            client.chat.completions.create(model=endpoint.model, messages=q, max_tokens=16, temperature=1.0)
            for q in questions
        )
    )
    assert len(replies) == 32
    for reply in replies:
        choice = reply.choices[0]
        assert choice.token_ids and _text(served_endpoint, choice.token_ids) == choice.message.content
    await client.close()


def test_text_completions_batch_and_stream(served_endpoint) -> None:
    endpoint = served_endpoint.endpoint
    client = endpoint.openai_client()
    reply = client.completions.create(
        model=endpoint.model,
        prompt=["The capital of France is", "1, 2, 3,"],
        max_tokens=6,
        temperature=0,
        logprobs=1,
    )
    assert [c.index for c in reply.choices] == [0, 1]
    for choice in reply.choices:
        assert _decode(served_endpoint, choice.token_ids) == choice.text
        assert choice.logprobs.token_logprobs == pytest.approx(choice.token_logprobs)
    texts: dict[int, str] = {0: "", 1: ""}
    token_ids: dict[int, list[int]] = {0: [], 1: []}
    prompt_ids = {}
    for chunk in client.completions.create(
        model=endpoint.model,
        prompt=["The capital of France is", "1, 2, 3,"],
        max_tokens=6,
        temperature=0,
        stream=True,
    ):
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            token_ids[choice.index] += choice.token_ids
            if getattr(choice, "prompt_token_ids", None):
                prompt_ids[choice.index] = choice.prompt_token_ids
    # Each stream's pieces add up to the text of its token ids. Its text is not compared with the first
    # request's: greedy decoding is not bit-reproducible across batch compositions (the CPU kernels'
    # reductions depend on the batch), so two greedy requests can part at a near tie; one CI run got
    # " Paris.\n\nThe United" against " Paris.\n\nThe answer".
    for index in (0, 1):
        assert 1 <= len(token_ids[index]) <= 6
        assert _text(served_endpoint, token_ids[index]) == texts[index]
    assert [prompt_ids[0], prompt_ids[1]] == [c.prompt_token_ids for c in reply.choices]


def test_models_list_and_default_alias(served_endpoint) -> None:
    endpoint = served_endpoint.endpoint
    client = endpoint.openai_client()
    assert [m.id for m in client.models.list()] == [endpoint.model]
    reply = client.chat.completions.create(model="default", messages=QUESTION, max_tokens=2)
    assert reply.model == endpoint.model


def test_forced_tool_call_is_parsed_from_the_sampled_text(served_endpoint) -> None:
    from lightning_sdk.serving.tools.calls import parse_tool_calls

    endpoint = served_endpoint.endpoint
    tool = {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The current time.",
            "parameters": {"type": "object", "properties": {}},
        },
    }
    reply = endpoint.openai_client().chat.completions.create(
        model=endpoint.model,
        messages=[{"role": "user", "content": "What time is it?"}],
        tools=[tool],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=12,
        temperature=0,
    )
    choice = reply.choices[0]
    prefix = '<tool_call>\n{"name": "get_time", "arguments": '
    # The forced start of the call is part of the prompt, so the ids still add up to what the model saw.
    assert _decode(served_endpoint, reply.prompt_token_ids).endswith(prefix)
    # The tiny model does not always write valid JSON; whatever it wrote, the reply is its parse.
    expected = parse_tool_calls(
        prefix + served_endpoint.engine.tokenizer.decode(choice.token_ids, skip_special_tokens=True)
    )
    if expected.tool_calls:
        assert choice.finish_reason == "tool_calls" or choice.finish_reason == "length"
        assert [c.function.name for c in choice.message.tool_calls] == ["get_time"]
        assert [c.function.arguments for c in choice.message.tool_calls] == [
            c["function"]["arguments"] for c in expected.tool_calls
        ]
    else:
        assert choice.message.tool_calls is None
        assert choice.message.content == expected.content


def _open_files() -> set[Path]:
    """The files this process holds open (Linux)."""
    opened = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            opened.add(Path(os.readlink(fd)))
        except OSError:  # closed between listing and reading
            continue
    return opened


def test_serve_runs_a_model_with_an_adapter(lora_adapter_dir, tmp_path: Path) -> None:
    # The standalone entry point, on the transformers engine to keep the test light.
    store = tmp_path / "episodes.db"
    with ls.serve(adapter=lora_adapter_dir, engine="transformers", max_model_len=512, store=store) as server:
        reply = server.endpoint.openai_client().chat.completions.create(
            model=server.endpoint.model, messages=QUESTION, max_tokens=4, temperature=0
        )
        assert reply.weight_version == lora_adapter_dir.name
        assert reply.choices[0].token_ids
        assert store.resolve() in _open_files()
    assert not server.engine._thread.is_alive()  # stop() shut the engine down too
    assert store.resolve() not in _open_files()  # and closed the store it opened


def test_serve_closes_the_store_it_opened_when_the_model_fails_to_load(tmp_path: Path) -> None:
    store = tmp_path / "episodes.db"
    with pytest.raises(Exception, match="missing-model"):
        ls.serve(tmp_path / "missing-model", engine="transformers", store=store)
    assert store.resolve() not in _open_files()


REPEATING_PROMPTS = (
    "Repeat the word 'apple' twenty times.",
    "List the numbers from 1 to 20, one per line.",
    "Count from 1 to 30, separated by commas.",
)


def test_sampling_policy_overrides_requests(vllm_engine) -> None:
    from lightning_sdk.serving import SamplingPolicy, start_server

    policy = SamplingPolicy(accept_any_model=True)
    policy.set(temperature=0.0, max_tokens=6)
    with start_server(vllm_engine, sampling_policy=policy) as server:
        client = server.endpoint.openai_client()
        replies = [
            client.chat.completions.create(
                model="gpt-4o-mini",
                messages=QUESTION,
                temperature=1.0,
                seed=seed,
                max_tokens=50,
                logprobs=True,
                top_logprobs=2,
            )
            for seed in (1, 2)
        ]
        first, second = (reply.choices[0] for reply in replies)
        # Forced greedy: two seeds give the same answer (up to near ties, see tests/fixtures/greedy.py).
        assert_greedy_agrees(first.token_ids, second.token_ids, top_two_margins(first.logprobs.content))
        assert len(replies[0].choices[0].token_ids) <= 6  # capped
        policy.set()  # no overrides: the request's own values again
        reply = client.chat.completions.create(
            model="anything", messages=QUESTION, max_tokens=9, temperature=0
        )
        assert len(reply.choices[0].token_ids) == 9 or reply.choices[0].finish_reason == "stop"

        # A request that names a lane is sampled by its lane's policy whatever the default is (an
        # evaluation beside training rollouts); a lane the server does not know gets the default.
        policy.lanes["eval"] = SamplingPolicy(temperature=0.0, max_tokens=3)
        policy.set(temperature=1.0, max_tokens=7)
        laned = [
            client.chat.completions.create(
                model="anything",
                messages=QUESTION,
                temperature=1.0,
                seed=seed,
                max_tokens=9,
                logprobs=True,
                top_logprobs=2,
                extra_headers={LANE_HEADER: "eval"},
            ).choices[0]
            for seed in (1, 2)
        ]
        assert_greedy_agrees(
            laned[0].token_ids, laned[1].token_ids, top_two_margins(laned[0].logprobs.content)
        )
        assert all(len(choice.token_ids) <= 3 for choice in laned)
        policy.set()
        counted = policy.calls_without_lane
        reply = client.chat.completions.create(
            model="anything", messages=QUESTION, max_tokens=9, temperature=0, extra_headers={LANE_HEADER: "x"}
        )
        assert len(reply.choices[0].token_ids) == 9 or reply.choices[0].finish_reason == "stop"
        # Counted: the trainer tells from it that an agent's calls bypass its clients (docs/trainer.md).
        assert policy.calls_without_lane == counted + 1

        # Penalties are honoured when serving, and dropped while the trainer samples (no_penalties). A
        # penalised answer must differ only where the plain one repeats a token whose lead over a token it
        # never generated is smaller than the penalty (see first_token_penalties_must_change); answers that
        # never repeat prove nothing (one CI run's began "I'm going to repeat the word" and stopped), so the
        # first of these prompts whose plain answer repeats that way is the one checked.
        def greedy(prompt: str, **penalties: float) -> Any:
            reply = client.chat.completions.create(
                model="anything",
                messages=[{"role": "user", "content": prompt}],
                max_tokens=48,
                temperature=0,
                logprobs=True,
                top_logprobs=5,
                **penalties,
            )
            return reply.choices[0]

        penalties = {"frequency_penalty": 2.0, "presence_penalty": 2.0}
        plain, position = None, None
        for prompt in REPEATING_PROMPTS:
            plain = greedy(prompt)
            position = first_token_penalties_must_change(plain.logprobs.content, **penalties)
            if position is not None:
                break
        assert plain is not None and position is not None, "no prompt's greedy answer repeated itself"
        penalised = greedy(prompt, **penalties)
        assert penalised.token_ids[: position + 1] != plain.token_ids[: position + 1]
        policy.set(no_penalties=True)
        unpenalised = greedy(prompt, **penalties)
        assert_greedy_agrees(plain.token_ids, unpenalised.token_ids, top_two_margins(plain.logprobs.content))


def test_adapter_update_reaches_http_clients_with_its_version(served_endpoint, lora_adapter_dir) -> None:
    # What the trainer relies on between steps: after an update the same endpoint serves the new weights,
    # and responses and /v1/models name the version that produced them.
    endpoint, engine = served_endpoint.endpoint, served_endpoint.engine
    client = endpoint.openai_client()

    def ask() -> Any:
        return client.chat.completions.create(
            model=endpoint.model, messages=QUESTION, max_tokens=12, temperature=0
        )

    before = ask()
    try:
        engine.load_adapter(lora_adapter_dir, version="step-1")
        after = ask()
        assert after.weight_version == "step-1"
        assert after.choices[0].token_ids != before.choices[0].token_ids
        assert client.models.list().data[0].weight_version == "step-1"
    finally:
        engine.load_adapter(None, version=None)
    restored = ask()
    assert restored.weight_version is None
    assert restored.choices[0].token_ids == before.choices[0].token_ids
