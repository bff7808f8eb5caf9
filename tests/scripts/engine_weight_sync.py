"""One VLLMEngine in its own process (vLLM supports one per process), through what the trainer does to it:
adapters loaded and reverted, pushes into a sleeping engine, sleep and wake. Prints one JSON object.

Run by tests/test_engine_lora_mode.py and tests/test_engine_merge_pins.py (each mode on the CPU) and
tests/test_gpu.py (both modes on a GPU). Arguments: weight_sync, an adapter folder, the prompt's token ids
as JSON, and optionally the engine's dtype (default "auto")."""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from lightning_sdk.engine import SamplingParams, VLLMEngine, resolve_model
from lightning_sdk.engine.lora.merge import load_safetensors_folder


def main(weight_sync: str, adapter: str, prompt: list[int], dtype: str = "auto") -> dict:
    model = resolve_model(None)
    # max_lora_rank 16: beside merged weights a pin of this rank-8 adapter is a difference of rank 16.
    engine = VLLMEngine(
        model, weight_sync=weight_sync, dtype=dtype, max_lora_rank=16, max_model_len=512, max_adapters=2
    )
    greedy = SamplingParams(temperature=0, max_tokens=12)

    def ask() -> tuple[list[int], object]:
        [result] = engine.generate([prompt], greedy)
        return result.completions[0].token_ids, result.weight_version

    def loaded() -> list[int]:  # adapters vLLM holds (none with LoRA off)
        if not engine.max_adapters:
            return []
        return sorted(engine._loop.call(lambda vllm_engine: vllm_engine.list_loras()))

    report: dict = {"weight_sync": engine.weight_sync, "device": engine.device}
    report["engine_thread_device"] = engine._loop.call(lambda _: _current_device())
    report["base"], _ = ask()
    engine.load_adapter(adapter, version="v1")
    report["adapter"], report["adapter_version"] = ask()
    engine.load_adapter(None, version="base")
    report["reverted"], report["reverted_version"] = ask()
    report["loaded_counts"] = []
    for version in range(4):
        engine.load_adapter(adapter, version=version)
        report["loaded_counts"].append(len(loaded()))
    engine.load_adapter(None, version="base")
    engine.load_adapter(None, version="base again")
    report["loaded_after_base"] = loaded()
    # The trainer's order: the adapter is loaded while the engine sleeps (its weights, which hold the LoRA
    # buffers on a GPU, are woken for it), then the engine wakes for the next rollout, and sleeps and wakes
    # again for evaluations without a new adapter.
    free_awake = _free_gpu_memory()
    engine.sleep()
    report["gpu_memory_freed_by_sleep"] = _free_gpu_memory() - free_awake
    report["asleep"] = sorted(engine.asleep)
    engine.load_adapter(adapter, version="pushed asleep")
    report["asleep_after_push"] = sorted(engine.asleep)
    engine.wake()
    report["pushed_asleep"], report["pushed_asleep_version"] = ask()
    engine.sleep()
    engine.wake()
    report["after_second_wake"], _ = ask()
    report["loaded_after_wakes"] = len(loaded())
    if engine.weight_sync == "lora":
        report["pinned"] = _pinned_adapter(engine, adapter, prompt, loaded)
    else:
        report["pinned"] = _pinned_beside_merged(engine, adapter, prompt, loaded)
    engine.load_adapter(adapter, version="adapter")
    engine.update_weights(load_safetensors_folder(model.path), version="full")
    report["after_full_weights"], report["full_version"] = ask()
    engine.shutdown()
    return report


def _pinned_adapter(engine: VLLMEngine, adapter: str, prompt: list[int], loaded: Any) -> dict:
    """What an evaluation beside training relies on: an adapter pinned under a name of its own answers,
    as its own version, the requests that name it while the served one changes, and across a wake."""
    greedy = SamplingParams(temperature=0, max_tokens=12)

    def ask(name: str | None) -> tuple[list[int], object]:
        [result] = engine.generate([prompt], dataclasses.replace(greedy, adapter=name))
        return result.completions[0].token_ids, result.weight_version

    engine.load_adapter(adapter, version=3)
    engine.pin_adapter("evaluated", adapter, version=3)
    engine.load_adapter(None, version=4)  # the next step's weights (here the base model's)
    report: dict = {"pinned": ask("evaluated"), "served": ask(None)}
    report["pinned_version_for"] = engine.weight_version_for("evaluated")
    engine.sleep()
    engine.load_adapter(None, version=5)
    engine.wake()
    report["pinned_after_wake"] = ask("evaluated")
    engine.load_adapter(adapter, version=6)  # served again: with the pin, every place is taken
    report["loaded_while_pinned"] = len(loaded())
    try:
        engine.pin_adapter("another", adapter, version=6)  # max_adapters=2: the served one and one pin
    except ValueError as error:
        report["no_place"] = str(error)
    engine.unpin_adapter("evaluated")
    report["unpinned"] = ask("evaluated")  # a name no longer pinned names no adapter: the base weights
    report["loaded_after_unpin"] = len(loaded())
    return report


