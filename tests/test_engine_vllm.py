"""VLLMEngine on the bundled model: batched and concurrent generation, streaming, limits, torch threads."""

from __future__ import annotations

import asyncio

import pytest

from lightning_sdk.engine import Engine, PromptTooLongError, SamplingParams
from lightning_sdk.engine.text import complete_text
from tests.fixtures.greedy import assert_greedy_agrees, engine_margins

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is 12 + 7?"}]


def test_engine_satisfies_the_protocol(vllm_engine) -> None:
    assert isinstance(vllm_engine, Engine)
    assert vllm_engine.weight_sync == ("merge" if vllm_engine.on_cpu else "lora")
    assert vllm_engine.max_model_len == 2048
    assert (vllm_engine.model.path / "config.json").is_file()
    # The shared engine serves as a training run's does: in the policy's dtype, float32 on any CPU.
    if vllm_engine.on_cpu:
        assert vllm_engine.dtype == "float32"


def test_batch_generate_returns_ids_logprobs_and_text(vllm_engine, chat_prompt_ids) -> None:
    prompts = [chat_prompt_ids(QUESTION), chat_prompt_ids([{"role": "user", "content": "Name a color."}])]
    results = vllm_engine.generate(prompts, SamplingParams(temperature=0, max_tokens=24))
    tokenizer = vllm_engine.tokenizer
    for prompt, result in zip(prompts, results):
        [completion] = result.completions
        assert result.prompt_token_ids == prompt
        assert 0 < len(completion.token_ids) <= 24
        assert len(completion.logprobs) == len(completion.token_ids)
        assert all(lp <= 0.0 for lp in completion.logprobs)
        assert completion.text == tokenizer.decode(completion.token_ids, skip_special_tokens=True)
        assert completion.finish_reason in ("stop", "length")
    # Which answer greedy gives differs between a CPU that serves bfloat16 and one that serves float32;
    # that each prompt got its own answer does not.
    assert results[0].prompt_token_ids != results[1].prompt_token_ids


def test_n_samples_seed_and_stop(vllm_engine, chat_prompt_ids) -> None:
    params = SamplingParams(temperature=1.0, max_tokens=24, n=4, seed=7, stop=("\n",))
    first = vllm_engine.generate([chat_prompt_ids(QUESTION)], params)[0]
    again = vllm_engine.generate([chat_prompt_ids(QUESTION)], params)[0]
    assert [c.index for c in first.completions] == [0, 1, 2, 3]
    assert [c.token_ids for c in first.completions] == [c.token_ids for c in again.completions]
    assert len({tuple(c.token_ids) for c in first.completions}) > 1  # n samples, not one repeated
    for completion in first.completions:
        assert "\n" not in completion.text
        assert completion.finish_reason in ("stop", "length")


def test_top_logprobs_include_the_sampled_token(vllm_engine, chat_prompt_ids) -> None:
    result = vllm_engine.generate(
        [chat_prompt_ids(QUESTION)], SamplingParams(temperature=0, max_tokens=4, top_logprobs=3)
    )[0]
    completion = result.completions[0]
    for token_id, logprob, top in zip(completion.token_ids, completion.logprobs, completion.top_logprobs):
        assert top[token_id] == pytest.approx(logprob)
        assert max(top.values()) == pytest.approx(logprob)  # greedy picks the most likely token
        assert len(top) >= 3


async def test_concurrent_requests_and_stream_match_batch(vllm_engine, chat_prompt_ids) -> None:
    prompt = chat_prompt_ids(QUESTION)
    greedy = SamplingParams(temperature=0, max_tokens=16, top_logprobs=2)
    results = await asyncio.gather(*(vllm_engine.agenerate(prompt, greedy) for _ in range(8)))
    # Concurrent requests may land in different batches: the same greedy answer up to near ties.
    expected = results[0].completions[0]
    for result in results:
        assert_greedy_agrees(expected.token_ids, result.completions[0].token_ids, engine_margins(expected))
    streamed_ids, streamed_text = [], ""
    async for delta in vllm_engine.astream(prompt, greedy):
        streamed_ids += delta.token_ids
        streamed_text += delta.text
    assert_greedy_agrees(expected.token_ids, streamed_ids, engine_margins(expected))
    assert streamed_text == complete_text(vllm_engine.tokenizer, streamed_ids)


