"""A warm start's KL reference is the adapter the run started from, kept frozen beside the trained one."""

import torch

from lightning_sdk.training.algorithm.samples import Sample
from lightning_sdk.training.update.forward.batching import collate
from lightning_sdk.training.update.forward.logprobs import token_logprobs
from lightning_sdk.training.update.lora import (
    add_reference_adapters,
    build_lora_model,
    load_adapter_weights,
    save_adapter,
    trained_adapters,
)
from lightning_sdk.training.update.step import _reference_logprobs
from tests.fixtures.training import tiny_llama, tiny_lora_model


def batch():
    samples = [
        Sample([5, 6, 7], [8, 9], [1, 1], [None] * 2, [1.0] * 2),
        Sample([11], [12], [1], [None], [1.0]),
    ]
    return collate(samples)


def logprobs(model):
    with torch.no_grad():
        return token_logprobs(model, batch(), with_entropy=False)[0]


def test_the_reference_is_the_starting_adapter_and_stays_it_while_training(tmp_path):
    warm, config = tiny_lora_model(seed=0)  # an adapter with non-zero B matrices: what SFT wrote
    start = save_adapter(warm, tmp_path / "sft")
    policy = build_lora_model(tiny_llama(), config)
    load_adapter_weights(policy, start)
    add_reference_adapters(policy, start)
    assert trained_adapters(policy) == ["default"] and policy.active_adapter == "default"
    assert all(not p.requires_grad for n, p in policy.named_parameters() if "reference_default" in n)

    at_start = logprobs(warm)
    assert torch.allclose(_reference_logprobs(policy, batch(), None), at_start, atol=1e-6)
    with torch.no_grad(), policy.disable_adapter():
        assert not torch.allclose(logprobs(policy), at_start, atol=1e-3)  # the base model differs

    with torch.no_grad():  # an update moves the trained adapter only
        for name, parameter in policy.named_parameters():
            if "lora_B.default" in name:
                parameter.add_(0.5)
    assert not torch.allclose(logprobs(policy), at_start, atol=1e-3)
    assert torch.allclose(_reference_logprobs(policy, batch(), None), at_start, atol=1e-6)
    assert policy.active_adapter == "default"

    saved = save_adapter(policy, tmp_path / "pushed")  # what the engine and checkpoints get
    assert not any(path.is_dir() for path in saved.iterdir())  # no reference subfolder
    load_adapter_weights(policy, saved)  # a resume loads the trained adapter and leaves the reference
    assert torch.allclose(_reference_logprobs(policy, batch(), None), at_start, atol=1e-6)
