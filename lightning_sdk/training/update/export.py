"""`Trainer.export_merged`: a standalone model folder with a trained adapter merged in."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lightning_sdk.training.config import TrainerConfig

__all__ = ["export_merged_model_folder"]


def export_merged_model_folder(
    model: str | Path | None, config: TrainerConfig, path: str | Path, adapter: str | Path | None
) -> Path:
    """Load the base model, apply `adapter` (default: the run's final adapter or newest checkpoint), merge,
    and write a folder that transformers and vLLM load without peft. A folder of role adapters (a run with
    `TrainerConfig(roles=...)`) gives one such folder per role, `path/<role>`: one set of merged weights
    cannot hold two roles."""
    from transformers import AutoTokenizer

    from lightning_sdk.engine.adapter_folders import role_adapter_names
    from lightning_sdk.engine.models import resolve_model
    from lightning_sdk.training.update.checkpoint import latest_adapter
    from lightning_sdk.training.update.lora import (
        build_lora_model,
        export_merged_model,
        load_adapter_weights,
        load_base_model,
    )

    adapter_path = Path(adapter) if adapter is not None else _default_adapter(config, latest_adapter)
    resolved = resolve_model(model)
    roles = role_adapter_names(adapter_path)
    peft_model = build_lora_model(load_base_model(resolved.path, "float32"), config, roles or None)
    load_adapter_weights(peft_model, adapter_path)
    tokenizer = AutoTokenizer.from_pretrained(str(resolved.path))
    if not roles:
        return export_merged_model(peft_model, path, tokenizer=tokenizer)
    for role in roles:
        peft_model.set_adapter(role)
        export_merged_model(peft_model, Path(path) / role, tokenizer=tokenizer)
    return Path(path)


def _default_adapter(config: TrainerConfig, latest_adapter: Callable[[str], Path | None]) -> Path:
    if config.run_dir is None:
        raise ValueError(
            "export_merged needs adapter=PATH, or TrainerConfig(run_dir=...) naming a trained run."
        )
    from lightning_sdk.engine.adapter_folders import is_adapter_folder

    # The run's result: the best evaluated adapter where one was kept (`keep_best`), else the last one.
    for name in ("best_adapter", "adapter"):
        final = Path(config.run_dir) / name
        if is_adapter_folder(final):
            return final
    newest = latest_adapter(config.run_dir)
    if newest is None:
        raise FileNotFoundError(f"{config.run_dir} has no adapter yet; train first or pass adapter=PATH.")
    return newest
