"""New weights without a restart: LoRA merging, adapter updates by version, and reverting to the base."""

from __future__ import annotations

import pytest

from lightning_sdk.engine import SamplingParams
from lightning_sdk.engine.lora_merge import load_safetensors_folder, merge_lora_adapter

pytestmark = pytest.mark.slow

GREEDY = SamplingParams(temperature=0, max_tokens=24)
QUESTION = [{"role": "user", "content": "What is 12 + 7?"}]


def test_merge_matches_peft(bundled_model, lora_adapter_dir) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = load_safetensors_folder(bundled_model.path)
    base32 = {name: tensor.float() for name, tensor in base.items()}
    ours = merge_lora_adapter(base32, lora_adapter_dir)
    model = AutoModelForCausalLM.from_pretrained(bundled_model.path, dtype=torch.float32)
    reference = PeftModel.from_pretrained(model, lora_adapter_dir).merge_and_unload().state_dict()
    changed = [name for name in base32 if not torch.equal(ours[name], base32[name])]
    assert changed and all(".q_proj." in n or ".v_proj." in n or ".down_proj." in n for n in changed)
    for name, tensor in ours.items():
        torch.testing.assert_close(tensor, reference[name], rtol=1e-5, atol=1e-6)
    assert ours.keys() == base.keys()  # the base dict itself is untouched and nothing is added


@pytest.mark.parametrize("engine_fixture", ["vllm_engine", "transformers_engine"])
def test_adapter_update_changes_greedy_output_and_reverts(
    request, engine_fixture, lora_adapter_dir, chat_prompt_ids
) -> None:
    engine = request.getfixturevalue(engine_fixture)
    prompt = chat_prompt_ids(QUESTION)
    before = engine.generate([prompt], GREEDY)[0]
    assert before.weight_version is None
    try:
        engine.load_adapter(lora_adapter_dir, version=1)
        assert engine.weight_version == 1
        after = engine.generate([prompt], GREEDY)[0]
        assert after.weight_version == 1
        assert after.completions[0].token_ids != before.completions[0].token_ids
    finally:
        engine.load_adapter(None, version=None)
    restored = engine.generate([prompt], GREEDY)[0]
    assert restored.weight_version is None
    assert restored.completions[0].token_ids == before.completions[0].token_ids


def test_full_weight_push_takes_effect(vllm_engine, bundled_model, chat_prompt_ids) -> None:
    import torch

    prompt = chat_prompt_ids(QUESTION)
    before = vllm_engine.generate([prompt], GREEDY)[0].completions[0]
    base = load_safetensors_folder(bundled_model.path)
    perturbed = dict(base)
    name = "model.layers.10.mlp.down_proj.weight"
    perturbed[name] = base[name] + 0.05 * torch.randn(
        base[name].shape, generator=torch.Generator().manual_seed(0)
    )
    try:
        vllm_engine.update_weights(perturbed, version="perturbed")
        after = vllm_engine.generate([prompt], GREEDY)[0]
        assert after.weight_version == "perturbed"
        assert after.completions[0].token_ids != before.token_ids
    finally:
        vllm_engine.update_weights(base.items(), version=None)
    assert vllm_engine.generate([prompt], GREEDY)[0].completions[0].token_ids == before.token_ids
