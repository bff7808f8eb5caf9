"""The LoRA adapters a `VLLMEngine` serves with `weight_sync="lora"`: a default one, and one per role.

A request names the role whose adapter answers it (`SamplingParams.adapter`), or none for the default
adapter. Each role (and the default) has one *served* adapter, which new requests use, and at most one
*retired* adapter: the one served before the last change, kept loaded for requests that started on it and
removed at the next change. vLLM identifies an adapter by an integer id, so every load gets a new id, even
from a folder loaded before (the trainer rewrites the same folder every step).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest

__all__ = ["ServedAdapters", "lora_slots"]


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
    """

    def __init__(
        self,
        write: Callable[[Callable[[Any], Any]], Any],
        call: Callable[[Callable[[Any], Any]], Any],
        max_adapters: int,
    ) -> None:
        self._write, self._call = write, call
        self.max_adapters = max_adapters
        self._served: dict[str | None, LoRARequest] = {}
        self._retired: dict[str | None, LoRARequest] = {}
        self._next_id = 1

    @property
    def roles(self) -> tuple[str, ...]:
        """The roles with an adapter loaded, in the order they were first loaded."""
        return tuple(role for role in self._served if role is not None)

    def request_for(self, role: str | None) -> LoRARequest | None:
        """The LoRA request that answers `role` (None: the default adapter); None: the base weights."""
        return self._served.get(role)

    def load(self, path: str | Path | None, role: str | None) -> None:
        """Serve the adapter folder `path` to `role` from now on (`path=None`: the base weights)."""
        if path is not None and role not in self._served and len(self._served) >= self.max_adapters:
            loaded = ", ".join(repr(name) for name in self._served) or "none"
            raise ValueError(
                f"This engine serves at most {self.max_adapters} adapter(s) at once (loaded: {loaded}); "
                f"start it with max_adapters >= {len(self._served) + 1} to serve role {role!r} too."
            )
        if path is None:
            self._swap(role, None)
        else:
            self._add_and_serve(self._new_request(str(Path(path).resolve()), role), role)

    def clear(self) -> None:
        """Every role back to the base weights (full weights were pushed: no adapter applies on top)."""
        for role in list(self._served):
            self._swap(role, None)

    def reload(self) -> None:
        """Load every served adapter again under a new id (after a level-1 wake, see `VLLMEngine.wake`)."""
        for role, served in list(self._served.items()):
            self._add_and_serve(self._new_request(served.lora_path, role), role)

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
