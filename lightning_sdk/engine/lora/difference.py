"""The difference between two LoRA adapters, as one LoRA adapter: what an engine that serves merged
weights (`base + merged`) adds to answer as another adapter would (`base + target`).

With the merged update `s_m B_m A_m` and the target's `s_t B_t A_t` on one weight `W`,

    W + s_t B_t A_t  =  (W + s_m B_m A_m)  +  [s_t B_t, -s_m B_m] @ [A_t; A_m]

so the difference is exactly a LoRA update of rank `r_t + r_m`, with the scales folded into B. A merge
engine pins a step's adapter this way: the training rollouts keep the merged weights' speed while an
evaluation of an older step is answered through the (slower) LoRA path. Plain torch: no vLLM needed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from lightning_sdk.engine.lora.folders import ADAPTER_WEIGHTS_FILE
from lightning_sdk.engine.lora.merge import LoraFactors, LoraUpdate, read_lora_adapter

if TYPE_CHECKING:
    import torch

__all__ = ["adapter_difference", "difference_rank", "read_pinnable_adapter", "write_adapter"]

_PEFT_PREFIX = "base_model.model."


def read_pinnable_adapter(adapter_dir: str | os.PathLike[str]) -> LoraUpdate:
    """Read an adapter folder that can be served as a difference to merged weights: low-rank updates of
    linear weights only (a weight replaced outright, peft's `modules_to_save`, has no low-rank form)."""
    if json.loads((Path(adapter_dir) / "adapter_config.json").read_text()).get("fan_in_fan_out"):
        raise ValueError(
            f"The adapter in {adapter_dir} is stored transposed (fan_in_fan_out, GPT-2 style layers), which "
            "a merge engine cannot pin beside its merged weights; use weight_sync='lora'."
        )
    update = read_lora_adapter(Path(adapter_dir))
    if update.replacements:
        names = ", ".join(sorted(update.replacements)[:3])
        raise ValueError(
            f"The adapter in {adapter_dir} replaces whole weights ({names}: peft modules_to_save), which "
            "a merge engine cannot serve beside its merged weights; use weight_sync='lora'."
        )
    return update


def adapter_difference(target: LoraUpdate | None, merged: LoraUpdate | None) -> dict[str, LoraFactors]:
    """Per weight (checkpoint name), the low-rank update that takes `base + merged` to `base + target`
    (`None`: the base weights). Weights on which the two agree exactly are left out, so an adapter pinned
    while it is the merged one has no difference at all (`{}`)."""
    import torch

    wanted = {} if target is None else target.factors
    served = {} if merged is None else merged.factors
    difference: dict[str, LoraFactors] = {}
    for name in sorted(wanted.keys() | served.keys()):
        add, remove = wanted.get(name), served.get(name)
        if add is not None and remove is not None and _same(add, remove):
            continue
        parts_b = [f.b * f.scale for f in (add,) if f is not None]
        parts_b += [-f.b * f.scale for f in (remove,) if f is not None]
        parts_a = [f.a for f in (add, remove) if f is not None]
        difference[name] = LoraFactors(b=torch.cat(parts_b, dim=1), a=torch.cat(parts_a, dim=0), scale=1.0)
    return difference


def difference_rank(target_rank: int, merged_rank: int) -> int:
    """The rank of the difference between adapters of these ranks: what the engine must accept."""
    return target_rank + merged_rank


def write_adapter(factors: dict[str, LoraFactors], folder: str | os.PathLike[str]) -> Path:
    """Write `factors` (keyed by checkpoint weight name, as `read_lora_adapter` gives them) as a peft LoRA
    folder that vLLM loads: every module padded with zero rows to one rank, the scale folded into B
    (`lora_alpha` equal to the rank, so vLLM's `lora_alpha / r` is 1). Returns the folder."""
    import torch
    from safetensors.torch import save_file

    if not factors:
        raise ValueError("No weight differs: there is no adapter to write.")
    rank = max(f.a.shape[0] for f in factors.values())
    tensors: dict[str, torch.Tensor] = {}
    for name, f in factors.items():
        module = _PEFT_PREFIX + name.removesuffix(".weight")
        a, b = _padded(f.a, rank, dim=0), _padded(f.b * f.scale, rank, dim=1)
        tensors[f"{module}.lora_A.weight"] = a.contiguous().to(torch.float32)
        tensors[f"{module}.lora_B.weight"] = b.contiguous().to(torch.float32)
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": rank,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": sorted({name.removesuffix(".weight").rsplit(".", 1)[-1] for name in factors}),
        "use_rslora": False,
        "use_dora": False,
        "fan_in_fan_out": False,
    }
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / ADAPTER_WEIGHTS_FILE))
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return folder


def _same(first: LoraFactors, second: LoraFactors) -> bool:
    import torch

    return (
        first.scale == second.scale
        and first.a.shape == second.a.shape
        and first.b.shape == second.b.shape
        and bool(torch.equal(first.a, second.a))
        and bool(torch.equal(first.b, second.b))
    )


def _padded(tensor: torch.Tensor, rank: int, dim: int) -> torch.Tensor:
    """`tensor` with zeros appended along `dim` up to `rank` (rows of A, columns of B)."""
    import torch

    missing = rank - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor, tensor.new_zeros(shape)], dim=dim)
