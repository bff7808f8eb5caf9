"""The LoRA adapters a `VLLMEngine` serves with `weight_sync="lora"`: a default one, and one per role.

A request names the role whose adapter answers it (`SamplingParams.adapter`), or none for the default
adapter. Each role (and the default) has one *served* adapter, which new requests use, and at most one
*retired* adapter: the one served before the last change, kept loaded for requests that started on it and
removed at the next change. vLLM identifies an adapter by an integer id, so every load gets a new id, even
from a folder loaded before (the trainer rewrites the same folder every step).

A *pinned* adapter is served under a name of its own (`pin`) and stays as it was while the served ones
change: an evaluation of step k's weights goes on answering from them after step k+1's are loaded. It
takes one of the `max_adapters` places until `unpin`, and its weights version stays the one it was
pinned at (`version_of`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_sdk.engine.types import WeightVersion

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest

__all__ = ["ServedAdapters", "lora_slots"]

_BASE_WEIGHTS = object()
"""A pin of the base weights: requests naming it get no adapter, whatever is loaded later."""


def lora_slots(max_adapters: int) -> int:
    """vLLM's `max_loras` for an engine serving `max_adapters` adapters: each with its retired one."""
    return 2 * max(max_adapters, 1)


class ServedAdapters:
    """Which LoRA request answers each role; loads and removes adapters through the engine's loop.

    Args:
        write: runs `function(llm_engine)` between two engine steps, refused while the weights sleep
            (adding an adapter writes its weights into vLLM's LoRA buffers).
        call: runs `function(llm_engine)` between two engine steps.
        max_adapters: most adapters served at once, the default one included.
        merged: the default adapter is merged into the weights (`weight_sync="merge"`): it takes a place,
            and only pins are loaded here.
    """

    def __init__(
        self,
        write: Callable[[Callable[[Any], Any]], Any],
        call: Callable[[Callable[[Any], Any]], Any],
        max_adapters: int,
        merged: bool = False,
    ) -> None:
        self._write, self._call = write, call
        self.max_adapters = max_adapters
        self._places_merged = int(merged)
        self._served: dict[str | None, LoRARequest] = {}
        self._retired: dict[str | None, LoRARequest] = {}
        self._pinned: dict[str, tuple[LoRARequest | object, WeightVersion]] = {}
        """Pinned adapters by name: the request (or `_BASE_WEIGHTS`) and the weights version it answers as."""
        self._next_id = 1

    @property
    def roles(self) -> tuple[str, ...]:
        """The roles with an adapter loaded, in the order they were first loaded."""
        return tuple(role for role in self._served if role is not None)

    def request_for(self, role: str | None) -> LoRARequest | None:
        """The LoRA request that answers `role` (None: the default adapter) or the pinned adapter of that
        name; None: the base weights (also for a name neither served nor pinned)."""
        pinned = self._pinned.get(role) if role is not None else None  # one read: another thread may unpin
        if pinned is not None:
            return None if pinned[0] is _BASE_WEIGHTS else pinned[0]  # type: ignore[return-value]
        return self._served.get(role)

    def version_of(self, name: str | None, current: WeightVersion) -> WeightVersion:
        """The weights version a request naming `name` is answered by: a pinned adapter's own, else
        `current` (the engine's)."""
        pinned = self._pinned.get(name) if name is not None else None
        return pinned[1] if pinned is not None else current

    def pin(self, name: str, path: str | Path | None, version: WeightVersion) -> None:
        """Serve the adapter folder `path` (None: the base weights) to requests naming `name`, as weights
        `version`, until `unpin(name)`; the folder must stay as it is meanwhile (it is read again after a
        wake). Pinning a name again replaces its adapter: a request gets the old pin or the new one, never
        none (the new one is loaded before it replaces the old one, which is removed after)."""
        if name in self._served:
            raise ValueError(f"{name!r} is a role served by this engine; pin under another name.")
        taken = self._places_merged + len(self._served) + len(self._pinned) - (name in self._pinned)
        if path is not None and taken >= self.max_adapters:
            raise ValueError(
                f"This engine serves at most {self.max_adapters} adapter(s) at once, and every place is "
                f"taken; start it with max_adapters >= {taken + 1} to pin {name!r} too."
            )
        request: LoRARequest | object = _BASE_WEIGHTS
        if path is not None:
            request = added = self._new_request(str(Path(path).resolve()), name)
            self._write(lambda engine: engine.add_lora(added))
        previous = self._pinned.get(name)
        self._pinned[name] = (request, version)
        self._remove(previous)

    def unpin(self, name: str) -> None:
        """Stop serving the pinned adapter `name` (its requests must have ended); an unknown name: nothing.
        The name then names no adapter: a request naming it gets the base weights."""
        self._remove(self._pinned.pop(name, None))

    def _remove(self, pinned: tuple[LoRARequest | object, WeightVersion] | None) -> None:
        if pinned is not None and pinned[0] is not _BASE_WEIGHTS:
            request: Any = pinned[0]
            self._call(lambda engine: engine.remove_lora(request.lora_int_id))

    @property
    def pinned(self) -> tuple[str, ...]:
        """The names of the pinned adapters."""
        return tuple(self._pinned)

    def load(self, path: str | Path | None, role: str | None) -> None:
        """Serve the adapter folder `path` to `role` from now on (`path=None`: the base weights)."""
        taken = len(self._served) + len(self._pinned)
        if path is not None and role not in self._served and taken >= self.max_adapters:
            loaded = ", ".join(repr(name) for name in [*self._served, *self._pinned]) or "none"
            raise ValueError(
                f"This engine serves at most {self.max_adapters} adapter(s) at once (loaded: {loaded}); "
                f"start it with max_adapters >= {taken + 1} to serve role {role!r} too."
            )
        if path is None:
            self._swap(role, None)
        else:
            self._add_and_serve(self._new_request(str(Path(path).resolve()), role), role)

    def clear(self) -> None:
        """Every role back to the base weights, and no adapter pinned (full weights were pushed: vLLM
        dropped its adapters, and none applies on top)."""
        for role in list(self._served):
            self._swap(role, None)
        for name in list(self._pinned):
            self.unpin(name)

    def reload(self) -> None:
        """Load every served and pinned adapter again under a new id (after a level-1 wake, see
        `VLLMEngine.wake`)."""
        for role, served in list(self._served.items()):
            self._add_and_serve(self._new_request(served.lora_path, role), role)
        for name, (pinned, version) in list(self._pinned.items()):
            if pinned is not _BASE_WEIGHTS:
                old: Any = pinned
                self.pin(name, old.lora_path, version)

    def _add_and_serve(self, request: LoRARequest, role: str | None) -> None:
        self._write(lambda engine: engine.add_lora(request))
        self._swap(role, request)

    def _new_request(self, path: str, role: str | None) -> LoRARequest:
        from vllm.lora.request import LoRARequest

        lora_id, self._next_id = self._next_id, self._next_id + 1
        return LoRARequest(f"{role or 'adapter'}-{lora_id}", lora_id, path)

    def _swap(self, role: str | None, request: LoRARequest | None) -> None:
        # The new request replaces the old one in a single assignment: a request submitted meanwhile from
        # another thread gets one adapter or the other, never no adapter.
        previous = self._served.get(role)
        if request is not None:
            self._served[role] = request
        else:
            self._served.pop(role, None)
        stale = self._retired.pop(role, None)
        if previous is not None:
            self._retired[role] = previous
        if stale is not None:
            self._call(lambda engine: engine.remove_lora(stale.lora_int_id))
