"""Per-token log-probabilities of a batch's completions under the policy, computed in chunks of tokens.

The vocabulary projection is the largest tensor of a training pass: `[tokens, vocabulary]` logits in
float32 (plus the copy that divides by the temperature, when it is not 1), kept for the backward pass.
For a 2k-token completion of a model with a 150k vocabulary that is over 2 GB per sequence, more than the
rest of the pass for small models. So the decoder's last hidden states are projected `chunk_tokens`
tokens at a time, each chunk under activation checkpointing: its logits exist only while that chunk is
computed, in the forward pass and again in the backward pass, and the pass keeps `[tokens]` log-
probabilities instead of `[tokens, vocabulary]` logits. The numbers are those of projecting everything at
once (the same operations per token); the cost is a second projection of each chunk in the backward pass.

Models whose causal-LM head does more than a linear projection (Gemma 2's logit soft-capping, Cohere's
logit scale), and DistributedDataParallel (whose gradient hooks need the wrapper's own forward), take the
whole-logits path of `batching.py`'s layout instead, which gives the same numbers with more memory.

Per-token tensors are `[B, Lc]`, aligned with `completion_ids` (see `batching.py`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial
from typing import Any, Literal

import torch
from torch.utils.checkpoint import checkpoint

from lightning_sdk.training.algorithm.samples import Sample
from lightning_sdk.training.update.distributed import unwrap
from lightning_sdk.training.update.forward.batching import Batch, micro_batches, positions
from lightning_sdk.training.update.forward.packed_attention import (
    attention_implementation,
    packed_attention_mask,
    packing_problem,
)
from lightning_sdk.training.update.forward.packing import PackedRow, pack

__all__ = [
    "DEFAULT_CHUNK_TOKENS",
    "Layout",
    "default_layout",
    "plan_micro_batches",
    "token_logprobs",
]

logger = logging.getLogger(__name__)

ENTROPY_BLOCK_TOKENS = 512
"""Positions whose entropies are computed at once (a `[512, V]` float32 softmax at a time)."""

DEFAULT_CHUNK_TOKENS = 512
"""Tokens projected to the vocabulary at once (`TrainerConfig.logit_chunk_tokens`): at their peak 16 bytes
per vocabulary entry, 1.2 GiB for Qwen's 152k vocabulary (0.4 GiB for the bundled model's 49k); a 2k-token
completion projected at once would need four times that."""


Layout = Literal["packed", "padded", "cached"]
"""How a batch goes through the model: `packed` (each prompt once and no padding, in one row;
`packing.py`), `padded` (every sample's prompt and completion, padded), `cached` (each prompt once, its
key/value cache copied for every sample; no gradient checkpointing or DistributedDataParallel). All three
give the same numbers."""


def token_logprobs(
    model: torch.nn.Module,
    batch: Batch,
    with_entropy: bool = True,
    layout: Layout | None = None,
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
        layout: how the batch runs (see `Layout`); `None` picks `default_layout`'s. A model that cannot
            take the packed layout runs padded, with one logged line saying why.
        chunk_tokens: tokens projected to the vocabulary at once (see the module docstring); `None`
            projects the whole batch at once.
    """
    chosen = layout or default_layout(model, batch)
    if chosen == "packed" and _cannot_pack(model):
        chosen = "padded"
    if chosen == "packed":
        return _packed_logprobs(model, batch, with_entropy, chunk_tokens)
    share_prompts = chosen == "cached"
    if share_prompts and _uses_cache_badly(model):
        raise ValueError(
            "layout='cached' needs a model without gradient checkpointing or DistributedDataParallel "
            "(they drop or split the shared cache); use 'packed' or 'padded'"
        )
    parts = _decoder_and_head(model)
    if parts is None or chunk_tokens is None:
        logits = _shared_prompt_logits(model, batch) if share_prompts else _full_logits(model, batch)
        return _project(logits, batch.completion_ids, _temperatures(batch), with_entropy)
    decoder, head = parts
    hidden = _shared_prompt_hidden(decoder, batch) if share_prompts else _full_hidden(decoder, batch)
    return _chunked(head, hidden, batch, with_entropy, chunk_tokens)


