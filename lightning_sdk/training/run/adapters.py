"""The policy's adapter on disk and in the engine: written whole (a staging folder renamed into place, so a
crash mid-save leaves the last whole adapter), and loaded into the engine role by role."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lightning_sdk.engine.types import Engine

__all__ = ["copy_adapter", "load_into_engine", "write_adapter"]


def write_adapter(model: Any, folder: Path, beside: Callable[[Path], None] | None = None) -> Path:
    """`model`'s adapter (every role's, in subfolders, with roles) in `folder`, renamed into place whole;
    `beside(staging)` writes more files into the folder first (`best.json`), so they come and go with it."""
    from lightning_sdk.training.update.folders.whole_folders import staged_folder
    from lightning_sdk.training.update.lora import save_adapter

    with staged_folder(folder) as staging:
        save_adapter(model, staging)
        if beside is not None:
            beside(staging)
    return folder


def copy_adapter(source: Path, folder: Path, beside: Callable[[Path], None] | None = None) -> Path:
    """A copy of the adapter folder `source` in `folder`, renamed into place whole, as `write_adapter`
    does (`keep_best` keeping the adapter an evaluation beside training scored, saved when it began)."""
    import shutil

    from lightning_sdk.training.update.folders.whole_folders import staged_folder

    with staged_folder(folder) as staging:
        shutil.copytree(source, staging, dirs_exist_ok=True)
        if beside is not None:
            beside(staging)
    return folder


def load_into_engine(engine: Engine, folder: Path, step: int, changed_roles: Sequence[str] | None) -> None:
    """The adapter in `folder` into the engine as version `step`; with roles (`changed_roles` not None),
    each changed role's from its subfolder, the others left as they are."""
    if changed_roles is None:
        engine.load_adapter(folder, version=step)
        return
    for role in changed_roles:
        engine.load_adapter(folder / role, version=step, role=role)
