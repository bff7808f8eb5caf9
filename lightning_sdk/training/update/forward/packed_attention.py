"""The packed row's attention rule in the form each attention implementation of transformers takes.

transformers passes a ready four-dimensional mask (or a flex-attention `BlockMask`) straight to the
attention function of every layer, so the packed layout needs no change to the model:

- `flex_attention` gets a `BlockMask` built from the rule's two ranges per query (`packing.py`). It keeps
  one entry per 128 x 128 block, and the kernel skips blocks where nothing is seen: a completion's tokens
  are never multiplied against its sibling completions'. The path on GPUs (`TrainerConfig.attention`).
- `sdpa` gets a dense `[1, 1, T, T]` boolean mask (T^2 bytes: 256 MiB at 16k tokens). On a GPU, PyTorch then
  runs its memory-efficient kernel, which computes every block; on a CPU its flash kernel takes the mask.
- `eager` gets the same rule as an additive float mask.

Other implementations (flash-attention's kernels, paged attention) take no mask of this kind; a model that
uses one, or whose attention is not the same everywhere (sliding-window layers) or whose positions are not
rotary, is trained with the padded pass (`packing_problem` says why).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from lightning_sdk.training.update.distributed import unwrap
from lightning_sdk.training.update.forward.packing import PackedRow

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask
    from transformers import PretrainedConfig

__all__ = [
    "FLEX_MIN_HEAD_DIM",
    "PACKED_ATTENTION",
    "attention_implementation",
    "choose_attention",
    "flex_attention_problem",
    "head_dim_problem",
    "packed_attention_mask",
    "packing_problem",
]

logger = logging.getLogger(__name__)

PACKED_ATTENTION = ("flex_attention", "sdpa", "eager")
"""The attention implementations of transformers that take the packed row's mask."""


def choose_attention(requested: str, device: torch.device | str) -> str | None:
    """The attention implementation to load the policy with: `requested`, or for `"auto"` flex attention on a
    GPU where it compiles and runs a backward pass (`flex_attention_problem`), else None (transformers'
    default: SDPA where the model supports it)."""
    if requested != "auto":
        return requested
    device = torch.device(device)
    if device.type != "cuda":
        return None
    problem = flex_attention_problem(device)
    if problem is None:
        return "flex_attention"
    logger.warning("training pass: SDPA with a dense mask instead of flex attention, because %s", problem)
    return None


def flex_attention_problem(device: torch.device) -> str | None:
    """Why flex attention cannot train on `device`, or None: a small compiled forward and backward pass
    with a block mask, so a missing Triton or a compiler error shows once, at start, not mid-run."""
    try:
        import triton  # type: ignore[import-untyped]  # noqa: F401  # flex attention's GPU kernels are generated with it
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as error:
        return f"flex attention is not available ({error})"
    try:
        query = torch.randn(1, 2, 256, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
        mask = create_block_mask(lambda b, h, q, k: q >= k, None, None, 256, 256, device=device)
        output = torch.compile(flex_attention)(query, query, query, block_mask=mask)
        output.float().sum().backward()  # type: ignore[no-untyped-call]
    except Exception as error:  # noqa: BLE001  # any failure means: do not use it
        return f"flex attention failed a test pass on {device} ({type(error).__name__}: {error})"
    return None


FLEX_MIN_HEAD_DIM = 16
"""Flex attention's GPU kernels refuse smaller heads (torch 2.11: "embedding dimension of the query, key,
and value must be at least 16"), seen on the H200 with a test model of head dimension 8."""


def head_dim_problem(model_config: PretrainedConfig) -> str | None:
    """Why flex attention cannot run a model of this transformers config (its head dimension), or None."""
    head_dim = getattr(model_config, "head_dim", None)
    if not isinstance(head_dim, int):
        hidden, heads = (
            getattr(model_config, "hidden_size", None),
            getattr(model_config, "num_attention_heads", None),
        )
        head_dim = hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads else None
    if head_dim is not None and head_dim < FLEX_MIN_HEAD_DIM:
        return f"its head dimension {head_dim} is below flex attention's {FLEX_MIN_HEAD_DIM}"
    return None


def attention_implementation(model: torch.nn.Module) -> str | None:
    """The attention implementation of a transformers model (possibly peft- or DDP-wrapped)."""
    config: PretrainedConfig | None = getattr(unwrap(model, "base"), "config", None)
    value = getattr(config, "_attn_implementation", None)
    return value if isinstance(value, str) else None


def packing_problem(model: torch.nn.Module) -> str | None:
    """Why the packed layout cannot run on `model`, or None when it can."""
    causal = unwrap(model, "base")
    config: PretrainedConfig | None = getattr(causal, "config", None)
    implementation = attention_implementation(model)
    if implementation not in PACKED_ATTENTION:
        return (
            f"its attention implementation {implementation!r} takes no custom mask (packing needs one of "
            f"{', '.join(PACKED_ATTENTION)})"
        )
    layer_types = getattr(config, "layer_types", None) or []
    if any(kind != "full_attention" for kind in layer_types) or getattr(config, "sliding_window", None):
        # A ready mask replaces transformers' own, which is where the window would be applied.
        return "it has sliding-window or other non-full attention layers"
    decoder = getattr(causal, "base_model", None)
    if decoder is None or getattr(decoder, "rotary_emb", None) is None:
        return "its positions are not rotary embeddings taken from position ids"
    return None


def packed_attention_mask(
    row: PackedRow, implementation: str, dtype: torch.dtype
) -> BlockMask | torch.Tensor:
    """The row's attention rule for `implementation` (one of `PACKED_ATTENTION`): a `BlockMask`, a boolean or
    an additive `[1, 1, T, T]` mask."""
    if implementation == "flex_attention":
        return _block_mask(row)
    allowed = row.allowed()[None, None]
    if implementation == "sdpa":
        return allowed
    if implementation == "eager":
        mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
        return mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    raise ValueError(f"attention implementation {implementation!r} takes no packed mask")


def _block_mask(row: PackedRow) -> BlockMask:
    from torch.nn.attention.flex_attention import create_block_mask

    prompt_start, prompt_stop, own_start = row.prompt_start, row.prompt_stop, row.own_start

    def sees(batch: torch.Tensor, head: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        in_prompt = (key >= prompt_start[query]) & (key < prompt_stop[query])
        return in_prompt | ((key >= own_start[query]) & (key <= query))

    # Evaluated densely once per micro-batch ([T, T] booleans, freed before the forward pass), then kept as
    # one entry per 128 x 128 block: plain torch, no compilation to go wrong.
    return create_block_mask(sees, None, None, row.length, row.length, device=row.input_ids.device)
