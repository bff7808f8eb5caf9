"""The transformers fallback and vLLM produce the same greedy completions for the same prompt ids."""

from __future__ import annotations

import pytest

from lightning_sdk.engine import SamplingParams

pytestmark = pytest.mark.slow

QUESTIONS = [
    "What is 12 + 7?",
    "Name three colors.",
    "What is the capital of France?",
    "Write a haiku about the sea.",
]


def test_greedy_outputs_agree(vllm_engine, transformers_engine, chat_prompt_ids) -> None:
    # vLLM serves in bfloat16 and transformers computes in float32 from the same bf16 weights; on this
    # model and these prompts the argmax never flips, so the whole completions agree (checked for 48
    # tokens). Logprobs differ by bf16 rounding only.
    prompts = [chat_prompt_ids([{"role": "user", "content": q}]) for q in QUESTIONS]
    greedy = SamplingParams(temperature=0, max_tokens=32)
    from_vllm = vllm_engine.generate(prompts, greedy)
    from_transformers = transformers_engine.generate(prompts, greedy)
    for ours, theirs in zip(from_transformers, from_vllm):
        a, b = ours.completions[0], theirs.completions[0]
        assert a.token_ids == b.token_ids
        assert a.text == b.text
        assert a.finish_reason == b.finish_reason
        assert a.logprobs == pytest.approx(b.logprobs, abs=0.15)


def test_transformers_engine_samples_n_with_stop(transformers_engine, chat_prompt_ids) -> None:
    params = SamplingParams(temperature=1.0, max_tokens=16, n=3, seed=1, stop=("\n",), top_logprobs=2)
    [result] = transformers_engine.generate([chat_prompt_ids([{"role": "user", "content": "Hi"}])], params)
    assert [c.index for c in result.completions] == [0, 1, 2]
    for completion in result.completions:
        assert len(completion.logprobs) == len(completion.token_ids) == len(completion.top_logprobs)
        assert "\n" not in completion.text
        assert all(
            top[t] == pytest.approx(lp)
            for t, lp, top in zip(completion.token_ids, completion.logprobs, completion.top_logprobs)
        )