def _pinned_beside_merged(engine: VLLMEngine, adapter: str, prompt: list[int], loaded: Any) -> dict:
    """The same beside merged weights: the pin is served as its difference to whatever is merged, so its
    requests get step 3's tokens and log-probabilities while later steps' different adapters are merged."""
    greedy = SamplingParams(temperature=0, max_tokens=12)

    def ask(name: str | None) -> list[Any]:
        [result] = engine.generate([prompt], dataclasses.replace(greedy, adapter=name))
        return [result.completions[0].token_ids, result.completions[0].logprobs, result.weight_version]

    steps = [_scaled_adapter(adapter, factor) for factor in (-0.5, 0.5)]  # later steps: B scaled
    engine.load_adapter(adapter, version=3)
    report: dict = {"reference": ask(None)}  # step 3's weights, merged
    engine.pin_adapter("evaluated", adapter, version=3)
    report["pinned_while_merged"] = ask("evaluated")  # no difference yet: the merged weights answer
    report["loaded_while_merged"] = len(loaded())
    engine.load_adapter(steps[0], version=4)  # now a difference of rank 16 answers the pin
    report["pinned"], report["served"] = ask("evaluated"), ask(None)
    report["loaded_with_difference"] = len(loaded())
    # Step 5: the new difference is loaded before the old one goes, so it takes vLLM's last LoRA slot,
    # the one vLLM's CPU ops read for requests without an adapter. One batch mixing the evaluation's
    # requests with the training's: each keeps its own weights.
    engine.load_adapter(steps[1], version=5)
    report["pinned_again"], report["served_again"] = ask("evaluated"), ask(None)
    names = ["evaluated", None, None, "evaluated", None]
    mixed = engine.generate([prompt] * len(names), [dataclasses.replace(greedy, adapter=n) for n in names])
    report["mixed"] = [
        [name, r.completions[0].token_ids, r.completions[0].logprobs, r.weight_version]
        for name, r in zip(names, mixed)
    ]
    # A request that arrives while the engine sleeps waits for the wake, and is answered by the pin as it
    # is then: here its difference to weights merged meanwhile.
    engine.sleep()
    with ThreadPoolExecutor(1) as pool:
        queued = pool.submit(ask, "evaluated")
        deadline = time.monotonic() + 30
        while not engine._loop.busy and time.monotonic() < deadline:  # held by the engine until the wake
            time.sleep(0.01)
        report["held_while_asleep"] = engine._loop.busy
        engine.load_adapter(None, version=6)
        engine.load_adapter(steps[0], version=7)
        engine.wake()
        report["queued_while_asleep"] = queued.result(timeout=120)
    engine.sleep()
    engine.load_adapter(None, version=8)  # the base weights merged, while asleep, as the trainer pushes
    engine.wake()
    report["pinned_over_base"], report["base_served"] = ask("evaluated"), ask(None)
    try:
        engine.pin_adapter("another", adapter, version=8)  # max_adapters=2: the merged one and one pin
    except ValueError as error:
        report["no_place"] = str(error)
    engine.unpin_adapter("evaluated")
    report["unpinned"] = ask("evaluated")  # a name no longer pinned: the merged weights (here the base)
    report["loaded_after_unpin"] = len(loaded())
    return report


def _scaled_adapter(adapter: str, factor: float) -> str:
    """A copy of the adapter folder with every B matrix times `factor`: another adapter of the same shape."""
    from safetensors.torch import load_file, save_file

    folder = Path(tempfile.mkdtemp(prefix="scaled-adapter-"))
    tensors = load_file(str(Path(adapter) / "adapter_model.safetensors"))
    scaled = {name: t * factor if ".lora_B." in name else t for name, t in tensors.items()}
    save_file(scaled, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text((Path(adapter) / "adapter_config.json").read_text())
    return str(folder)


def _current_device() -> str:
    import torch

    return f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"


def _free_gpu_memory() -> int:
    import torch

    return torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else 0


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), *sys.argv[4:])))
