"""`Trainer.export_merged`: a standalone model folder with a trained adapter merged in.

Which adapter, by default: the run's result. That is `run_dir/best_adapter`, the adapter of the best
held-out score, where the run kept one (`keep_best`, with a validation set); else `run_dir/adapter`, the
last one; else the newest checkpoint's. A folder that is not whole (a truncated file of a run killed
mid-save by a release before adapters were written whole) is passed over with a warning that says so,
and an adapter named explicitly must be whole. One log line says which adapter was exported and why.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lightning_sdk.training.config import TrainerConfig

__all__ = ["export_merged_model_folder"]

log = logging.getLogger("lightning_sdk.training")


def export_merged_model_folder(
    model: str | Path | None, config: TrainerConfig, path: str | Path, adapter: str | Path | None
) -> Path:
    """Load the base model, apply `adapter` (default: the run's result, see the module docstring), merge,
    and write a folder that transformers and vLLM load without peft. A folder of role adapters (a run with
    `TrainerConfig(roles=...)`) gives one such folder per role, `path/<role>`: one set of merged weights
    cannot hold two roles."""
    from transformers import AutoTokenizer

    from lightning_sdk.engine.lora.folders import role_adapter_names
    from lightning_sdk.engine.models.resolve import resolve_model
    from lightning_sdk.training.update.folders.checkpoint import latest_adapter
    from lightning_sdk.training.update.folders.whole_folders import adapter_problem
    from lightning_sdk.training.update.lora import (
        build_lora_model,
        export_merged_model,
        load_adapter_weights,
        load_base_model,
    )

    if adapter is not None:
        adapter_path = Path(adapter)
        problem = adapter_problem(adapter_path)
        if problem is not None:
            raise ValueError(f"Cannot export {adapter_path}: {problem}. Pass a whole adapter folder.")
        log.info("exporting the adapter in %s (as asked)", adapter_path)
    else:
        adapter_path = _default_adapter(config, latest_adapter)
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
    """The run's result (see the module docstring), logged with which one it is."""
    if config.run_dir is None:
        raise ValueError(
            "export_merged needs adapter=PATH, or TrainerConfig(run_dir=...) naming a trained run."
        )
    from lightning_sdk.engine.lora.folders import is_adapter_folder
    from lightning_sdk.training.update.folders.whole_folders import adapter_problem

    run_dir = Path(config.run_dir)
    newest = latest_adapter(config.run_dir)
    candidates = [
        (run_dir / "best_adapter", _kept_best(run_dir / "best_adapter")),
        (run_dir / "adapter", "the last adapter of the run"),
        *([(newest, "the adapter of the newest checkpoint")] if newest is not None else []),
    ]
    for folder, which in candidates:
        if not is_adapter_folder(folder):
            continue
        problem = adapter_problem(folder)
        if problem is not None:
            log.warning("passing over %s: %s", folder, problem)
            continue
        log.info("exporting %s, in %s", which, folder)
        return folder
    raise FileNotFoundError(f"{config.run_dir} has no whole adapter yet; train first or pass adapter=PATH.")


def _kept_best(folder: Path) -> str:
    """How the log names the kept best adapter: with its step and score, from its `best.json`."""
    try:
        best = json.loads((folder / "best.json").read_text(encoding="utf-8"))
        return (
            f"the kept best adapter (step {int(best['step'])}, validation reward {float(best['score']):.4f}; "
            "keep_best=False or adapter=run_dir/adapter exports the last one)"
        )
    except (OSError, ValueError, KeyError, TypeError):
        return "the kept best adapter (keep_best)"