async def test_abandoned_stream_frees_its_slot(vllm_engine, chat_prompt_ids) -> None:
    stream = vllm_engine.astream(chat_prompt_ids(QUESTION), SamplingParams(temperature=0, max_tokens=500))
    async for _ in stream:
        break
    await stream.aclose()
    for _ in range(100):
        if not vllm_engine._loop.busy:
            break
        await asyncio.sleep(0.05)
    assert not vllm_engine._loop.busy


def test_prompt_longer_than_the_context_is_refused(vllm_engine) -> None:
    with pytest.raises(PromptTooLongError, match="maximum context length is 2048"):
        vllm_engine.generate([[1] * 2040], SamplingParams(max_tokens=16))


def test_sleep_gives_torch_its_threads_and_holds_requests_until_wake(vllm_engine, chat_prompt_ids) -> None:
    import time
    from concurrent.futures import ThreadPoolExecutor

    import torch

    assert torch.set_num_threads is vllm_engine._user_threads.set_num_threads  # vLLM's no-op replaced back
    user_threads, serving_threads = vllm_engine._user_threads.count, vllm_engine._serving_threads
    vllm_engine.sleep()
    try:
        assert vllm_engine.asleep == {"weights", "kv_cache"}  # vLLM's own state: its scheduler is paused
        assert torch.get_num_threads() == user_threads
        other = 1 if serving_threads != 1 else 2
        torch.set_num_threads(other)
        assert torch.get_num_threads() == other  # really applied, not swallowed
        params = SamplingParams(temperature=0, max_tokens=4)
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(vllm_engine.generate, [chat_prompt_ids(QUESTION)], params)
            time.sleep(1.0)
            assert not waiting.done()  # a sleeping engine schedules nothing (on a GPU its memory is gone)
            vllm_engine.wake()
            # ...and serves it on waking, with the thread count it started with.
            [result] = waiting.result(timeout=120)
        assert 0 < len(result.completions[0].token_ids) <= 4  # an early end of turn is an answer too
    finally:
        torch.set_num_threads(user_threads)
        vllm_engine.wake()
    assert torch.get_num_threads() == serving_threads
    assert vllm_engine.asleep == set()


async def test_blocking_generate_works_inside_an_event_loop(vllm_engine, chat_prompt_ids) -> None:
    # Notebooks and async agents may call the blocking API from a running loop; it must not deadlock.
    [result] = vllm_engine.generate([chat_prompt_ids(QUESTION)], SamplingParams(temperature=0, max_tokens=3))
    assert 0 < len(result.completions[0].token_ids) <= 3


def test_call_when_idle_waits_for_the_running_requests(vllm_engine, chat_prompt_ids) -> None:
    # What sleep() relies on for GPUs (vLLM's own "wait" mode is refused in-process): the call runs only
    # once the requests in flight are done, and they finish normally instead of being aborted.
    import time
    from concurrent.futures import ThreadPoolExecutor

    prompt = chat_prompt_ids([{"role": "user", "content": "Tell me a long story."}])
    params = SamplingParams(temperature=0, max_tokens=48)
    loop = vllm_engine._loop
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(vllm_engine.generate, [prompt], params)
        deadline = time.monotonic() + 30
        while not loop.busy and time.monotonic() < deadline:
            time.sleep(0.005)
        assert loop.busy
        unfinished_inside_call = loop.call_when_idle(
            lambda engine: engine.has_unfinished_requests(), timeout=60
        )
        [result] = running.result(timeout=60)
    assert unfinished_inside_call is False
    assert result.completions[0].finish_reason in ("stop", "length")
    assert len(result.completions[0].token_ids) > 0


def test_a_second_engine_in_the_process_is_refused(vllm_engine, bundled_model) -> None:
    # vLLM's parallel state is process-wide: a second engine next to a running one broke the first.
    from lightning_sdk.engine import VLLMEngine

    with pytest.raises(RuntimeError, match="already running in this process"):
        VLLMEngine(bundled_model)
    assert vllm_engine.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=2))[0].completions
