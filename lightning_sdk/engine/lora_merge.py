"""Merge a peft LoRA adapter folder into full model weights (W + scale * B @ A), with plain torch."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["load_safetensors_folder", "merge_lora_adapter"]

_PEFT_PREFIX = "base_model.model."


def load_safetensors_folder(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of a model folder's `*.safetensors` files, on the CPU, named as in the checkpoint."""
    from safetensors.torch import load_file

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"No *.safetensors files in {folder}; the base weights are needed to merge.")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        weights.update(load_file(str(file), device="cpu"))
    return weights


def merge_lora_adapter(base: Mapping[str, torch.Tensor], adapter_dir: str | Path) -> dict[str, torch.Tensor]:
    """Return `base` with the adapter in `adapter_dir` merged in; `base` itself is not modified.

    Supports standard LoRA on linear layers (with `rank_pattern`, `alpha_pattern`, rsLoRA and
    `modules_to_save`). DoRA and LoRA on embeddings raise `NotImplementedError`: use weight_sync="lora".
    """
    import torch

    adapter_dir = Path(adapter_dir)
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    if config.get("use_dora"):
        raise NotImplementedError("Merging DoRA adapters is not supported; use weight_sync='lora'.")
    tensors = _load_adapter_tensors(adapter_dir)
    merged = dict(base)
    for key, tensor in tensors.items():
        if ".lora_A." in key or ".lora_B." in key:
            continue
        if "lora_embedding" in key or "lora_magnitude" in key:
            raise NotImplementedError(f"Cannot merge adapter tensor {key!r}; use weight_sync='lora'.")
        target = _base_name(key).replace(".modules_to_save.default", "")
        _require(base, target, key)
        merged[target] = tensor.to(base[target].dtype)  # modules_to_save: a full replacement
    for key in tensors:
        if not key.endswith(".lora_A.weight"):
            continue
        module = key[: -len(".lora_A.weight")]
        lora_a, lora_b = tensors[key].float(), tensors[f"{module}.lora_B.weight"].float()
        target = _base_name(module) + ".weight"
        _require(base, target, key)
        scale = _scaling(config, _base_name(module), rank=lora_a.shape[0])
        if config.get("fan_in_fan_out"):  # weights stored transposed (GPT-2 style Conv1D)
            lora_a, lora_b = lora_b.T, lora_a.T
        # One fused W + scale * B @ A in fp32, rounded once to the base dtype.
        merged[target] = torch.addmm(merged[target].float(), lora_b, lora_a, alpha=scale).to(
            base[target].dtype
        )
    return merged


def _load_adapter_tensors(adapter_dir: Path) -> dict[str, torch.Tensor]:
    safetensors_file = adapter_dir / "adapter_model.safetensors"
    if safetensors_file.is_file():
        from safetensors.torch import load_file

        return load_file(str(safetensors_file), device="cpu")
    bin_file = adapter_dir / "adapter_model.bin"
    if bin_file.is_file():
        import torch

        return torch.load(bin_file, map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"{adapter_dir} has no adapter_model.safetensors; is it a peft adapter folder?")


def _base_name(peft_name: str) -> str:
    return peft_name.removeprefix(_PEFT_PREFIX)


def _require(base: Mapping[str, torch.Tensor], target: str, key: str) -> None:
    if target not in base:
        raise KeyError(f"Adapter tensor {key!r} targets {target!r}, which the base model does not have.")


def _scaling(config: dict, module: str, rank: int) -> float:
    # peft matches pattern keys against the end of the module name (peft.tuners.tuners_utils).
    alpha = config.get("lora_alpha", 8)
    for pattern, value in (config.get("alpha_pattern") or {}).items():
        if re.match(rf"(.*\.)?({pattern})$", module):
            alpha = value
            break
    return alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)
