"""Folders written whole and checked whole: the run's adapters (`adapter/`, `best_adapter/` with its
`best.json`) and checkpoints.

A folder is written under a staging name beside its target and renamed into place once every file in it is
written (`staged_folder`), so a run killed mid-save leaves the previous folder as it was, never a truncated
`adapter_model.safetensors` that export would then prefer. Where Linux can swap two paths in one step
(`renameat2(RENAME_EXCHANGE)`), an existing target is swapped out atomically; elsewhere it is renamed aside
first, and for that instant only the staged copy and the old one exist.

`adapter_problem` says what is wrong with an adapter folder that did not come from here (or from a release
before this one): a missing or unreadable config, or weights shorter than their own header says. Pure
Python, no torch: it reads the safetensors header, not the tensors.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import struct
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lightning_sdk.engine.lora.folders import ADAPTER_WEIGHTS_FILE, role_adapter_names

__all__ = ["ADAPTER_CONFIG_FILE", "adapter_problem", "replace_folder", "staged_folder", "write_text_whole"]

ADAPTER_CONFIG_FILE = "adapter_config.json"
"""The file peft writes beside the weights: the LoRA rank, alpha and target modules."""
_STAGING_PREFIX = ".tmp-"
_OLD_PREFIX = ".old-"


@contextmanager
def staged_folder(target: Path) -> Iterator[Path]:
    """A fresh, empty folder beside `target` to write into; when the block ends without an error it
    replaces `target` (`replace_folder`), else it is removed and `target` stays as it was."""
    target.parent.mkdir(parents=True, exist_ok=True)
    for leftover in target.parent.glob(f"{_STAGING_PREFIX}{target.name}.*"):  # of a run killed mid-save
        shutil.rmtree(leftover, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{_STAGING_PREFIX}{target.name}.", dir=target.parent))
    try:
        yield staging
        staging.chmod(0o755)  # mkdtemp makes it 0700; the folder it replaces was the user's usual mode
        replace_folder(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def replace_folder(staging: Path, target: Path) -> None:
    """Put the folder `staging` at `target` (same file system), replacing a folder already there."""
    if not target.exists():
        staging.rename(target)
        return
    if _exchange(staging, target):  # `staging` now holds the old folder
        shutil.rmtree(staging, ignore_errors=True)
        return
    old = target.with_name(f"{_OLD_PREFIX}{target.name}.{os.getpid()}")
    shutil.rmtree(old, ignore_errors=True)
    target.rename(old)
    staging.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def _exchange(first: Path, second: Path) -> bool:
    """Swap two paths in one step (Linux `renameat2` with `RENAME_EXCHANGE`); False where that is not
    available (another OS, an old C library, a file system without it)."""
    if sys.platform != "linux":
        return False
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2  # <fcntl.h>, <linux/fs.h>
    done = renameat2(at_fdcwd, os.fsencode(first), at_fdcwd, os.fsencode(second), rename_exchange)
    return bool(done == 0)


def write_text_whole(path: Path, text: str) -> None:
    """Write `text` to `path` under a staging name and rename it into place (`os.replace`, atomic)."""
    staging = path.with_name(f"{_STAGING_PREFIX}{path.name}.{os.getpid()}")
    try:
        staging.write_text(text, encoding="utf-8")
        os.replace(staging, path)
    finally:
        staging.unlink(missing_ok=True)


def adapter_problem(path: str | os.PathLike[str]) -> str | None:
    """What makes `path` not a whole adapter folder (one adapter, or one subfolder per role), or None."""
    folder = Path(path)
    if not folder.is_dir():
        return f"{folder} is not a folder"
    roles = role_adapter_names(folder)
    if roles:
        problems = (_one_adapter_problem(folder / role) for role in roles)
        return next((problem for problem in problems if problem is not None), None)
    return _one_adapter_problem(folder)


def _one_adapter_problem(folder: Path) -> str | None:
    config = folder / ADAPTER_CONFIG_FILE
    try:
        if not isinstance(json.loads(config.read_text(encoding="utf-8")), dict):
            return f"{config} is not a JSON object"
    except FileNotFoundError:
        return f"{config} is missing"
    except (OSError, ValueError) as error:
        return f"{config} cannot be read ({error})"
    return _safetensors_problem(folder / ADAPTER_WEIGHTS_FILE)


def _safetensors_problem(file: Path) -> str | None:
    """Whether a safetensors file is as long as its header says (a truncated write is not). The format: an
    8-byte little-endian header length, the JSON header, then the tensors' bytes at their `data_offsets`."""
    try:
        size = file.stat().st_size
        with file.open("rb") as stream:
            prefix = stream.read(8)
            if len(prefix) < 8:
                return f"{file} is truncated ({size} bytes)"
            (header_length,) = struct.unpack("<Q", prefix)
            if 8 + header_length > size:
                return f"{file} is truncated (its header alone is {header_length} bytes; the file is {size})"
            header = json.loads(stream.read(header_length))
    except FileNotFoundError:
        return f"{file} is missing"
    except (OSError, ValueError) as error:
        return f"{file} cannot be read ({error})"
    if not isinstance(header, dict):
        return f"{file} has no valid header"
    ends = [
        entry["data_offsets"][1]
        for name, entry in header.items()
        if name != "__metadata__" and isinstance(entry, dict) and len(entry.get("data_offsets", ())) == 2
    ]
    expected = 8 + header_length + max(ends, default=0)
    if size != expected:
        return f"{file} is {size} bytes where its header says {expected}: it was not written whole"
    return None
