"""The LoRA policy: build it with peft, save and load the adapter, export merged weights for the engine.

The trainer keeps one model in memory: the base weights (frozen) plus the LoRA adapter, or one adapter per
role (`TrainerConfig.roles`), each a named peft adapter of the same model. The base model, needed for the
KL term, is the same model with the adapter disabled (`model.disable_adapter()`).

A saved adapter is a folder with `adapter_model.safetensors`; the adapters of roles are saved as a folder
of such folders, one per role, named after it (peft's own layout for named adapters).
"""

from __future__ import annotations

import copy
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from lightning_sdk.engine.lora.folders import ADAPTER_WEIGHTS_FILE, role_adapter_names
from lightning_sdk.engine.placement import auto_dtype
from lightning_sdk.training.update.forward.fused_kernels import apply_fused_kernels
from lightning_sdk.training.update.forward.packed_attention import choose_attention, head_dim_problem

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from lightning_sdk.training.config import TrainerConfig

logger = logging.getLogger(__name__)

__all__ = [
    "ADAPTER_WEIGHTS_FILE",
    "REFERENCE_PREFIX",
    "adapter_parameters",
    "add_reference_adapters",
    "build_lora_model",
    "export_merged_model",
    "load_adapter_weights",
    "load_base_model",
    "merged_state_dict",
    "reference_adapter",
    "resolve_dtype",
    "save_adapter",
    "trained_adapters",
    "uses_gradient_checkpointing",
]


def resolve_dtype(name: str, device: torch.device | str = "cpu") -> torch.dtype:
    """The torch dtype for `name`; `"auto"` follows `lightning_sdk.engine.placement.auto_dtype` (float32 on
    a CPU, bfloat16 on a GPU)."""
    if name == "auto":
        name = auto_dtype(torch.device(device).type)
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in dtypes:
        raise ValueError(f"dtype={name!r} is unknown; use 'auto', 'float32', 'bfloat16' or 'float16'.")
    return dtypes[name]


def load_base_model(
    model_path: str | os.PathLike[str],
    dtype: str = "auto",
    device: torch.device | str = "cpu",
    gguf_file: str | None = None,
    attention: str = "auto",
) -> PreTrainedModel:
    """Load a Hugging Face causal LM folder (as resolved by `lightning_sdk.engine.resolve_model`).

    `attention` is transformers' attention implementation (`TrainerConfig.attention`); `"auto"` is flex
    attention on a GPU where it works, SDPA elsewhere (`packed_attention.choose_attention`).
    """
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"dtype": resolve_dtype(dtype, device)}
    if gguf_file is not None:
        kwargs["gguf_file"] = gguf_file
    chosen = choose_attention(attention, device)
    if chosen == "flex_attention" and attention == "auto":
        from transformers import AutoConfig

        problem = head_dim_problem(AutoConfig.from_pretrained(str(model_path), gguf_file=gguf_file))
        if problem is not None:
            logger.warning(
                "training pass: SDPA with a dense mask instead of flex attention, because %s", problem
            )
            chosen = None
    try:
        model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(
            str(model_path), **kwargs, attn_implementation=chosen
        )
    except (ValueError, ImportError) as error:
        if attention != "auto" or chosen is None:
            raise
        # The model class does not implement flex attention (GPT-2, Falcon, remote code, ...).
        logger.warning("training pass: %s for this model (%s); transformers' default instead", chosen, error)
        model = AutoModelForCausalLM.from_pretrained(str(model_path), **kwargs)
    return model.to(device)  # type: ignore[arg-type,no-any-return]  # transformers types .to as taking a model


def build_lora_model(
    base_model: PreTrainedModel, config: TrainerConfig, adapters: Sequence[str] | None = None
) -> PeftModel:
    """Wrap `base_model` with a fresh LoRA adapter from a `TrainerConfig` (rank, alpha, dropout, targets),
    or with one fresh adapter per name in `adapters` (the roles'), the first one active.

    The LoRA `B` matrices start at zero (peft's default), so the wrapped model starts as the base model.
    """
    from peft import LoraConfig, get_peft_model

    targets = config.lora_target_modules
    lora_config = LoraConfig(
        r=config.lora_rank,
        lora_alpha=config.lora_alpha,  # type: ignore[arg-type]  # peft annotates int; a float scale works
        lora_dropout=config.lora_dropout,
        target_modules=targets if isinstance(targets, str) else list(targets),
        task_type="CAUSAL_LM",
    )
    apply_fused_kernels(base_model, config.fused_kernels)
    checkpointing = uses_gradient_checkpointing(config, base_model.device)
    if checkpointing:
        base_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    names = list(adapters) if adapters else ["default"]
    model = get_peft_model(base_model, lora_config, adapter_name=names[0])
    for name in names[1:]:
        model.add_adapter(name, lora_config)
    model.set_adapter(names[0])
    if checkpointing:
        # The frozen embedding output has no grad; checkpointed blocks need inputs that require one.
        model.enable_input_require_grads()
    return model


def adapter_parameters(model: torch.nn.Module, adapter: str) -> list[torch.nn.Parameter]:
    """The LoRA matrices of one named adapter of a peft model (whether it is active or not)."""
    marker = re.compile(rf"\.lora_[A-Za-z_]+\.{re.escape(adapter)}\.")
    return [parameter for name, parameter in model.named_parameters() if marker.search(name)]


def uses_gradient_checkpointing(config: TrainerConfig, device: torch.device) -> bool:
    """Whether the policy recomputes activations in the backward pass: as set, or for `"auto"` on a GPU."""
    if config.gradient_checkpointing == "auto":
        return device.type == "cuda"
    return bool(config.gradient_checkpointing)


