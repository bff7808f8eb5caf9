"""A micro-batch packed into one row: each distinct prompt once, then its samples' completions, no padding.

The row for two prompts `P` and `Q`, where `P` has the samples `a` and `b` and `Q` has `c`:

    P P P a a b b b Q Q c c c c

Every token keeps the position it had when the engine sampled it: a prompt's tokens count 0, 1, 2, ...
and each completion continues from its prompt's length, so `a` and `b` both start at 3. The attention rule
replaces the causal one: a token sees the tokens of its own prompt and the earlier tokens of its own
completion, nothing else (`b` does not see `a`; `Q` and `c` see nothing of `P`). With rotary position
embeddings that is exactly the computation of each `prompt + completion` on its own, so the numbers are
those of the padded pass; but each prompt's layers run once for all its samples, and no padding is computed
(the prefix-sharing idea of Prefix Grouper, arXiv 2506.05433, done as one attention mask).

It is one forward pass with no cache, so it runs under gradient checkpointing and DistributedDataParallel.
Each position `q` may attend to two ranges of the row, `[prompt_start, prompt_stop)` and `[own_start, q]`
(for a prompt token the first range is empty and the second starts at its prompt's first token): that is
the whole mask, as plain data. `packed_attention.py` turns it into what the model's attention takes.

A completion token `k` is predicted by the hidden state of the position before it: its prompt's last token
for `k = 0`, its own token `k - 1` after that. `predictors` lists those positions for every real completion
token, flat, with `rows` / `columns` to put each result back in the `[B, Lc]` layout of `batching.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lightning_sdk.training.update.forward.batching import Batch

__all__ = ["PackedRow", "pack"]


@dataclass
class PackedRow:
    """A `Batch` as one row (see the module docstring)."""

    input_ids: torch.Tensor
    """`[1, T]` every distinct prompt once, each followed by its samples' completions."""
    position_ids: torch.Tensor
    """`[1, T]` each token's position in its own `prompt + completion`."""
    prompt_start: torch.Tensor
    """`[T]` where the prompt a token belongs to starts in the row."""
    prompt_stop: torch.Tensor
    """`[T]` the end of the prompt range a token sees besides its own tokens: the prompt's end for a
    completion token, `prompt_start` (an empty range) for a prompt token."""
    own_start: torch.Tensor
    """`[T]` where the token's own sequence starts: its completion's first token, or its prompt's."""
    predictors: torch.Tensor
    """`[N]` for each real completion token of the batch, the row position whose hidden state predicts it."""
    targets: torch.Tensor
    """`[N]` the completion tokens themselves."""
    rows: torch.Tensor
    """`[N]` each completion token's sample (row of `Batch.completion_ids`)."""
    columns: torch.Tensor
    """`[N]` each completion token's column in `Batch.completion_ids`."""

    @property
    def length(self) -> int:
        """Tokens in the row."""
        return int(self.input_ids.shape[1])

    def allowed(self) -> torch.Tensor:
        """The attention rule as a dense `[T, T]` boolean matrix (query, key): True where `query` sees
        `key`. Quadratic in the row's length: for the attention paths that take a dense mask."""
        key = torch.arange(self.length, device=self.input_ids.device)
        query = key[:, None]
        in_prompt = (key >= self.prompt_start[:, None]) & (key < self.prompt_stop[:, None])
        in_own = (key >= self.own_start[:, None]) & (key <= query)
        return in_prompt | in_own


def pack(batch: Batch) -> PackedRow:
    """The packed row of a collated batch. Bookkeeping runs on the CPU (one transfer of small integer
    lists); the tensors are put on the batch's device."""
    prompt_lengths = batch.prompt_mask.sum(dim=1).tolist()
    completion_lengths = batch.completion_mask.sum(dim=1).tolist()
    prompt_ids = batch.prompt_ids.tolist()
    completion_ids = batch.completion_ids.tolist()
    samples_of: list[list[int]] = [[] for _ in prompt_lengths]
    for sample, prompt in enumerate(batch.prompt_index.tolist()):
        samples_of[prompt].append(sample)

    ids: list[int] = []
    positions: list[int] = []
    prompt_start: list[int] = []
    prompt_stop: list[int] = []
    own_start: list[int] = []
    predictors: list[int] = []
    rows: list[int] = []
    columns: list[int] = []
    for prompt, samples in enumerate(samples_of):
        if not samples:
            continue
        start, length = len(ids), prompt_lengths[prompt]
        ids.extend(prompt_ids[prompt][len(prompt_ids[prompt]) - length :])  # prompts are left-padded
        positions.extend(range(length))
        prompt_start.extend([start] * length)
        prompt_stop.extend([start] * length)
        own_start.extend([start] * length)
        last_prompt_token = start + length - 1
        for sample in samples:
            size, first = completion_lengths[sample], len(ids)
            ids.extend(completion_ids[sample][:size])
            positions.extend(range(length, length + size))
            prompt_start.extend([start] * size)
            prompt_stop.extend([start + length] * size)
            own_start.extend([first] * size)
            predictors.extend([last_prompt_token, *range(first, first + size - 1)][:size])
            rows.extend([sample] * size)
            columns.extend(range(size))

    device = batch.completion_ids.device

    def as_tensor(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    flat_rows, flat_columns = as_tensor(rows), as_tensor(columns)
    return PackedRow(
        input_ids=as_tensor(ids)[None],
        position_ids=as_tensor(positions)[None],
        prompt_start=as_tensor(prompt_start),
        prompt_stop=as_tensor(prompt_stop),
        own_start=as_tensor(own_start),
        predictors=as_tensor(predictors),
        targets=batch.completion_ids[flat_rows, flat_columns],
        rows=flat_rows,
        columns=flat_columns,
    )
