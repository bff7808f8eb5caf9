"""Count how often flex attention is compiled over packed passes of six different lengths, in a fresh
process (torch.compile's caches are per process: a count taken beside other tests would include theirs,
and resetting them would drop the compiled code of an engine the test session shares).

Usage: python tests/scripts/flex_compiles.py cpu|cuda  -> prints {"compiled": N}. The CPU runs forward
passes without gradients (flex attention has no backward pass there); CUDA runs the backward pass too,
under gradient checkpointing, as the trainer does on a GPU.
"""

from __future__ import annotations

import json
import sys

import torch

from lightning_sdk.training.algorithm.samples import Sample
from lightning_sdk.training.config import TrainerConfig
from lightning_sdk.training.update.forward.batching import Batch, collate
from lightning_sdk.training.update.forward.logprobs import token_logprobs
from lightning_sdk.training.update.lora import build_lora_model
from tests.fixtures.training import tiny_llama


def varied_batches(count: int, device: str) -> list[Batch]:
    """`count` micro-batches whose packed rows all differ in length, as a run's steps do."""
    batches = []
    for index in range(count):
        prompt = [5 + (token % 50) for token in range(40 + 37 * index)]
        lengths = (9 + 11 * index, 30 + 5 * index, 3 + index)
        samples = [Sample(list(prompt), [7] * n, [1] * n, [None] * n, [1.0] * n) for n in lengths]
        batches.append(collate(samples, device=device))
    return batches


def main(device: str) -> None:
    with_gradients = device == "cuda"
    config = TrainerConfig(lora_rank=4, gradient_checkpointing=with_gradients)
    base = tiny_llama(attention="flex_attention", hidden_size=64, intermediate_size=96)
    model = build_lora_model(base, config).to(device).train()
    for batch in varied_batches(6, device):
        with torch.set_grad_enabled(with_gradients):
            logprobs, _ = token_logprobs(model, batch, layout="packed")
        if with_gradients:
            logprobs.sum().backward()
    print(json.dumps({"compiled": torch._dynamo.utils.counters["stats"]["unique_graphs"]}))


if __name__ == "__main__":
    main(sys.argv[1])
