"""Read a peft LoRA adapter folder and merge it into model weights (W + scale * B @ A), with plain torch."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = [
    "LoraFactors",
    "LoraUpdate",
    "add_lora",
    "load_safetensors_folder",
    "merge_lora_adapter",
    "read_lora_adapter",
]

_PEFT_PREFIX = "base_model.model."
_MERGE_BLOCK_ROWS = 256  # 256 x 576 float32 = 0.6 MB per block for the bundled model: fits in L2


def load_safetensors_folder(folder: Path, names: Iterable[str] | None = None) -> dict[str, torch.Tensor]:
    """Tensors of a model folder's `*.safetensors` files, on the CPU, named as in the checkpoint.

    `names`: only these tensors (each must exist); `None`: all of them.
    """
    from safetensors import safe_open

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"No *.safetensors files in {folder}; the base weights are needed to merge.")
    wanted = None if names is None else set(names)
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as reader:
            for name in reader.keys():  # noqa: SIM118 - safe_open readers are not iterable
                if wanted is None or name in wanted:
                    weights[name] = reader.get_tensor(name)
    missing = (wanted or set()) - weights.keys()
    if missing:
        raise KeyError(f"The model in {folder} has no weights named {sorted(missing)[:5]}.")
    return weights


@dataclass(frozen=True)
class LoraFactors:
    """The low-rank update of one weight matrix: `W + scale * b @ a` (float32, in W's layout)."""

    b: torch.Tensor
    a: torch.Tensor
    scale: float


@dataclass(frozen=True)
class LoraUpdate:
    """What an adapter changes, keyed by the base checkpoint's weight names."""

    factors: dict[str, LoraFactors]
    """Low-rank updates of linear weights."""
    replacements: dict[str, torch.Tensor]
    """Weights the adapter replaces outright (peft `modules_to_save`)."""


def read_lora_adapter(adapter_dir: str | Path) -> LoraUpdate:
    """Read a peft LoRA adapter folder.

    Supports standard LoRA on linear layers (with `rank_pattern`, `alpha_pattern`, rsLoRA, `fan_in_fan_out`
    and `modules_to_save`). DoRA and LoRA on embeddings raise `NotImplementedError`: use weight_sync="lora".
    """
    adapter_dir = Path(adapter_dir)
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    if config.get("use_dora"):
        raise NotImplementedError("Merging DoRA adapters is not supported; use weight_sync='lora'.")
    tensors = _load_adapter_tensors(adapter_dir)
    replacements = {}
    for key, tensor in tensors.items():
        if ".lora_A." in key or ".lora_B." in key:
            continue
        if "lora_embedding" in key or "lora_magnitude" in key:
            raise NotImplementedError(f"Cannot merge adapter tensor {key!r}; use weight_sync='lora'.")
        replacements[_base_name(key).replace(".modules_to_save.default", "")] = tensor
    factors = {}
    for key in tensors:
        if not key.endswith(".lora_A.weight"):
            continue
        module = key[: -len(".lora_A.weight")]
        lora_a, lora_b = tensors[key].float(), tensors[f"{module}.lora_B.weight"].float()
        scale = _scaling(config, _base_name(module), rank=lora_a.shape[0])
        if config.get("fan_in_fan_out"):  # weights stored transposed (GPT-2 style Conv1D)
            lora_a, lora_b = lora_b.T, lora_a.T
        factors[_base_name(module) + ".weight"] = LoraFactors(lora_b, lora_a, scale)
    return LoraUpdate(factors, replacements)


def add_lora(weight: torch.Tensor, factors: LoraFactors, out: torch.Tensor | None = None) -> torch.Tensor:
    """`weight + scale * b @ a` in float32, rounded once to the dtype of `out` (default: a new tensor).

    Works through blocks of rows, so that each float32 block stays in the CPU cache from the conversion
    through the `addmm_` to the rounding: about 1.5x faster than one whole-matrix `addmm` here, with
    bit-identical results (every element is the same `w + scale * sum_r b * a`).
    """
    import torch

    out = torch.empty_like(weight) if out is None else out
    for start in range(0, weight.shape[0], _MERGE_BLOCK_ROWS):
        rows = slice(start, start + _MERGE_BLOCK_ROWS)
        block = weight[rows].to(torch.float32, copy=True)  # a copy even when weight is float32
        block.addmm_(factors.b[rows], factors.a, alpha=factors.scale)
        out[rows].copy_(block)
    return out


def merge_lora_adapter(
    base: Mapping[str, torch.Tensor], adapter_dir: str | Path, dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """Return `base` with the adapter in `adapter_dir` merged in; `base` itself is not modified.

    `dtype`: the dtype of the tensors the adapter changes (default: each base tensor's own). Give the
    dtype the weights will be served in when it is wider than the stored base (a bfloat16 folder served
    in float32): rounding the merged weight to the narrower dtype first would lose most of a small update.
    """
    update = read_lora_adapter(adapter_dir)
    merged = dict(base)
    for target, tensor in update.replacements.items():
        _require(base, target)
        merged[target] = tensor.to(dtype or base[target].dtype)
    for target, factors in update.factors.items():
        _require(base, target)
        weight = merged[target]
        out = None if dtype is None else weight.new_empty(weight.shape, dtype=dtype)
        merged[target] = add_lora(weight, factors, out=out)
    return merged


def _load_adapter_tensors(adapter_dir: Path) -> dict[str, torch.Tensor]:
    safetensors_file = adapter_dir / "adapter_model.safetensors"
    if safetensors_file.is_file():
        from safetensors.torch import load_file

        return load_file(str(safetensors_file), device="cpu")
    bin_file = adapter_dir / "adapter_model.bin"
    if bin_file.is_file():
        import torch

        state: dict[str, torch.Tensor] = torch.load(bin_file, map_location="cpu", weights_only=True)
        return state
    raise FileNotFoundError(f"{adapter_dir} has no adapter_model.safetensors; is it a peft adapter folder?")


def _base_name(peft_name: str) -> str:
    return peft_name.removeprefix(_PEFT_PREFIX)


def _require(base: Mapping[str, torch.Tensor], target: str) -> None:
    if target not in base:
        raise KeyError(f"The adapter changes {target!r}, which the base model does not have.")


def _scaling(config: dict[str, Any], module: str, rank: int) -> float:
    # peft matches pattern keys against the end of the module name (peft.tuners.tuners_utils).
    alpha = config.get("lora_alpha", 8)
    for pattern, value in (config.get("alpha_pattern") or {}).items():
        if re.match(rf"(.*\.)?({pattern})$", module):
            alpha = value
            break
    return float(alpha) / (math.sqrt(rank) if config.get("use_rslora") else rank)
