"""`benchmarks/step_profile.py` (`gpu_train.py --profile`): a real profiled step of a tiny LoRA policy, its
operators told apart by group (the GPU's figures wait for a GPU; the grouping is the same there)."""

from __future__ import annotations

import torch

from benchmarks.step_profile import GROUPS, as_markdown, classify, profile_step, summarize
from lightning_sdk.training.algorithm.samples import Sample
from lightning_sdk.training.config import TrainerConfig
from lightning_sdk.training.update.forward.batching import collate
from lightning_sdk.training.update.forward.logprobs import token_logprobs
from lightning_sdk.training.update.lora import build_lora_model
from lightning_sdk.training.update.optim import build_optimizer
from tests.fixtures.training import tiny_llama

RANK, VOCAB = 5, 200  # sizes no other dimension of the model or the batch shares


def test_matmuls_are_told_apart_by_the_rank_and_the_vocabulary_in_their_shapes() -> None:
    assert classify("aten::mm", [[16, 48], [48, RANK]], RANK, VOCAB) == "LoRA matmuls"
    assert classify("aten::mm", [[16, 48], [48, 96]], RANK, VOCAB) == "base matmuls"
    assert classify("aten::addmm", [[VOCAB], [16, 48], [48, VOCAB]], RANK, VOCAB) == "projection and loss"
    assert classify("aten::logsumexp", [[16, VOCAB]], RANK, VOCAB) == "projection and loss"
    assert classify("aten::_flash_attention_backward", [], RANK, VOCAB) == "attention"
    assert classify("aten::mul", [[16, 48], [16, 48]], RANK, VOCAB) == "other device work"


def test_a_profiled_step_says_where_its_time_went_by_group() -> None:
    config = TrainerConfig(lora_rank=RANK, lora_alpha=2 * RANK)
    model = build_lora_model(tiny_llama(vocab_size=VOCAB, hidden_size=48, intermediate_size=96), config)
    model.train()
    sample = Sample(list(range(1, 8)), list(range(8, 17)), [1] * 9, [None] * 9, [1.0] * 9)
    optimizer = build_optimizer(model, config)

    def step() -> None:
        logprobs, _ = token_logprobs(model, collate([sample]), with_entropy=False)
        (-logprobs.sum()).backward()

    def optimizer_step() -> None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    summary = summarize(profile_step(step, optimizer_step, on_gpu=False), False, RANK, VOCAB)
    groups = summary["groups"]
    assert list(groups) == list(GROUPS) and summary["wall_seconds"] > 0
    for group in ("LoRA matmuls", "base matmuls", "projection and loss", "optimizer", "other device work"):
        assert groups[group] > 0, group
    assert groups["host gaps"] == 0  # measured on a GPU only
    assert sum(groups.values()) <= summary["wall_seconds"] * torch.get_num_threads() + 1e-3
    assert {row["group"] for row in summary["top_operators"]} <= set(GROUPS)
    table = as_markdown(summary, "tiny", on_gpu=False)
    assert table.startswith("# tiny") and "| LoRA matmuls |" in table
