"""LoRA model: merged weights under checkpoint names without mutating the model, adapter save/load, export."""

import pytest
import torch
from safetensors.torch import load_file

from lightning_sdk.training.update.lora import (
    export_merged_model,
    load_adapter_weights,
    merged_state_dict,
    resolve_dtype,
    save_adapter,
)
from tests.fixtures.training import tiny_llama, tiny_lora_model

INPUT = torch.tensor([[3, 14, 15, 9, 26, 5]])


def logits_of(model):
    with torch.no_grad():
        return model(INPUT).logits


def test_merged_weights_reproduce_the_adapted_model_without_changing_it():
    model, _ = tiny_lora_model()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    merged = merged_state_dict(model)
    # Same names as a plain checkpoint of the base architecture (tied lm_head appears once, as saved).
    plain = tiny_llama(seed=5)
    expected_names = set(plain.state_dict()) - {"lm_head.weight"}
    assert set(merged) == expected_names
    plain.load_state_dict(merged, strict=False)
    plain.tie_weights()
    assert torch.allclose(logits_of(plain), logits_of(model), atol=1e-5)
    # The LoRA delta is really in there (the adapter is non-zero), and the training model is untouched.
    with model.disable_adapter():
        assert not torch.allclose(logits_of(plain), logits_of(model), atol=1e-3)
    after = model.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)
    assert merged_state_dict(model, dtype=torch.bfloat16)["model.norm.weight"].dtype == torch.bfloat16


def test_adapter_round_trip_through_safetensors(tmp_path):
    model, _ = tiny_lora_model(seed=1)
    folder = save_adapter(model, tmp_path / "adapter")
    assert (folder / "adapter_model.safetensors").is_file() and (folder / "adapter_config.json").is_file()
    fresh, _ = tiny_lora_model(seed=1)
    with torch.no_grad():
        for name, parameter in fresh.named_parameters():
            if "lora_" in name:
                parameter.zero_()
    assert not torch.allclose(logits_of(fresh), logits_of(model))
    load_adapter_weights(fresh, folder)
    assert torch.allclose(logits_of(fresh), logits_of(model), atol=1e-6)
    with pytest.raises(FileNotFoundError, match="pass a folder written by save_adapter"):
        load_adapter_weights(fresh, tmp_path / "missing")


def test_exported_folder_loads_without_peft(tmp_path):
    from transformers import AutoModelForCausalLM

    model, _ = tiny_lora_model(seed=2)
    export_merged_model(model, tmp_path / "merged")
    assert set(load_file(str(tmp_path / "merged" / "model.safetensors"))) == set(merged_state_dict(model))
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"))
    assert torch.allclose(logits_of(loaded), logits_of(model), atol=1e-5)


def test_dtype_resolution():
    assert resolve_dtype("auto", "cpu") == torch.float32
    assert resolve_dtype("auto", "cuda") == torch.bfloat16
    with pytest.raises(ValueError, match="dtype='fp8' is unknown"):
        resolve_dtype("fp8")


@pytest.mark.slow
def test_bundled_model_merged_names_match_its_checkpoint(bundled_model_path):
    from lightning_sdk.training.config import TrainerConfig
    from lightning_sdk.training.update.lora import build_lora_model, load_base_model

    model = build_lora_model(load_base_model(bundled_model_path), TrainerConfig())
    checkpoint = {}
    for file in bundled_model_path.glob("*.safetensors"):
        checkpoint.update(load_file(str(file)))
    merged = merged_state_dict(model)
    assert set(merged) == set(checkpoint)
    # A fresh adapter (B = 0) merges to exactly the base weights.
    assert all(torch.equal(merged[name], checkpoint[name].to(merged[name].dtype)) for name in checkpoint)
