"""Adapters pinned in a `VLLMEngine` with `weight_sync="merge"`: each served as its difference to the
merged weights, through vLLM's LoRA path, while every other request keeps the merged weights' speed.

A merge engine holds one set of weights, `base + merged`. To answer requests that name a pinned adapter
as `base + pinned` would, the pin is loaded as a LoRA adapter holding `pinned - merged`
(`lightning_sdk.engine.lora.difference`), and loaded again whenever the merged weights change: the
engine works out every pin's new difference first (refusing what cannot be expressed before any weight
is written), then writes the merged weights and the differences together with no request running
(`load`). While the pinned adapter is the merged one the difference is empty
and its requests take the merged weights as they are, with no LoRA cost.

vLLM loads an adapter again from its folder when a running request still names a removed one, so a
replaced (or unpinned) difference's folder is kept until the next `load`, which runs with no request
in flight, or `close`.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from lightning_sdk.engine.lora.difference import adapter_difference, read_pinnable_adapter, write_adapter
from lightning_sdk.engine.lora.merge import LoraFactors, LoraUpdate, read_lora_adapter
from lightning_sdk.engine.types import WeightVersion
from lightning_sdk.engine.vllm.adapters import ServedAdapters
from lightning_sdk.engine.vllm.merge import MergedAdapterWriter

__all__ = ["MergedPins"]


class MergedPins:
    """The pins of one merge engine: what each answers as, and the folder vLLM loaded its difference from.

    Its methods run on the engine's thread, between steps.

    Args:
        adapters: the engine's LoRA requests by name (`ServedAdapters`), which hold the pins.
        merged: what writes the merged weights, and knows which adapter they hold.
        max_adapters: the engine's places, the merged weights' included.
        max_rank: the engine's `max_lora_rank`: a difference is at most the sum of two adapters' ranks.
    """

    def __init__(
        self, adapters: ServedAdapters, merged: MergedAdapterWriter, max_adapters: int, max_rank: int
    ) -> None:
        self._adapters, self._merged = adapters, merged
        self._max_adapters = max_adapters
        self._max_rank = max_rank
        self._sources: dict[str, tuple[LoraUpdate | None, WeightVersion]] = {}
        self._folders: dict[str, Path] = {}  # the folder each pin's difference was loaded from
        self._retired: list[Path] = []  # folders replaced since the last load, for requests still on them
        self._root: Path | None = None
        self._written = 0

    def __bool__(self) -> bool:
        return bool(self._sources)

    def pin(self, name: str, path: str | Path | None, version: WeightVersion) -> None:
        """Answer requests naming `name` as `base + adapter(path)` (None: the base weights), as weights
        `version`, beside the adapter merged now."""
        if not self._merged.serves_known:
            raise RuntimeError(
                f"Cannot pin {name!r}: the engine serves full weights given to update_weights, not base + "
                "an adapter, so no adapter difference expresses the pin. Load an adapter first."
            )
        taken = 1 + len(self._sources) - (name in self._sources)  # the merged weights hold a place
        if taken >= self._max_adapters:
            raise ValueError(
                f"This engine serves at most {self._max_adapters} adapter(s) at once, the merged weights "
                f"included, and every place is taken; start it with max_adapters >= {taken + 1} to pin "
                f"{name!r} too."
            )
        source = None if path is None else read_pinnable_adapter(path)
        difference = self._difference(name, source, self._merged.served)
        self._serve(name, difference, version)
        self._sources[name] = (source, version)

    def load(self, path: str | Path | None, merged: Callable[[], None]) -> None:
        """Merge the adapter in `path` (None: the base weights) and serve each pin's difference to it; run
        with no request in flight. Every difference is worked out first, so one that cannot be served
        raises before any weight changes; `merged` is called once the weights are written. If a
        difference then fails to load, every pin is dropped (none answers wrongly) and the error raised."""
        update = None if path is None else read_lora_adapter(Path(path))
        differences = {name: self._difference(name, src, update) for name, (src, _) in self._sources.items()}
        while self._retired:  # no request runs now: none can need a replaced folder
            self._remove_folder(self._retired.pop())
        try:
            self._merged.load(path)
            merged()
            for name, difference in differences.items():
                self._serve(name, difference, self._sources[name][1])
        except BaseException:
            self.forget()
            raise

    def unpin(self, name: str) -> None:
        """Stop serving `name`; its folder is kept until `close` or the name is pinned again."""
        self._sources.pop(name, None)
        self._adapters.unpin(name)
        self._retire(name)

    def forget(self) -> None:
        """Full weights replaced the merged ones: no pin can be expressed against them any more (the
        engine's adapters were dropped with them)."""
        for name in list(self._sources):
            self.unpin(name)

    def close(self) -> None:
        """Remove every difference folder (the engine shuts down)."""
        self._sources.clear()
        self._folders.clear()
        self._retired.clear()  # removed with the root
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def _difference(
        self, name: str, source: LoraUpdate | None, merged: LoraUpdate | None
    ) -> dict[str, LoraFactors]:
        if merged is not None and merged.replacements:
            raise ValueError(
                f"Cannot serve the pinned {name!r} beside an adapter that replaces whole weights "
                f"({', '.join(sorted(merged.replacements)[:3])}: peft modules_to_save): no adapter "
                "difference undoes them. Use weight_sync='lora', or unpin first."
            )
        difference = adapter_difference(source, merged)
        rank = max((factors.a.shape[0] for factors in difference.values()), default=0)
        if rank > self._max_rank:
            raise ValueError(
                f"Serving the pinned {name!r} beside the merged weights takes an adapter of rank {rank} (the "
                f"sum of the two adapters' ranks), above the engine's max_lora_rank={self._max_rank}; "
                f"start the engine with max_lora_rank >= {rank}."
            )
        return difference

    def _serve(self, name: str, difference: dict[str, LoraFactors], version: WeightVersion) -> None:
        if not difference:  # the pinned weights are the merged ones: no adapter on top of them
            self._adapters.pin(name, None, version)
            self._retire(name)
            return
        folder = self._new_folder(name)
        try:
            write_adapter(difference, folder)
            self._adapters.pin(name, folder, version)  # the new one replaces the old one at once
        except BaseException:
            self._remove_folder(folder)
            raise
        self._retire(name)
        self._folders[name] = folder

    def _retire(self, name: str) -> None:
        """The pin's current folder is kept for requests that still name it, until the next `load`."""
        current = self._folders.pop(name, None)
        if current is not None:
            self._retired.append(current)

    def _new_folder(self, name: str) -> Path:
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="lightning-sdk-pinned-"))
        self._written += 1
        return self._root / f"pin-{self._written}"  # not named after the pin: any name is safe

    @staticmethod
    def _remove_folder(folder: Path | None) -> None:
        if folder is not None:
            with contextlib.suppress(OSError):
                shutil.rmtree(folder)
