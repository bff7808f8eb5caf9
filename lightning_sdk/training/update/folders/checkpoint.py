"""Checkpoints: adapter, optimizer, scheduler, random states and loop state, written atomically.

Layout: `RUN_DIR/checkpoints/step-00000010/` holding `adapter/` (peft safetensors; with roles, one
subfolder per role), `optimizer.pt`,
`scheduler.pt`, `rng.json` + `rng_torch.pt`, and `trainer_state.json` (the step, the data position and
whatever else the loop passes). A checkpoint is written into a hidden temporary folder and renamed
into place, so a run killed at any moment (even `kill -9` during a save) leaves the previous checkpoint
whole and its adapter usable; half-written folders are ignored and cleaned up.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.lr_scheduler import LRScheduler

from lightning_sdk.engine.lora.folders import is_adapter_folder
from lightning_sdk.training.update.folders.whole_folders import replace_folder
from lightning_sdk.training.update.lora import load_adapter_weights, save_adapter

if TYPE_CHECKING:
    from peft import PeftModel

__all__ = [
    "capture_rng_state",
    "find_latest_checkpoint",
    "latest_adapter",
    "list_checkpoints",
    "load_checkpoint",
    "restore_rng_state",
    "save_checkpoint",
]

_NAME = re.compile(r"^step-(\d{8})$")
STATE_FILE = "trainer_state.json"


def _checkpoints_dir(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / "checkpoints"


def _is_complete(folder: Path) -> bool:
    return (folder / STATE_FILE).is_file() and is_adapter_folder(folder / "adapter")


def list_checkpoints(run_dir: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run as `(step, folder)`, oldest first."""
    folder = _checkpoints_dir(run_dir)
    if not folder.is_dir():
        return []
    found = []
    for child in folder.iterdir():
        match = _NAME.match(child.name)
        if match and child.is_dir() and _is_complete(child):
            found.append((int(match.group(1)), child))
    return sorted(found)


def find_latest_checkpoint(run_dir: str | os.PathLike[str]) -> Path | None:
    """The newest complete checkpoint folder of a run, or `None`."""
    checkpoints = list_checkpoints(run_dir)
    return checkpoints[-1][1] if checkpoints else None


def latest_adapter(run_dir: str | os.PathLike[str]) -> Path | None:
    """The adapter folder of the newest complete checkpoint (loadable with `PeftModel.from_pretrained`)."""
    checkpoint = find_latest_checkpoint(run_dir)
    return checkpoint / "adapter" if checkpoint else None


def capture_rng_state() -> dict[str, Any]:
    """Python, NumPy (when installed) and torch random states."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy
    except ImportError:
        pass
    else:
        state["numpy"] = numpy.random.get_state()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of `capture_rng_state`."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy

        kind, keys, position, has_gauss, cached = state["numpy"]
        numpy.random.set_state((kind, numpy.asarray(keys, dtype=numpy.uint32), position, has_gauss, cached))


def _write_rng(folder: Path) -> None:
    state = capture_rng_state()
    plain = {"python": list(state["python"])}
    if "numpy" in state:
        kind, keys, position, has_gauss, cached = state["numpy"]
        plain["numpy"] = [kind, keys.tolist(), int(position), int(has_gauss), float(cached)]
    (folder / "rng.json").write_text(json.dumps(plain))
    torch.save({key: state[key] for key in ("torch", "cuda") if key in state}, folder / "rng_torch.pt")


def _read_rng(folder: Path) -> dict[str, Any]:
    state: dict[str, Any] = json.loads((folder / "rng.json").read_text())
    state.update(torch.load(folder / "rng_torch.pt", map_location="cpu", weights_only=True))
    return state


def save_checkpoint(
    run_dir: str | os.PathLike[str],
    step: int,
    model: PeftModel,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: LRScheduler | None = None,
    state: dict[str, Any] | None = None,
    keep: int = 3,
) -> Path:
    """Write checkpoint `step` atomically, then delete all but the newest `keep` checkpoints.

    Args:
        run_dir: the run folder; checkpoints go to `run_dir/checkpoints/step-XXXXXXXX`.
        step: the number of completed training steps.
        model: the peft model (only the adapter is saved).
        optimizer: saved with its `state_dict()` when given.
        scheduler: saved with its `state_dict()` when given.
        state: JSON-ready loop state (data position, ...); `step` is added.
        keep: how many checkpoints to keep (at least 1).
    """
    root = _checkpoints_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"step-{step:08d}"
    staging = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-", dir=root))
    try:
        save_adapter(model, staging / "adapter")
        if optimizer is not None:
            torch.save(optimizer.state_dict(), staging / "optimizer.pt")
        if scheduler is not None:
            torch.save(scheduler.state_dict(), staging / "scheduler.pt")
        _write_rng(staging)
        # Written last: a folder without it is never taken for a checkpoint.
        (staging / STATE_FILE).write_text(json.dumps({**(state or {}), "step": step}, indent=2))
        staging.chmod(0o755)
        replace_folder(staging, target)  # saving the same step again (a resume): one whole copy throughout
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _prune(root, keep=max(keep, 1))
    return target


def _prune(root: Path, keep: int) -> None:
    for _, folder in list_checkpoints(root.parent)[:-keep]:
        shutil.rmtree(folder, ignore_errors=True)
    for child in root.iterdir():
        # Leftovers of runs killed mid-save; a live save of this process holds its own fresh folder.
        if child.name.startswith((".tmp-", ".old-")) and child.is_dir() and not _is_recent(child):
            shutil.rmtree(child, ignore_errors=True)


def _is_recent(folder: Path, seconds: float = 3600.0) -> bool:
    return time.time() - folder.stat().st_mtime < seconds


def load_checkpoint(
    checkpoint: str | os.PathLike[str],
    model: PeftModel,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: LRScheduler | None = None,
    restore_rng: bool = True,
) -> dict[str, Any]:
    """Restore a checkpoint into `model` (adapter weights), `optimizer`, `scheduler` and the random
    generators; returns the loop state saved with it (including `step`)."""
    folder = Path(checkpoint)
    if not _is_complete(folder):
        raise FileNotFoundError(
            f"{folder} is not a complete checkpoint (no {STATE_FILE} or adapter); use "
            "find_latest_checkpoint(run_dir) to pick a valid one."
        )
    load_adapter_weights(model, folder / "adapter")
    # Onto the CPU first: tensors saved from rank 0's GPU would otherwise all land on GPU 0 for every rank.
    # The optimizer then moves its state to each parameter's own device.
    if optimizer is not None:
        optimizer.load_state_dict(torch.load(folder / "optimizer.pt", map_location="cpu", weights_only=True))
    if scheduler is not None:
        scheduler.load_state_dict(torch.load(folder / "scheduler.pt", map_location="cpu", weights_only=True))
    if restore_rng:
        restore_rng_state(_read_rng(folder))
    state: dict[str, Any] = json.loads((folder / STATE_FILE).read_text())
    return state
