"""Samples to padded tensors, and per-token log-probabilities from a causal LM forward.

A batch keeps prompts and completions apart: the distinct prompts of the batch, left-padded so they
end together, and one right-padded completion per sample. The `group_size` episodes of a task share
their first prompt, so a micro-batch of one group holds one prompt and eight completions; the prompt
then goes through the model once and its key/value cache is reused by every completion (the gradient
flows back through the shared cache). With the A + B task's shape (47 prompt and 16 completion tokens,
8 samples per prompt) that is about 2.4 times less CPU time for forward + backward than running every
full sequence (`benchmarks/train_step.py`).

Per-token tensors are `[B, Lc]`, aligned with `completion_ids`: column `k` is completion token `k`,
predicted by the last prompt position for `k = 0` and by completion position `k - 1` after that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from lightning_sdk.training.algorithm.samples import Sample

__all__ = ["Batch", "collate", "micro_batches", "token_logprobs"]


@dataclass
class Batch:
    """A padded batch of samples (see the module docstring for the layout)."""

    prompt_ids: torch.Tensor
    """`[U, Lp]` the distinct prompts, left-padded."""
    prompt_mask: torch.Tensor
    """`[U, Lp]` 1 for real prompt tokens."""
    prompt_index: torch.Tensor
    """`[B]` which prompt each sample continues."""
    completion_ids: torch.Tensor
    """`[B, Lc]` completion tokens (the tokens whose log-probabilities are computed), right-padded."""
    completion_mask: torch.Tensor
    """`[B, Lc]` 1 for real completion tokens (trained or not), 0 for padding."""
    loss_mask: torch.Tensor
    """`[B, Lc]` float, 1 where the token is trained."""
    advantages: torch.Tensor
    """`[B, Lc]` float advantage per token (0 where not trained)."""
    sampling_logprobs: torch.Tensor
    """`[B, Lc]` the engine's log-probabilities (0 where unknown)."""
    has_sampling_logprobs: torch.Tensor
    """`[B, Lc]` bool, True where the engine's log-probability is known and the token is trained."""
    temperatures: torch.Tensor
    """`[B]` sampling temperature of each sequence."""

    @property
    def num_sequences(self) -> int:
        """Samples in the batch."""
        return int(self.completion_ids.shape[0])

    @property
    def num_prompts(self) -> int:
        """Distinct prompts in the batch."""
        return int(self.prompt_ids.shape[0])


