"""Samples to padded tensors, grouped into micro-batches by a token budget.

A batch keeps prompts and completions apart: the distinct prompts of the batch, left-padded so they
end together, and one right-padded completion per sample. The `group_size` episodes of a task share
their first prompt, so a micro-batch of one group holds one prompt and eight completions; the prompt
then goes through the model once and its key/value cache is reused by every completion (the gradient
flows back through the shared cache). With the A + B task's shape (47 prompt and 16 completion tokens,
8 samples per prompt) that is about 2.4 times less CPU time for forward + backward than running every
full sequence (`benchmarks/train_step.py`). `logprobs.py` runs the model on a `Batch`.

Per-token tensors are `[B, Lc]`, aligned with `completion_ids`: column `k` is completion token `k`,
predicted by the last prompt position for `k = 0` and by completion position `k - 1` after that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from lightning_sdk.training.algorithm.samples import Sample

__all__ = ["Batch", "batch_tokens", "collate", "micro_batches", "positions"]


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
    staleness: torch.Tensor | None = None
    """`[B]` long, each sample's `staleness` (updates behind the weights being trained)."""
    unit_temperature: bool = False
    """Every sample was sampled at temperature 1: the projection skips dividing the logits by it (a pass
    over `[tokens, vocabulary]` forward and backward; known here, on the host, without a device sync)."""

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
        staleness=torch.tensor([s.staleness for s in samples], dtype=torch.long, device=device),
        unit_temperature=all(s.temperature == 1.0 for s in samples),
    )


def batch_tokens(samples: Sequence[Sample], packed: bool = False) -> int:
    """The tokens one forward pass over `samples` runs, which bound the activations it keeps.

    Padded (`packed=False`): rows x (longest prompt + longest completion). Packed (`packing.py`): each
    distinct prompt once plus every completion, no padding.
    """
    if not samples:
        return 0
    if packed:
        prompts = {tuple(sample.prompt_ids) for sample in samples}
        return sum(len(prompt) for prompt in prompts) + sum(len(sample.completion_ids) for sample in samples)
    prompt = max(len(sample.prompt_ids) for sample in samples)
    completion = max(len(sample.completion_ids) for sample in samples)
    return len(samples) * (prompt + completion)


def micro_batches(
    samples: Sequence[Sample], size: int | None, max_tokens: int | None = None, packed: bool = False
) -> list[list[Sample]]:
    """Split samples into micro-batches of at most `size` sequences (`None`: any number) and `max_tokens`
    tokens of the pass (`batch_tokens`, padded or `packed`).

    Peak memory follows the micro-batch's tokens, so the token budget, not the longest episode, decides
    it; a sample longer than the budget goes alone. Samples with the same prompt are put whole into one
    micro-batch when they fit (they share the prompt's forward pass), else split; similar lengths go
    together, which keeps padding small where there is padding.
    """

    def fits(chunk: list[Sample]) -> bool:
        if size is not None and len(chunk) > size:
            return False
        return max_tokens is None or batch_tokens(chunk, packed) <= max_tokens

    by_prompt: dict[tuple[int, ...], list[Sample]] = {}
    for sample in sorted(samples, key=lambda s: (len(s.prompt_ids), s.prompt_ids, len(s.completion_ids))):
        by_prompt.setdefault(tuple(sample.prompt_ids), []).append(sample)
    chunks: list[list[Sample]] = []
    current: list[Sample] = []
    for group in by_prompt.values():
        if current and not fits(current + group):
            chunks.append(current)
            current = []
        for sample in group:
            if current and not fits([*current, sample]):
                chunks.append(current)
                current = []
            current.append(sample)
    if current:
        chunks.append(current)
    return chunks


def positions(mask: torch.Tensor, offset: torch.Tensor | int = 0) -> torch.Tensor:
    """Position ids: real tokens get 0, 1, 2, ... (plus `offset`) as the engine gave them; left padding
    does not shift them."""
    return (mask.cumsum(dim=1) - 1).clamp(min=0) + (offset if isinstance(offset, int) else offset[:, None])