def merged_state_dict(model: PeftModel, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The base model's weights with the active LoRA deltas added, under the Hugging Face checkpoint names.

    These are the names the original checkpoint (and vLLM's `load_weights`) use, e.g.
    `model.layers.0.self_attn.q_proj.weight`. The training model is not modified (no in-place merge).
    Tied weights appear once, as in a saved checkpoint. Tensors of layers without LoRA are detached
    views of the model's own parameters unless `dtype` asks for a conversion: do not modify them.
    """
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    merged: dict[str, torch.Tensor] = {}
    lora_modules = {name: module for name, module in base.named_modules() if isinstance(module, LoraLayer)}
    with torch.no_grad():
        for name, module in lora_modules.items():
            weight = module.get_base_layer().weight
            assert isinstance(weight, torch.Tensor)
            delta = torch.zeros_like(weight)
            for adapter in module.active_adapters:
                if adapter in module.lora_A:
                    delta = delta + module.get_delta_weight(adapter)  # type: ignore[attr-defined]  # on each layer kind
            merged[f"{name}.weight"] = (weight + delta.to(weight.dtype)).detach()
        seen_storage: set[int] = set()
        result: dict[str, torch.Tensor] = {}
        for key, tensor in base.state_dict(keep_vars=False).items():
            if "lora_" in key:
                continue
            clean = key.replace(".base_layer.", ".")
            value = merged.get(clean, tensor.detach())
            if clean not in merged:
                # Tied weights (lm_head = embed_tokens) share storage: keep the first name,
                # as save_pretrained does.
                pointer = value.untyped_storage().data_ptr()
                if pointer in seen_storage:
                    continue
                seen_storage.add(pointer)
            result[clean] = value if dtype is None else value.to(dtype)
    return result


REFERENCE_PREFIX = "reference_"
"""Adapters named so are frozen copies of where a warm-started run began (`add_reference_adapters`):
never trained, saved, pushed or loaded from a checkpoint."""


def trained_adapters(model: PeftModel) -> list[str]:
    """The model's adapters that train (every one but the reference copies)."""
    return [name for name in model.peft_config if not name.startswith(REFERENCE_PREFIX)]


def add_reference_adapters(model: PeftModel, path: str | os.PathLike[str]) -> None:
    """A frozen copy of each trained adapter, loaded from the saved adapter folder `path` (a warm start's
    `init_adapter`): the reference policy of the KL term is where the run started, not the bare base
    model. The active adapter stays the one it was."""
    active = model.active_adapter
    for name in trained_adapters(model):
        reference = REFERENCE_PREFIX + name
        model.add_adapter(reference, copy.deepcopy(model.peft_config[name]))
        _load_one_adapter(model, Path(path) if name == "default" else Path(path) / name, reference)
    model.set_adapter(active)  # only the active adapter's matrices require a gradient


def reference_adapter(model: PeftModel) -> str | None:
    """The reference copy of the active adapter, or None when the model has none (the reference policy
    is then the base model: the adapter switched off)."""
    name = REFERENCE_PREFIX + str(model.active_adapter)
    return name if name in model.peft_config else None


def save_adapter(model: PeftModel, path: str | os.PathLike[str]) -> Path:
    """Write the adapter (`adapter_model.safetensors` + `adapter_config.json`) into the folder `path`; with
    one adapter per role, each in its subfolder. Reference copies are left out."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path), safe_serialization=True, selected_adapters=trained_adapters(model))
    return path


def load_adapter_weights(model: PeftModel, path: str | os.PathLike[str]) -> None:
    """Load adapter weights saved by `save_adapter` into an existing LoRA model of the same shape: one
    adapter, or, for a model with one adapter per role, each role's from its subfolder of `path`."""
    names = trained_adapters(model)
    if names == ["default"]:
        _load_one_adapter(model, Path(path), "default")
        return
    missing = [name for name in names if not (Path(path) / name / ADAPTER_WEIGHTS_FILE).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{path} has no adapter for role(s) {', '.join(missing)} (it has: "
            f"{', '.join(role_adapter_names(path)) or 'none'}); pass the folder of role adapters a run with "
            "these roles wrote."
        )
    for name in names:
        _load_one_adapter(model, Path(path) / name, name)


def _load_one_adapter(model: PeftModel, path: Path, adapter: str) -> None:
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    file = path / ADAPTER_WEIGHTS_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{file} does not exist; pass a folder written by save_adapter.")
    result = set_peft_model_state_dict(model, load_file(str(file)), adapter_name=adapter)
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise ValueError(
            f"The adapter in {path} does not fit this model (unexpected keys such as {unexpected[:3]}); "
            "build the model with the LoRA settings the adapter was trained with."
        )


def export_merged_model(
    model: PeftModel,
    path: str | os.PathLike[str],
    tokenizer: PreTrainedTokenizerBase | None = None,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write a standalone Hugging Face model folder (config, merged safetensors, tokenizer) to `path`.

    The folder loads with `AutoModelForCausalLM.from_pretrained(path)` and with vLLM, without peft.
    """
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    weights = merged_state_dict(model, dtype=dtype)
    save_file(
        {key: value.contiguous() for key, value in weights.items()},
        str(path / "model.safetensors"),
        metadata={"format": "pt"},
    )
    base = cast("PreTrainedModel", model.get_base_model())  # peft types it as any torch module
    config = copy.deepcopy(base.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # a GGUF-loaded config would make loaders look for GGUF weights
    if dtype is not None:
        config.dtype = dtype
    config.save_pretrained(str(path))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(path))
    return path
