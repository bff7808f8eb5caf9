"""Saved LoRA adapters on disk: one adapter's folder, or a folder of role adapters.

peft writes an adapter as a folder holding `adapter_model.safetensors` and `adapter_config.json`. A model
with one adapter per role (`TrainerConfig.roles`) is saved as a folder with one such subfolder per role,
named after the role (peft's own layout for named adapters): `run/adapter/writer/`, `run/adapter/checker/`.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["ADAPTER_WEIGHTS_FILE", "is_adapter_folder", "role_adapter_names"]

ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
"""The file peft writes (and vLLM's LoRA loader reads) inside an adapter folder."""


def is_adapter_folder(path: str | os.PathLike[str]) -> bool:
    """True for a saved adapter: one adapter's folder, or a folder of role adapters (`role_adapter_names`)."""
    folder = Path(path)
    return (folder / ADAPTER_WEIGHTS_FILE).is_file() or bool(role_adapter_names(folder))


def role_adapter_names(path: str | os.PathLike[str]) -> list[str]:
    """The roles of a folder of role adapters (its subfolders holding an adapter), sorted; [] otherwise."""
    folder = Path(path)
    if not folder.is_dir() or (folder / ADAPTER_WEIGHTS_FILE).is_file():
        return []
    return sorted(child.name for child in folder.iterdir() if (child / ADAPTER_WEIGHTS_FILE).is_file())
