"""Per-token log-probabilities of a batch's completions under the policy, computed in chunks of tokens.

The vocabulary projection is the largest tensor of a training pass: `[tokens, vocabulary]` logits in
float32 (plus the copy that divides by the temperature), kept for the backward pass. For a 2k-token
completion of a model with a 150k vocabulary that is over 2 GB per sequence, more than the rest of the
pass for small models. So the decoder's last hidden states are projected `chunk_tokens` tokens at a time,
each chunk under activation checkpointing: its logits exist only while that chunk is computed, in the
forward pass and again in the backward pass, and the pass keeps `[tokens]` log-probabilities instead of
`[tokens, vocabulary]` logits. The numbers are those of projecting everything at once (the same operations
per token); the cost is a second projection of each chunk in the backward pass.

Models whose causal-LM head does more than a linear projection (Gemma 2's logit soft-capping, Cohere's
logit scale), and DistributedDataParallel (whose gradient hooks need the wrapper's own forward), take the
whole-logits path of `batching.py`'s layout instead, which gives the same numbers with more memory.

Per-token tensors are `[B, Lc]`, aligned with `completion_ids` (see `batching.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from lightning_sdk.training.update.batching import Batch, positions

__all__ = ["DEFAULT_CHUNK_TOKENS", "token_logprobs"]

DEFAULT_CHUNK_TOKENS = 512
"""Tokens projected to the vocabulary at once (`TrainerConfig.logit_chunk_tokens`): at their peak 16 bytes
per vocabulary entry, 1.2 GiB for Qwen's 152k vocabulary (0.4 GiB for the bundled model's 49k); a 2k-token
completion projected at once would need four times that."""


def token_logprobs(
    model: torch.nn.Module,
    batch: Batch,
    with_entropy: bool = True,
    share_prompts: bool | None = None,
    chunk_tokens: int | None = DEFAULT_CHUNK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities `[B, Lc]` of `batch.completion_ids` under `model`, and their entropies.

    The logits are divided by each sequence's sampling temperature, so the result is the
    log-probability of the distribution the engine sampled from; `logsumexp - gather` avoids a
    log-softmax tensor. The entropy carries no gradient.

    Args:
        model: a causal LM (peft or plain transformers), possibly wrapped in DistributedDataParallel.
        batch: from `collate`.
        with_entropy: also return the entropy of each position's distribution.
        share_prompts: run each distinct prompt once and reuse its cache; `None` decides by itself (yes
            when prompts repeat, unless the model is DDP-wrapped or uses gradient checkpointing).
        chunk_tokens: tokens projected to the vocabulary at once (see the module docstring); `None`
            projects the whole batch at once.
    """
    if share_prompts is None:
        share_prompts = _can_share_prompts(model, batch)
    parts = _decoder_and_head(model)
    if parts is None or chunk_tokens is None:
        logits = _shared_prompt_logits(model, batch) if share_prompts else _full_logits(model, batch)
        return _project(logits, batch.completion_ids, batch.temperatures, with_entropy)
    decoder, head = parts
    hidden = _shared_prompt_hidden(decoder, batch) if share_prompts else _full_hidden(decoder, batch)
    return _chunked(head, hidden, batch, with_entropy, chunk_tokens)