def collate(samples: Sequence[Sample], pad_token_id: int = 0, device: torch.device | str = "cpu") -> Batch:
    """Pad samples into a `Batch`; identical prompts are stored once. Padding never enters the loss."""
    if not samples:
        raise ValueError("collate needs at least one sample")
    prompts: dict[tuple[int, ...], int] = {}
    for sample in samples:
        prompts.setdefault(tuple(sample.prompt_ids), len(prompts))
    prompt_length = max(len(prompt) for prompt in prompts)
    prompt_ids = torch.full((len(prompts), prompt_length), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((len(prompts), prompt_length), dtype=torch.long)
    for prompt, row in prompts.items():
        prompt_ids[row, prompt_length - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        prompt_mask[row, prompt_length - len(prompt) :] = 1

    rows, width = len(samples), max(len(sample.completion_ids) for sample in samples)
    completion_ids = torch.full((rows, width), pad_token_id, dtype=torch.long)
    completion_mask = torch.zeros((rows, width), dtype=torch.long)
    loss_mask, advantages, sampling = (torch.zeros((rows, width)) for _ in range(3))
    has_sampling = torch.zeros((rows, width), dtype=torch.bool)
    for row, sample in enumerate(samples):
        size = len(sample.completion_ids)
        completion_ids[row, :size] = torch.tensor(sample.completion_ids, dtype=torch.long)
        completion_mask[row, :size] = 1
        loss_mask[row, :size] = torch.tensor(sample.loss_mask, dtype=torch.float32)
        advantages[row, :size] = torch.tensor(sample.advantages, dtype=torch.float32)
        sampling[row, :size] = torch.tensor([value or 0.0 for value in sample.sampling_logprobs])
        known = torch.tensor([value is not None for value in sample.sampling_logprobs], dtype=torch.bool)
        has_sampling[row, :size] = known & loss_mask[row, :size].bool()
    return Batch(
        prompt_ids=prompt_ids.to(device),
        prompt_mask=prompt_mask.to(device),
        prompt_index=torch.tensor([prompts[tuple(s.prompt_ids)] for s in samples], device=device),
        completion_ids=completion_ids.to(device),
        completion_mask=completion_mask.to(device),
        loss_mask=loss_mask.to(device),
        advantages=advantages.to(device),
        sampling_logprobs=sampling.to(device),
        has_sampling_logprobs=has_sampling.to(device),
        temperatures=torch.tensor([s.temperature for s in samples], dtype=torch.float32, device=device),
    )


def micro_batches(samples: Sequence[Sample], size: int) -> list[list[Sample]]:
    """Split samples into micro-batches of at most `size` sequences.

    Samples with the same prompt are packed whole into one micro-batch when they fit (they share the
    prompt's forward pass); groups larger than `size` are split. Similar lengths go together, which
    keeps padding small.
    """
    by_prompt: dict[tuple[int, ...], list[Sample]] = {}
    for sample in sorted(samples, key=lambda s: (len(s.prompt_ids), s.prompt_ids, len(s.completion_ids))):
        by_prompt.setdefault(tuple(sample.prompt_ids), []).append(sample)
    chunks: list[list[Sample]] = []
    current: list[Sample] = []
    for group in by_prompt.values():
        if len(current) + len(group) > size and current:
            chunks.append(current)
            current = []
        while len(group) > size:
            chunks.append(group[:size])
            group = group[size:]
        current = current + group
    if current:
        chunks.append(current)
    return chunks


def _positions(mask: torch.Tensor, offset: torch.Tensor | int = 0) -> torch.Tensor:
    # Real tokens get positions 0, 1, 2, ... as the engine gave them; left padding does not shift them.
    return (mask.cumsum(dim=1) - 1).clamp(min=0) + (offset if isinstance(offset, int) else offset[:, None])


def _full_logits(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    index = batch.prompt_index
    input_ids = torch.cat([batch.prompt_ids[index], batch.completion_ids], dim=1)
    mask = torch.cat([batch.prompt_mask[index], batch.completion_mask], dim=1)
    width = batch.completion_ids.shape[1]
    # Logits of the last prompt position and every completion position but the last (nothing to predict).
    output = model(
        input_ids=input_ids,
        attention_mask=mask,
        position_ids=_positions(mask),
        logits_to_keep=width + 1,
        use_cache=False,
    )
    logits: torch.Tensor = output.logits[:, :-1, :]
    return logits


def _shared_prompt_logits(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    from transformers import DynamicCache

    index = batch.prompt_index
    cache = DynamicCache()
    prompt_output = model(
        input_ids=batch.prompt_ids,
        attention_mask=batch.prompt_mask,
        position_ids=_positions(batch.prompt_mask),
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    cache.reorder_cache(index)  # type: ignore[arg-type]  # one copy of each prompt's keys and values per sample (differentiable)
    prompt_lengths = batch.prompt_mask.sum(dim=1)[index]
    completion_output = model(
        input_ids=batch.completion_ids,
        attention_mask=torch.cat([batch.prompt_mask[index], batch.completion_mask], dim=1),
        position_ids=_positions(torch.ones_like(batch.completion_mask), prompt_lengths),
        past_key_values=cache,
        use_cache=True,
    )
    return torch.cat([prompt_output.logits[index, -1:, :], completion_output.logits[:, :-1, :]], dim=1)


def _can_share_prompts(model: torch.nn.Module, batch: Batch) -> bool:
    inner = getattr(model, "module", model)  # DistributedDataParallel
    if inner is not model or getattr(inner, "is_gradient_checkpointing", False):
        # DDP expects one forward per backward, and checkpointed models drop the cache in training.
        return False
    return batch.num_prompts < batch.num_sequences


def token_logprobs(
    model: torch.nn.Module, batch: Batch, with_entropy: bool = True, share_prompts: bool | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities `[B, Lc]` of `batch.completion_ids` under `model`, and their entropies.

    The logits are divided by each sequence's sampling temperature, so the result is the
    log-probability of the distribution the engine sampled from. Only completion positions are
    projected to the vocabulary, and `logsumexp - gather` avoids a second `[B, Lc, V]` log-softmax
    tensor. The entropy (no gradient) is computed row by row to bound the temporary memory.

    Args:
        model: a causal LM (peft or plain transformers), possibly wrapped in DistributedDataParallel.
        batch: from `collate`.
        with_entropy: also return the entropy of each position's distribution.
        share_prompts: run each distinct prompt once and reuse its cache; `None` decides by itself (yes
            when prompts repeat, unless the model is DDP-wrapped or uses gradient checkpointing).
    """
    if share_prompts is None:
        share_prompts = _can_share_prompts(model, batch)
    logits = _shared_prompt_logits(model, batch) if share_prompts else _full_logits(model, batch)
    logits = logits.float() / batch.temperatures[:, None, None]
    picked = torch.gather(logits, -1, batch.completion_ids.unsqueeze(-1)).squeeze(-1)
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
