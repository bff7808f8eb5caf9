"""Samples to padded tensors, and per-token log-probabilities from a causal LM forward.

Right padding. Per-token tensors are aligned with *target* positions: column `j` describes token
`input_ids[:, start + j]`, predicted by the logits at position `start + j - 1`, where `start` is the
shortest prompt of the batch. Prompt tokens inside that window have `loss_mask` 0, so the model
computes logits only for the window (`logits_to_keep`), not for every prompt position.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from lightning_sdk.training.samples import Sample

__all__ = ["Batch", "collate", "micro_batches", "token_logprobs"]


@dataclass
class Batch:
    """A padded batch of samples."""

    input_ids: torch.Tensor
    """`[B, T]` token ids, right-padded."""
    attention_mask: torch.Tensor
    """`[B, T]` 1 for real tokens, 0 for padding."""
    start: int
    """First target position: the shortest prompt length of the batch."""
    targets: torch.Tensor
    """`[B, T - start]` the tokens whose log-probabilities are computed (`input_ids[:, start:]`)."""
    loss_mask: torch.Tensor
    """`[B, T - start]` float, 1 where the token is trained."""
    advantages: torch.Tensor
    """`[B, T - start]` float advantage per token (0 where not trained)."""
    sampling_logprobs: torch.Tensor
    """`[B, T - start]` the engine's log-probabilities (0 where unknown)."""
    has_sampling_logprobs: torch.Tensor
    """`[B, T - start]` bool, True where the engine's log-probability is known and the token is trained."""
    temperatures: torch.Tensor
    """`[B]` sampling temperature of each sequence."""

    @property
    def num_sequences(self) -> int:
        """Rows of the batch."""
        return int(self.input_ids.shape[0])


def collate(samples: Sequence[Sample], pad_token_id: int = 0, device: torch.device | str = "cpu") -> Batch:
    """Pad samples into a `Batch` (right padding; padding never enters the loss)."""
    if not samples:
        raise ValueError("collate needs at least one sample")
    length = max(len(sample) for sample in samples)
    start = min(len(sample.prompt_ids) for sample in samples)
    rows = len(samples)
    width = length - start
    input_ids = torch.full((rows, length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((rows, length), dtype=torch.long)
    loss_mask = torch.zeros((rows, width))
    advantages = torch.zeros((rows, width))
    sampling = torch.zeros((rows, width))
    has_sampling = torch.zeros((rows, width), dtype=torch.bool)
    for row, sample in enumerate(samples):
        ids = sample.input_ids
        input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, : len(ids)] = 1
        offset = len(sample.prompt_ids) - start  # where this sample's completion begins in the window
        span = slice(offset, offset + len(sample.completion_ids))
        loss_mask[row, span] = torch.tensor(sample.loss_mask, dtype=torch.float32)
        advantages[row, span] = torch.tensor(sample.advantages, dtype=torch.float32)
        known = [value is not None for value in sample.sampling_logprobs]
        sampling[row, span] = torch.tensor([value or 0.0 for value in sample.sampling_logprobs])
        has_sampling[row, span] = torch.tensor(known, dtype=torch.bool) & loss_mask[row, span].bool()
    temperatures = torch.tensor([sample.temperature for sample in samples], dtype=torch.float32)
    return Batch(
        input_ids=input_ids.to(device),
        attention_mask=attention_mask.to(device),
        start=start,
        targets=input_ids[:, start:].to(device),
        loss_mask=loss_mask.to(device),
        advantages=advantages.to(device),
        sampling_logprobs=sampling.to(device),
        has_sampling_logprobs=has_sampling.to(device),
        temperatures=temperatures.to(device),
    )


def micro_batches(samples: Sequence[Sample], size: int) -> list[list[Sample]]:
    """Split samples into micro-batches of at most `size`, grouping similar lengths to reduce padding."""
    ordered = sorted(samples, key=len)
    return [ordered[index : index + size] for index in range(0, len(ordered), size)]


def token_logprobs(
    model: torch.nn.Module, batch: Batch, with_entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities `[B, T - start]` of `batch.targets` under `model`, and their entropies.

    The logits are divided by each sequence's sampling temperature, so the result is the
    log-probability of the distribution the engine sampled from. Only the target window is projected
    to the vocabulary, and `logsumexp - gather` avoids a second `[B, T, V]` log-softmax tensor.
    The entropy (no gradient) is computed row by row to bound the temporary memory.
    """
    window = batch.input_ids.shape[1] - batch.start
    # logits at positions start-1 .. T-1; the last one predicts past the end and is dropped.
    output = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        logits_to_keep=window + 1,
        use_cache=False,
    )
    logits = output.logits[:, :-1, :].float() / batch.temperatures[:, None, None]
    picked = torch.gather(logits, -1, batch.targets.unsqueeze(-1)).squeeze(-1)
    logprobs = picked - torch.logsumexp(logits, dim=-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            rows = []
            for row_logits in logits.detach():
                probabilities = torch.softmax(row_logits, dim=-1)
                rows.append(torch.logsumexp(row_logits, -1) - (probabilities * row_logits).sum(-1))
            entropy = torch.stack(rows)
    return logprobs, entropy
