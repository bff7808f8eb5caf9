"""Run by tests/test_engine_lora_mode.py in its own process: a VLLMEngine with weight_sync="lora" next to the
test session's engine would break it (vLLM supports one engine per process). Prints one JSON object."""

from __future__ import annotations

import json
import sys

from lightning_sdk.engine import SamplingParams, VLLMEngine, resolve_model
from lightning_sdk.engine.lora_merge import load_safetensors_folder


def main(adapter: str, prompt: list[int]) -> dict:
    model = resolve_model(None)
    engine = VLLMEngine(model, weight_sync="lora", max_lora_rank=8, max_model_len=512)
    greedy = SamplingParams(temperature=0, max_tokens=12)

    def ask() -> tuple[list[int], object]:
        [result] = engine.generate([prompt], greedy)
        return result.completions[0].token_ids, result.weight_version

    def loaded() -> list[int]:
        return sorted(engine._loop.call(lambda vllm_engine: vllm_engine.list_loras()))

    report: dict = {"weight_sync": engine.weight_sync}
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
    engine.load_adapter(adapter, version="adapter")
    engine.update_weights(load_safetensors_folder(model.path), version="full")
    report["after_full_weights"], report["full_version"] = ask()
    engine.shutdown()
    return report


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], json.loads(sys.argv[2]))))