def default_layout(model: torch.nn.Module, batch: Batch | None = None) -> Layout:
    """The layout a batch of `model` runs in when none is given: the one rule, read both by `token_logprobs`
    (with the batch) and by `plan_micro_batches` (without one, before the micro-batches exist).

    On a GPU, packed for every batch; a model that cannot pack runs padded, with one logged line saying
    why. On a CPU there is no flex-attention backward pass, and the dense mask makes the packed row's
    attention quadratic in the whole row (every completion against its siblings' tokens too): prompts
    that repeat share a key/value cache instead where the model keeps one (no gradient checkpointing, no
    DistributedDataParallel), 16-27% less time than packed on the bundled model; where it does not, packed
    (2.3 times less than padded), or padded where the model cannot pack; samples that share no prompt run
    padded (`benchmarks/train_step.py`). So on a CPU the layout depends on the batch, and without one the
    answer is padded: its tokens bound those of every layout, so micro-batches planned by it fit whichever
    one a batch then takes.
    """
    if next(model.parameters()).device.type != "cpu":
        return "padded" if _cannot_pack(model) else "packed"
    if batch is None or batch.num_prompts == batch.num_sequences:
        return "padded"
    if not _uses_cache_badly(model):
        return "cached"
    return "packed" if packing_problem(model) is None else "padded"


def plan_micro_batches(
    model: torch.nn.Module, samples: Sequence[Sample], size: int | None, max_tokens: int | None
) -> list[list[Sample]]:
    """`micro_batches` for the layout `model` runs them in (`default_layout` without a batch). Where it
    packs (a GPU), `max_tokens` counts packed tokens and alone bounds a micro-batch (a budget of short
    samples fills it, rather than `size` sequences leaving the GPU idle); elsewhere padded tokens and
    `size` sequences do."""
    packed = default_layout(model) == "packed"
    limit = None if packed and max_tokens is not None else size
    return micro_batches(samples, limit, max_tokens, packed=packed)


_told: set[str] = set()


def _cannot_pack(model: torch.nn.Module) -> bool:
    problem = packing_problem(model)
    if problem is not None and problem not in _told:
        _told.add(problem)
        logger.warning("training pass: each sample runs padded, not packed, because %s", problem)
    return problem is not None


