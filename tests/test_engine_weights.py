"""New weights without a restart: LoRA merging, adapter updates by version, and reverting to the base."""

from __future__ import annotations

import pytest

from lightning_sdk.engine import SamplingParams
from lightning_sdk.engine.lora.merge import load_safetensors_folder, merge_lora_adapter
from tests.fixtures.greedy import assert_greedy_agrees, engine_margins

pytestmark = pytest.mark.slow

GREEDY = SamplingParams(temperature=0, max_tokens=24, top_logprobs=2)
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
    # Merging into the stored bfloat16 base for float32 serving rounds once, to float32: the same weights.
    widened = merge_lora_adapter(base, lora_adapter_dir, torch.float32)
    assert all(torch.equal(widened[name], ours[name]) for name in changed)


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
    first = before.completions[0]
    assert_greedy_agrees(first.token_ids, restored.completions[0].token_ids, engine_margins(first))


def test_in_place_adapter_writes_match_a_full_reload(
    vllm_engine, bundled_model, lora_adapter_dir, tmp_path, chat_prompt_ids
) -> None:
    # load_adapter writes only the layers an adapter targets (q/k/v and gate/up fused as vLLM stores them)
    # and puts back the base weights of layers only the previous adapter changed; update_weights goes
    # through vLLM's reload of every weight. Both must serve the very same model.
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_pretrained(bundled_model.path, dtype=torch.float32)
    config = LoraConfig(
        r=4, target_modules=["k_proj", "o_proj", "gate_proj", "up_proj"], init_lora_weights=False
    )
    get_peft_model(model, config).save_pretrained(tmp_path / "other")
    prompt = chat_prompt_ids(QUESTION)
    params = SamplingParams(temperature=0, max_tokens=24, top_logprobs=1)
    base = load_safetensors_folder(bundled_model.path)
    try:
        for version, adapter in enumerate((lora_adapter_dir, tmp_path / "other", lora_adapter_dir)):
            vllm_engine.load_adapter(adapter, version=version)  # from the previous adapter, in place
            written = vllm_engine.generate([prompt], params)[0].completions[0]
            served = getattr(torch, vllm_engine.dtype)  # merged in the served dtype, like the in-place path
            vllm_engine.update_weights(merge_lora_adapter(base, adapter, served), version="reloaded")
            reloaded = vllm_engine.generate([prompt], params)[0].completions[0]
            assert written.token_ids == reloaded.token_ids
            assert written.logprobs == pytest.approx(reloaded.logprobs, abs=1e-6)
            vllm_engine.load_adapter(adapter, version=version)  # a full push: the state was replaced
    finally:
        vllm_engine.load_adapter(None, version=None)


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
    restored = vllm_engine.generate([prompt], GREEDY)[0].completions[0]
    assert_greedy_agrees(before.token_ids, restored.token_ids, engine_margins(before))
