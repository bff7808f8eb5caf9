"""Merged LoRA weights written straight into the in-process vLLM model, one linear layer at a time.

vLLM's generic `reload_weights` rebuilds every layer of the model (all 135M parameters of the bundled
model, embeddings included) on each push, even when an adapter only touches the attention and MLP
projections. An adapter changes a known set of linear layers, so this module writes only those: it keeps
a base copy of just the matrices adapters have targeted, merges `W + scale * B @ A` into the fused layout
vLLM uses (`qkv_proj` = q, k, v stacked; `gate_up_proj` = gate, up), and writes each fused matrix into
its layer in place. Layers changed by the previous adapter and not by the new one get their base weights
back, so every push leaves the model at exactly base + new adapter.

Anything this path cannot express (tensor parallelism, quantized layers, `modules_to_save`, names that
vLLM maps differently) falls back to a full push through `reload_weights`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_sdk.engine.lora.merge import (
    LoraUpdate,
    add_lora,
    load_safetensors_folder,
    merge_lora_adapter,
    read_lora_adapter,
)

if TYPE_CHECKING:
    import torch

__all__ = ["MergedAdapterWriter", "linear_layout", "write_linear_weights"]

Layout = dict[str, tuple[str, tuple[str, ...]]]
"""Checkpoint weight name -> (vLLM module name, checkpoint names of all the module's shards, in order)."""


class MergedAdapterWriter:
    """Serves `base + adapter` in a running vLLM model, rewriting only the layers adapters touch.

    Args:
        model_path: The model folder (its safetensors hold the base weights).
        dtype: The dtype vLLM serves in.
        run_on_worker: Runs `function(worker, *args)` on vLLM's worker, between engine steps.
        push_full: Pushes complete checkpoint weights through vLLM's `reload_weights` (the fallback).
    """

    def __init__(
        self,
        model_path: Path,
        dtype: torch.dtype,
        run_on_worker: Callable[..., Any],
        push_full: Callable[[dict[str, torch.Tensor]], None],
    ) -> None:
        self._model_path = model_path
        self._dtype = dtype
        self._run_on_worker = run_on_worker
        self._push_full = push_full
        self._layout: Layout | None = None
        self._base: dict[str, torch.Tensor] = {}  # fused base weight per vLLM module adapters have touched
        self._shard_rows: dict[str, list[int]] = {}  # rows of each shard in a module's fused weight
        self._changed: set[str] = set()  # modules whose weights currently differ from the base
        self._unknown_state = False  # weights came from elsewhere (`forget_base`): next push is full
        self.served: LoraUpdate | None = None
        """The adapter merged into the weights now (None: the base weights); see `serves_known`."""
        self.serves_known = True
        """False after weights came from elsewhere (`forget_base`), until the next `load`."""

    def load(self, adapter_dir: str | Path | None) -> None:
        """Make the model serve `base + adapter` (`None`: the base weights)."""
        update = None if adapter_dir is None else read_lora_adapter(adapter_dir)
        self.serves_known = False  # until the weights are written
        if self._unknown_state or not self._fits_fast_path(update):
            self._load_full(adapter_dir, update)
        else:
            self._load_fast(update)
        self.served, self.serves_known = update, True

    def _load_fast(self, update: LoraUpdate | None) -> None:
        modules = self._modules(update)
        self._remember_base(modules)
        writes = {module: self._base[module] for module in self._changed - modules.keys()}
        for module, shards in modules.items():
            writes[module] = self._merge_module(module, shards, update.factors)  # type: ignore[union-attr]
        self._unknown_state = True  # until every write has succeeded
        self._run_on_worker(write_linear_weights, writes)
        self._changed, self._unknown_state = set(modules), False

    def forget_base(self) -> None:
        """The model was given arbitrary weights: the next `load` pushes every weight."""
        self._unknown_state = True
        self.served, self.serves_known = None, False

    def _fits_fast_path(self, update: LoraUpdate | None) -> bool:
        return update is None or (
            not update.replacements and update.factors.keys() <= self._get_layout().keys()
        )

    def _modules(self, update: LoraUpdate | None) -> dict[str, tuple[str, ...]]:
        """vLLM modules (and their shards' checkpoint names) that the adapter changes."""
        layout = self._get_layout()
        names = () if update is None else update.factors
        return {layout[name][0]: layout[name][1] for name in names if name in layout}

    def _load_full(self, adapter_dir: str | Path | None, update: LoraUpdate | None) -> None:
        base = load_safetensors_folder(self._model_path)
        self._unknown_state = True  # until the push has succeeded
        self._push_full(base if adapter_dir is None else merge_lora_adapter(base, adapter_dir, self._dtype))
        # Every weight is now base or base + this adapter; the fast path can take over from here unless
        # the adapter changed weights it cannot write back (then the next push is a full one too).
        self._unknown_state = not self._fits_fast_path(update)
        modules = self._modules(update)
        self._remember_base(modules)
        self._changed = set(modules)

    def _merge_module(self, module: str, shards: tuple[str, ...], factors: dict[str, Any]) -> torch.Tensor:
        import torch

        base = self._base[module]
        merged = torch.empty_like(base)
        row = 0
        for name, rows in zip(shards, self._shard_rows[module]):
            if name in factors:
                add_lora(base[row : row + rows], factors[name], out=merged[row : row + rows])
            else:
                merged[row : row + rows].copy_(base[row : row + rows])
            row += rows
        return merged

    def _remember_base(self, modules: dict[str, tuple[str, ...]]) -> None:
        import torch

        missing = {module: shards for module, shards in modules.items() if module not in self._base}
        if not missing:
            return
        names = [name for shards in missing.values() for name in shards]
        tensors = load_safetensors_folder(self._model_path, names)
        for module, shards in missing.items():
            parts = [tensors[name].to(self._dtype) for name in shards]
            self._shard_rows[module] = [part.shape[0] for part in parts]
            self._base[module] = torch.cat(parts) if len(parts) > 1 else parts[0]

    def _get_layout(self) -> Layout:
        if self._layout is None:
            self._layout = self._run_on_worker(linear_layout)
        return self._layout


def linear_layout(worker: Any) -> Layout:
    """On vLLM's worker: the linear layers whose weights `write_linear_weights` can replace."""
    model = worker.model_runner.get_model()
    packed = getattr(model, "packed_modules_mapping", {}) or {}
    layout: Layout = {}
    for module_name, module in model.named_modules():
        if not _writable(module):
            continue
        # With LoRA enabled (adapters pinned beside the merged weights) vLLM wraps each linear layer and
        # keeps it as `<name>.base_layer`: the weights are the wrapped layer's, named after the wrapper.
        prefix, _, leaf = module_name.removesuffix(".base_layer").rpartition(".")
        shards = tuple(f"{prefix}.{shard}.weight" for shard in packed.get(leaf, [leaf]))
        for shard in shards:
            layout[shard] = (module_name, shards)
    return layout


def write_linear_weights(worker: Any, weights: Mapping[str, torch.Tensor]) -> None:
    """On vLLM's worker: replace each named linear layer's (fused) weight matrix, in place."""
    import torch

    model = worker.model_runner.get_model()
    with torch.no_grad():
        for module_name, weight in weights.items():
            _write(model.get_submodule(module_name), weight)


def _writable(module: torch.nn.Module) -> bool:
    from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod

    return (
        isinstance(module, LinearBase)
        and type(module.quant_method) is UnquantizedLinearMethod
        and getattr(module, "tp_size", 1) == 1
    )


def _write(layer: Any, weight: torch.Tensor) -> None:
    import torch

    expected = (layer.output_size_per_partition, layer.input_size_per_partition)
    if tuple(weight.shape) != expected:
        raise ValueError(f"New weight of shape {tuple(weight.shape)} for a layer of shape {expected}.")
    current = layer.weight
    if current.shape == weight.shape:  # the kernels read the parameter itself (GPU; CPU fallback GEMM)
        current.copy_(weight)
        return
    # vLLM's CPU backend packs each weight for its GEMM kernels (oneDNN, or AMX for small matrices) and
    # keeps only the packed copy, leaving `layer.weight` empty (UnquantizedLinearMethod.
    # process_weights_after_loading -> dispatch_cpu_unquantized_gemm). Pack the new weight the same way,
    # then put the emptied parameter object back, as `reload_weights` does: the layer is as before, apart
    # from its new packed kernel weights.
    layer.weight = torch.nn.Parameter(weight, requires_grad=False)
    layer.quant_method.process_weights_after_loading(layer)
    layer.register_parameter("weight", current)
