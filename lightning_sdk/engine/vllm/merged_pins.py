"""Adapters pinned in a `VLLMEngine` with `weight_sync="merge"`: each served as its difference to the
merged weights, through vLLM's LoRA path, while every other request keeps the merged weights' speed.

A merge engine holds one set of weights, `base + merged`. To answer requests that name a pinned adapter
as `base + pinned` would, the pin is loaded as a LoRA adapter holding `pinned - merged`
(`lightning_sdk.engine.lora.difference`), and written again whenever the merged weights change
(`follow`). While the pinned adapter is the merged one the difference is empty and its requests take
the merged weights as they are, with no LoRA cost. The engine changes the merged weights and the
differences together with no request running, so no request sees one without the other.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path

from lightning_sdk.engine.lora.difference import adapter_difference, read_pinnable_adapter, write_adapter
from lightning_sdk.engine.lora.merge import LoraUpdate
from lightning_sdk.engine.types import WeightVersion
from lightning_sdk.engine.vllm.adapters import ServedAdapters

__all__ = ["MergedPins"]


class MergedPins:
    """The pins of one merge engine: what each answers as, and the difference folder vLLM loaded for it.

    Args:
        adapters: the engine's LoRA requests by name (`ServedAdapters`), which hold the pins.
        max_rank: the engine's `max_lora_rank`: a difference is at most the sum of two adapters' ranks.
    """

    def __init__(self, adapters: ServedAdapters, max_rank: int) -> None:
        self._adapters = adapters
        self._max_rank = max_rank
        self._sources: dict[str, tuple[LoraUpdate | None, WeightVersion]] = {}
        self._folders: dict[str, Path] = {}
        self._root: Path | None = None
        self._written = 0

    def __bool__(self) -> bool:
        return bool(self._sources)

    def pin(
        self, name: str, path: str | Path | None, version: WeightVersion, merged: LoraUpdate | None
    ) -> None:
        """Answer requests naming `name` as `base + adapter(path)` (None: the base weights), as weights
        `version`, given the adapter merged now (`merged`)."""
        source = None if path is None else read_pinnable_adapter(path)
        self._serve(name, source, version, merged)
        self._sources[name] = (source, version)

    def follow(self, merged: LoraUpdate | None) -> None:
        """The merged weights are now `base + merged`: serve every pin's difference to them."""
        for name, (source, version) in self._sources.items():
            self._serve(name, source, version, merged)

    def unpin(self, name: str) -> None:
        """Stop serving `name` (its requests must have ended)."""
        self._sources.pop(name, None)
        self._adapters.unpin(name)
        self._remove_folder(self._folders.pop(name, None))

    def forget(self) -> None:
        """Full weights replaced the merged ones: no pin can be expressed against them any more (the
        engine's adapters were dropped with them)."""
        for name in list(self._sources):
            self.unpin(name)

    def close(self) -> None:
        """Remove every difference folder (the engine shuts down)."""
        self._sources.clear()
        self._folders.clear()
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def _serve(
        self, name: str, source: LoraUpdate | None, version: WeightVersion, merged: LoraUpdate | None
    ) -> None:
        difference = adapter_difference(source, merged)
        rank = max((factors.a.shape[0] for factors in difference.values()), default=0)
        if rank > self._max_rank:
            raise ValueError(
                f"Pinning {name!r} beside the merged weights takes an adapter of rank {rank} (the sum of the "
                f"two adapters' ranks), above the engine's max_lora_rank={self._max_rank}; start the engine "
                f"with max_lora_rank >= {rank}."
            )
        previous = self._folders.pop(name, None)
        if not difference:  # the pinned weights are the merged ones: no adapter on top of them
            self._adapters.pin(name, None, version)
        else:
            folder = write_adapter(difference, self._new_folder(name))
            self._adapters.pin(name, folder, version)  # the new one replaces the old one at once
            self._folders[name] = folder
        self._remove_folder(previous)

    def _new_folder(self, name: str) -> Path:
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="lightning-sdk-pinned-"))
        self._written += 1
        return self._root / f"{name}-{self._written}"

    @staticmethod
    def _remove_folder(folder: Path | None) -> None:
        if folder is not None:  # vLLM read it when the adapter was added; a wake reads the newest one
            with contextlib.suppress(OSError):
                shutil.rmtree(folder)