def _decoder_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """The decoder body and the vocabulary projection of a causal LM whose logits are `head(hidden)`."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return None  # its gradient sync hooks run only through the wrapper's forward
    get_base: Callable[[], Any] | None = getattr(model, "get_base_model", None)  # peft
    causal: Any = get_base() if get_base is not None else model
    decoder = getattr(causal, "base_model", None)
    output_embeddings = getattr(causal, "get_output_embeddings", None)
    head = output_embeddings() if callable(output_embeddings) else None
    config = getattr(causal, "config", None)
    plain_head = getattr(config, "final_logit_softcapping", None) is None and not hasattr(
        causal, "logit_scale"
    )
    if decoder is None or decoder is causal or head is None or not plain_head:
        return None
    return decoder, head


def _chunked(
    head: torch.nn.Module, hidden: torch.Tensor, batch: Batch, with_entropy: bool, chunk_tokens: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    rows, width = batch.completion_ids.shape
    step = max(1, chunk_tokens // max(rows, 1))  # positions per chunk, across every row of the batch
    logprobs, entropies = [], []
    for start in range(0, width, step):
        arguments = (
            hidden[:, start : start + step],
            batch.completion_ids[:, start : start + step],
            batch.temperatures,
        )
        project = _ChunkProjection(head, with_entropy)
        if torch.is_grad_enabled() and hidden.requires_grad:
            # Recomputed in the backward pass, so this chunk's logits are not kept until then.
            chunk, entropy = checkpoint(project, *arguments, use_reentrant=False)
        else:
            chunk, entropy = project(*arguments)
        logprobs.append(chunk)
        entropies.append(entropy)
    entropy_all = torch.cat(entropies, dim=1) if with_entropy else None
    return torch.cat(logprobs, dim=1), entropy_all


class _ChunkProjection:
    """One chunk's log-probabilities (and entropies, without gradient) from its hidden states."""

    def __init__(self, head: torch.nn.Module, with_entropy: bool) -> None:
        self.head, self.with_entropy = head, with_entropy

    def __call__(
        self, hidden: torch.Tensor, ids: torch.Tensor, temperatures: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logprobs, entropy = _project(self.head(hidden), ids, temperatures, self.with_entropy)
        return logprobs, entropy if entropy is not None else logprobs.new_zeros(())


def _project(
    logits: torch.Tensor, ids: torch.Tensor, temperatures: torch.Tensor, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    logits = logits.float() / temperatures[:, None, None]
    picked = torch.gather(logits, -1, ids.unsqueeze(-1)).squeeze(-1)
    logprobs = picked - torch.logsumexp(logits, dim=-1)
    if not with_entropy:
        return logprobs, None
    with torch.no_grad():
        # Row by row: one row's softmax at a time bounds the temporary memory.
        rows = []
        for row_logits in logits.detach():
            probabilities = torch.softmax(row_logits, dim=-1)
            rows.append(torch.logsumexp(row_logits, -1) - (probabilities * row_logits).sum(-1))
        return logprobs, torch.stack(rows)


def _inputs(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    index = batch.prompt_index
    input_ids = torch.cat([batch.prompt_ids[index], batch.completion_ids], dim=1)
    mask = torch.cat([batch.prompt_mask[index], batch.completion_mask], dim=1)
    return input_ids, mask


def _full_hidden(decoder: torch.nn.Module, batch: Batch) -> torch.Tensor:
    input_ids, mask = _inputs(batch)
    output = decoder(input_ids=input_ids, attention_mask=mask, position_ids=positions(mask), use_cache=False)
    width = batch.completion_ids.shape[1]
    # The last prompt position and every completion position but the last predict the completion.
    hidden: torch.Tensor = output.last_hidden_state[:, -(width + 1) : -1, :]
    return hidden


def _full_logits(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    input_ids, mask = _inputs(batch)
    width = batch.completion_ids.shape[1]
    output = model(
        input_ids=input_ids,
        attention_mask=mask,
        position_ids=positions(mask),
        logits_to_keep=width + 1,
        use_cache=False,
    )
    logits: torch.Tensor = output.logits[:, :-1, :]
    return logits


def _shared_prompt_passes(module: torch.nn.Module, batch: Batch, **prompt_options: Any) -> tuple[Any, Any]:
    """Each distinct prompt through `module` once, then every completion on a copy of its prompt's cache
    (the gradient flows back through the shared cache)."""
    from transformers import DynamicCache

    index = batch.prompt_index
    cache = DynamicCache()
    prompt_output = module(
        input_ids=batch.prompt_ids,
        attention_mask=batch.prompt_mask,
        position_ids=positions(batch.prompt_mask),
        past_key_values=cache,
        use_cache=True,
        **prompt_options,
    )
    cache.reorder_cache(index)  # type: ignore[arg-type]  # one copy of each prompt's keys and values per sample
    prompt_lengths = batch.prompt_mask.sum(dim=1)[index]
    completion_output = module(
        input_ids=batch.completion_ids,
        attention_mask=torch.cat([batch.prompt_mask[index], batch.completion_mask], dim=1),
        position_ids=positions(torch.ones_like(batch.completion_mask), prompt_lengths),
        past_key_values=cache,
        use_cache=True,
    )
    return prompt_output, completion_output


def _shared_prompt_hidden(decoder: torch.nn.Module, batch: Batch) -> torch.Tensor:
    prompt, completion = _shared_prompt_passes(decoder, batch)
    last_prompt = prompt.last_hidden_state[batch.prompt_index, -1:, :]
    return torch.cat([last_prompt, completion.last_hidden_state[:, :-1, :]], dim=1)


def _shared_prompt_logits(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    prompt, completion = _shared_prompt_passes(model, batch, logits_to_keep=1)
    return torch.cat([prompt.logits[batch.prompt_index, -1:, :], completion.logits[:, :-1, :]], dim=1)


def _can_share_prompts(model: torch.nn.Module, batch: Batch) -> bool:
    inner = getattr(model, "module", model)  # DistributedDataParallel
    if inner is not model or getattr(inner, "is_gradient_checkpointing", False):
        # DDP expects one forward per backward, and checkpointed models drop the cache in training.
        return False
    return batch.num_prompts < batch.num_sequences
