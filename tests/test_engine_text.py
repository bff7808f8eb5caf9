"""A completion cut inside a multi-byte character: its text stops at the last finished character, the same on
both engines, in whole and streamed responses and over HTTP; its token ids keep every sampled token."""

from __future__ import annotations

import pytest

from lightning_sdk.engine import SamplingParams
from lightning_sdk.engine.text import REPLACEMENT_CHARACTER, complete_text

# Greedy, the bundled model answers this in Japanese, whose characters span two tokens each.
JAPANESE = [{"role": "user", "content": "Write the word cat in Japanese."}]


@pytest.fixture(scope="module")
def tokenizer(bundled_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(bundled_model.path)


def _unfinished_cut(tokenizer, token_ids: list[int]) -> int:
    """The first length at which the ids end inside a character (after at least one finished one)."""
    for cut in range(2, len(token_ids) + 1):
        decoded = tokenizer.decode(token_ids[:cut], skip_special_tokens=True)
        if decoded.endswith(REPLACEMENT_CHARACTER) and decoded.rstrip(REPLACEMENT_CHARACTER):
            return cut
    raise AssertionError(f"no cut inside a character in {tokenizer.decode(token_ids)!r}")


def test_complete_text_drops_the_tokens_of_an_unfinished_character(tokenizer) -> None:
    # 猫 is three byte tokens; " 猫" is a token of the space and the first byte, then two more. The space
    # waits with the bytes it shares a token with.
    ids = tokenizer.encode("猫 猫", add_special_tokens=False)
    assert tokenizer.decode(ids[:4]) == "猫 " + REPLACEMENT_CHARACTER
    texts = [complete_text(tokenizer, ids[:n]) for n in range(len(ids) + 1)]
    assert texts == ["", "", "", "猫", "猫", "猫", "猫 猫"]


@pytest.mark.slow
@pytest.mark.parametrize("engine_fixture", ["vllm_engine", "transformers_engine"])
async def test_cut_inside_a_character_on_both_engines(
    request, engine_fixture, chat_prompt_ids, tokenizer
) -> None:
    engine = request.getfixturevalue(engine_fixture)
    prompt = chat_prompt_ids(JAPANESE)
    [full] = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=12))
    cut = _unfinished_cut(tokenizer, full.completions[0].token_ids)
    params = SamplingParams(temperature=0, max_tokens=cut)
    [result] = engine.generate([prompt], params)
    completion = result.completions[0]
    assert completion.token_ids == full.completions[0].token_ids[:cut]  # every sampled token is kept
    assert completion.finish_reason == "length"
    assert completion.text == complete_text(tokenizer, completion.token_ids)
    assert completion.text and REPLACEMENT_CHARACTER not in completion.text
    streamed = ""
    async for delta in engine.astream(prompt, params):
        streamed += delta.text
    assert streamed == completion.text


@pytest.mark.slow
def test_cut_inside_a_character_over_http(served_endpoint, tokenizer) -> None:
    endpoint = served_endpoint.endpoint
    client = endpoint.openai_client()
    ask = {"model": endpoint.model, "messages": JAPANESE, "temperature": 0}
    full = client.chat.completions.create(**ask, max_tokens=12).choices[0]
    cut = _unfinished_cut(tokenizer, full.token_ids)
    reply = client.chat.completions.create(**ask, max_tokens=cut).choices[0]
    assert reply.token_ids == full.token_ids[:cut]
    assert reply.message.content == complete_text(tokenizer, reply.token_ids)
    streamed = "".join(
        chunk.choices[0].delta.content or ""
        for chunk in client.chat.completions.create(**ask, max_tokens=cut, stream=True)
        if chunk.choices
    )
    assert streamed == reply.message.content