def _packed_logprobs(
    model: torch.nn.Module, batch: Batch, with_entropy: bool, chunk_tokens: int | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    row = pack(batch)
    if row.predictors.numel() == 0:  # every completion is empty: nothing to predict
        empty = batch.completion_ids.new_zeros(batch.completion_ids.shape, dtype=torch.float32)
        return empty, empty.clone() if with_entropy else None
    implementation = attention_implementation(model) or "sdpa"
    # One sequence is plain causal attention: no mask, so SDPA may take its causal (flash) kernels.
    one_sequence = batch.num_sequences == 1
    mask = (
        None if one_sequence else packed_attention_mask(row, implementation, next(model.parameters()).dtype)
    )
    temperatures = None if batch.unit_temperature else batch.temperatures[row.rows]
    parts = _decoder_and_head(model)
    if parts is None or chunk_tokens is None:
        # Through the model's own forward (DistributedDataParallel's hooks, heads that do more than
        # project): only the predicting positions are projected.
        kept, inverse = torch.unique(row.predictors, return_inverse=True)
        output = model(
            input_ids=row.input_ids,
            attention_mask=mask,
            position_ids=row.position_ids,
            logits_to_keep=kept,
            use_cache=False,
        )
        flat, entropy = _project(output.logits[0, inverse], row.targets, temperatures, with_entropy)
    else:
        decoder, head = parts
        output = decoder(
            input_ids=row.input_ids, attention_mask=mask, position_ids=row.position_ids, use_cache=False
        )
        arguments = (row.predictors, row.targets, temperatures)
        flat, entropy = _chunked_flat(
            head, output.last_hidden_state[0], *arguments, with_entropy, chunk_tokens
        )
    shape = tuple(batch.completion_ids.shape)
    return _unflatten(flat, row, shape), None if entropy is None else _unflatten(entropy, row, shape)


def _unflatten(flat: torch.Tensor, row: PackedRow, shape: tuple[int, ...]) -> torch.Tensor:
    """Flat per-token values back into the `[B, Lc]` layout (0 at padding)."""
    return flat.new_zeros(shape).index_put((row.rows, row.columns), flat)


def _chunked_flat(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    predictors: torch.Tensor,
    targets: torch.Tensor,
    temperatures: torch.Tensor | None,
    with_entropy: bool,
    chunk_tokens: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`_chunked` for the packed row: `hidden` is `[T, H]`, and each chunk gathers its predicting positions
    inside the checkpointed projection, so no `[N, H]` copy is kept for the backward pass either."""
    logprobs, entropies = [], []
    for start in range(0, int(predictors.shape[0]), chunk_tokens):
        piece = slice(start, start + chunk_tokens)
        scale = None if temperatures is None else temperatures[piece]
        chunk, entropy = _project_chunk(head, with_entropy, hidden, targets[piece], scale, predictors[piece])
        logprobs.append(chunk)
        entropies.append(entropy)
    return torch.cat(logprobs), torch.cat(entropies) if with_entropy else None


def _project_chunk(
    head: torch.nn.Module,
    with_entropy: bool,
    hidden: torch.Tensor,
    ids: torch.Tensor,
    temperatures: torch.Tensor | None,
    positions: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk's log-probabilities of `ids` (and entropies, without gradient; a 0-d zero without them)
    under `head(hidden)`, or `head(hidden[positions])` where the chunk gathers its predicting positions.
    Under autograd checkpointed, so its logits are recomputed in the backward pass instead of kept."""
    project = partial(_head_logprobs, head, with_entropy)
    if torch.is_grad_enabled() and hidden.requires_grad:
        result: tuple[torch.Tensor, torch.Tensor] = checkpoint(
            project, hidden, ids, temperatures, positions, use_reentrant=False
        )
        return result
    return project(hidden, ids, temperatures, positions)


def _head_logprobs(
    head: torch.nn.Module,
    with_entropy: bool,
    hidden: torch.Tensor,
    ids: torch.Tensor,
    temperatures: torch.Tensor | None,
    positions: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = head(hidden if positions is None else hidden[positions])
    logprobs, entropy = _project(logits, ids, temperatures, with_entropy)
    return logprobs, entropy if entropy is not None else logprobs.new_zeros(())


def _decoder_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """The decoder body and the vocabulary projection of a causal LM whose logits are `head(hidden)`."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return None  # its gradient sync hooks run only through the wrapper's forward
    causal = unwrap(model, "base")
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
        columns = slice(start, start + step)
        chunk, entropy = _project_chunk(
            head, with_entropy, hidden[:, columns], batch.completion_ids[:, columns], _temperatures(batch)
        )
        logprobs.append(chunk)
        entropies.append(entropy)
    entropy_all = torch.cat(entropies, dim=1) if with_entropy else None
    return torch.cat(logprobs, dim=1), entropy_all


def _temperatures(batch: Batch) -> torch.Tensor | None:
    """The batch's temperatures, or None when every one is 1 (nothing to divide by)."""
    return None if batch.unit_temperature else batch.temperatures


def _project(
    logits: torch.Tensor, ids: torch.Tensor, temperatures: torch.Tensor | None, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities of `ids` (`[B, L]` or flat `[N]`) under `logits` (`[..., V]`) divided by
    `temperatures` (one per row, `[B]` or `[N]`; None: all 1), and the entropies of those distributions.

    Every operation here runs over the whole `[tokens, vocabulary]` chunk, so each one counts: the entropy
    reuses the log-partition the log-probabilities computed (`H = lse - sum p x` with `p = exp(x - lse)`),
    rather than a softmax and a second `logsumexp`."""
    logits = logits.float()
    if temperatures is not None:
        logits = logits / temperatures.reshape(-1, *([1] * (logits.dim() - 1)))
    picked = torch.gather(logits, -1, ids.unsqueeze(-1)).squeeze(-1)
    partition = torch.logsumexp(logits, dim=-1)
    logprobs = picked - partition
    if not with_entropy:
        return logprobs, None
    with torch.no_grad():
        # In blocks of positions: one block's probabilities at a time bound the temporary memory.
        flat = logits.detach().reshape(-1, logits.shape[-1])
        lse = partition.detach().reshape(-1)
        blocks = []
        size = ENTROPY_BLOCK_TOKENS
        for block, block_lse in zip(torch.split(flat, size), torch.split(lse, size), strict=True):
            probabilities = torch.exp(block - block_lse.unsqueeze(-1))
            blocks.append(block_lse - (probabilities * block).sum(-1))
        return logprobs, torch.cat(blocks).reshape(logprobs.shape)


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


def _shared_prompt_passes(module: torch.nn.Module, batch: Batch, **prompt_options: int) -> tuple[Any, Any]:
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


def _uses_cache_badly(model: torch.nn.Module) -> bool:
    inner = unwrap(model)  # not `model` under DistributedDataParallel
    return inner is not model or bool(getattr(inner, "is_gradient_checkpointing", False))
