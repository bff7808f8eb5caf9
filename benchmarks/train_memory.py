"""Peak memory of one training pass against sample length, measured on a CPU with real model shapes, beside
the sizing rule's estimate (`lightning_sdk.training.update.memory`).

No hub is needed: the model is built with random weights from the published config of Qwen2.5-0.5B, -1.5B
or -3B-Instruct (the sizes that decide memory; its outputs are meaningless), or is the bundled SmolLM2-135M.
`--dtype bfloat16` builds the weights in bfloat16, as the trainer holds them on a GPU (the LoRA matrices
stay float32, as peft keeps them).
Each point runs in a fresh process: it builds the LoRA policy and its optimizer, then runs one sample of
`--tokens` tokens (a quarter of them completion, as in an agent's call) through `train_on_samples`, and
records how far the peak resident memory rose above what the process held before the pass. Three
configurations of the pass:

- `before`: the whole completion projected to the vocabulary at once, no gradient checkpointing (the pass
  as it was before token chunking);
- `chunked`: log-probabilities in chunks of 1024 tokens;
- `chunked+ckpt`: those chunks and gradient checkpointing (the default on a GPU);
- `chunked-512`: chunks of 512 tokens (`logit_chunk_tokens`' default, and so the default pass on a CPU).

`--layers N` keeps the first N decoder layers (the per-layer terms scale linearly; the estimate is computed
for the same N), so that long samples of a 1.5B shape fit a 2-core machine's time. Usage:

    python benchmarks/train_memory.py --shape qwen2.5-1.5b --layers 4 --tokens 1024 2048 4096 8192
    python benchmarks/train_memory.py --shape smollm2-135m --completion 2048 --repeats 3
    python benchmarks/train_memory.py --shape qwen2.5-3b --layers 4 --dtype bfloat16 --tokens 1024 2048 4096
    python benchmarks/train_memory.py --table   # every stored result, estimates by today's rule, as markdown

Measured on Linux (it reads the resident peak from /proc/self/status).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESULTS = Path(__file__).resolve().parent / "results"
PUBLISHED_SHAPES: dict[str, dict[str, Any]] = {
    # From the models' config.json on the Hub (Qwen/Qwen2.5-*-Instruct).
    "qwen2.5-0.5b": {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    },
    "qwen2.5-1.5b": {
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    },
    "qwen2.5-3b": {
        "hidden_size": 2048,
        "intermediate_size": 11008,
        "num_hidden_layers": 36,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    },
}
GPU_SHAPES: dict[str, dict[str, Any]] = {
    # For the estimates on a GPU only (from the models' config.json on the Hub); not built here.
    "Qwen2.5-1.5B": PUBLISHED_SHAPES["qwen2.5-1.5b"],
    "Llama-3.2-3B": {
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_hidden_layers": 28,
        "num_attention_heads": 24,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "tie_word_embeddings": True,
    },
    "Qwen2.5-7B": {
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "tie_word_embeddings": False,
        "model_type": "qwen2",
    },
}
MODES = {
    "before": (None, False),
    "chunked": (1024, False),
    "chunked+ckpt": (1024, True),
    "chunked-512": (512, False),  # the default since the first measurements
}


def build_policy(
    shape: str, layers: int | None, checkpointing: bool, chunk_tokens: int | None, dtype: str = "float32"
) -> tuple[Any, Any, dict[str, Any]]:
    """The LoRA policy (r16, every projection) and its config dict, its weights in `dtype`, on the CPU."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen2Config

    from lightning_sdk.training.config import TrainerConfig
    from lightning_sdk.training.update.lora import build_lora_model

    if shape == "smollm2-135m":
        from lightning_sdk.engine.models.resolve import resolve_model

        path = resolve_model(None).path
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        config = AutoConfig.from_pretrained(path).to_dict()
    else:
        config = {
            **PUBLISHED_SHAPES[shape],
            "num_hidden_layers": layers or PUBLISHED_SHAPES[shape]["num_hidden_layers"],
        }
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(Qwen2Config(**config), dtype=getattr(torch, dtype))
    trainer_config = TrainerConfig(
        gradient_checkpointing=checkpointing, micro_batch_tokens=None, logit_chunk_tokens=chunk_tokens
    )
    return build_lora_model(model, trainer_config), trainer_config, config


def one_point(point: dict[str, Any]) -> dict[str, Any]:
    """Run one pass in this process; its peak memory above the state before the pass, and its time."""
    import torch

    from lightning_sdk.training.algorithm.samples import Sample
    from lightning_sdk.training.update.optim import build_optimizer, build_scheduler
    from lightning_sdk.training.update.step import train_on_samples

    torch.set_num_threads(os.cpu_count() or 1)
    chunk, checkpointing = MODES[point["mode"]]
    dtype = point.get("dtype", "float32")
    policy, config, model_config = build_policy(
        point["shape"], point.get("layers"), checkpointing, chunk, dtype
    )
    optimizer, completion = build_optimizer(policy, config), point["completion"]
    scheduler = build_scheduler(optimizer, config)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model_config["vocab_size"], (point["prompt"] + completion,), generator=generator)
    sample = Sample(
        ids[: point["prompt"]].tolist(),
        ids[point["prompt"] :].tolist(),
        [1] * completion,
        [None] * completion,
        [1.0] * completion,
    )
    # Building the model peaked higher than it holds now: reset the high-water mark (Linux) so that the
    # pass's own peak is what is measured.
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_bytes("VmRSS")
    started = time.perf_counter()
    train_on_samples(policy, optimizer, scheduler, [sample], config)
    seconds = time.perf_counter() - started
    peak = _status_bytes("VmHWM")
    return {**point, "peak_rise_bytes": peak - before, "seconds": seconds, "model_config": model_config}


def _status_bytes(field: str) -> int:
    """A memory figure of this process from /proc/self/status (kB there), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}: this benchmark needs Linux")


def estimate(result: dict[str, Any]) -> dict[str, float]:
    from lightning_sdk.training.update.memory import ModelShape, estimate_step_memory

    chunk, checkpointing = MODES[result["mode"]]
    memory = estimate_step_memory(
        ModelShape.from_config(result["model_config"]),
        result["prompt"] + result["completion"],
        completion_tokens=result["completion"],
        weight_bytes=2 if result.get("dtype") == "bfloat16" else 4,
        gradient_checkpointing=checkpointing,
        chunk_tokens=chunk,
    )
    # The pass's rise excludes the weights (held before it); the adapter's float32 copy is held too, but its
    # gradient and Adam moments appear during the step: 12 of the 16 bytes per adapter parameter.
    rise = memory.total - memory.weights - memory.adapter * 4 // 16
    return {"estimate_bytes": rise, "logits_bytes": memory.logits, "activations_bytes": memory.activations}


# glibc keeps freed memory below its mmap threshold resident, and raises that threshold (to 32 MiB) as large
# blocks are freed: a pass's resident peak then counts memory no tensor holds any more. A fixed threshold
# of 128 KiB gives every tensor of note its own mapping, returned when the tensor is freed, so the resident
# peak follows the memory tensors really hold (what a GPU's `max_memory_allocated` reports).
MEASURING_ENVIRONMENT = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}


def run_point(point: dict[str, Any]) -> dict[str, Any]:
    command = [sys.executable, __file__, "--one", json.dumps(point)]
    environment = {**os.environ, **MEASURING_ENVIRONMENT}
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=environment)
    if done.returncode != 0:
        return {**point, "error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return {**result, **estimate(result)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="qwen2.5-1.5b", choices=[*PUBLISHED_SHAPES, "smollm2-135m"])
    parser.add_argument("--layers", type=int, default=None, help="decoder layers kept (default: all)")
    parser.add_argument("--tokens", type=int, nargs="*", default=[1024, 2048], help="sample lengths")
    parser.add_argument("--completion", type=int, default=None, help="completion tokens (default: a quarter)")
    parser.add_argument("--modes", nargs="*", default=list(MODES), choices=list(MODES))
    parser.add_argument("--repeats", type=int, default=1, help="runs per point (the time is their median)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="weights' dtype")
    parser.add_argument("--table", action="store_true", help="write results/train_memory.md and stop")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_point(json.loads(args.one))))
        return
    if args.table:
        print(write_table())
        return
    rows = []
    lengths = [args.completion * 2] if args.completion else args.tokens
    for tokens in lengths:
        completion = args.completion or tokens // 4
        for mode in args.modes:
            point = {
                "shape": args.shape,
                "layers": args.layers,
                "prompt": tokens - completion,
                "completion": completion,
                "mode": mode,
                "dtype": args.dtype,
            }
            runs = [run_point(point) for _ in range(args.repeats)]
            row = runs[0]
            if "error" not in row:
                row["seconds"] = statistics.median(run["seconds"] for run in runs)
                row["seconds_all"] = [run["seconds"] for run in runs]
            rows.append(row)
            print(_line(row), flush=True)
    RESULTS.mkdir(exist_ok=True)
    suffix = "" if args.dtype == "float32" else f"_{args.dtype}"
    name = f"train_memory_{args.shape}_{args.layers or 'all'}layers{suffix}.json"
    (RESULTS / name).write_text(
        json.dumps({"cpu": _cpu(), "date": time.strftime("%Y-%m-%d"), "rows": rows}, indent=1)
    )
    print(f"written: benchmarks/results/{name}")


def write_table() -> str:
    """Every stored measurement beside today's estimate, as `results/train_memory.md`; returns the table."""
    lines = [
        "| shape | dtype | layers | tokens (completion) | pass | measured GiB | estimate GiB | error "
        "| seconds | CPU, date |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for path in sorted(RESULTS.glob("train_memory_*.json")):
        stored = json.loads(path.read_text())
        for row in stored["rows"]:
            if "error" in row:
                continue
            row.update(estimate(row))
            measured, estimated = row["peak_rise_bytes"] / 2**30, row["estimate_bytes"] / 2**30
            lines.append(
                f"| {row['shape']} | {row.get('dtype', 'float32')} | {row['layers'] or 'all'} | "
                f"{row['prompt'] + row['completion']} "
                f"({row['completion']}) | {row['mode']} | {measured:.2f} | {estimated:.2f} | "
                f"{estimated / measured - 1:+.0%} | {row['seconds']:.1f} | "
                f"{stored['cpu']}, {stored['date']} |"
            )
    table = "\n".join(lines) + "\n\n" + gpu_estimates()
    (RESULTS / "train_memory.md").write_text(table)
    return table


def gpu_estimates() -> str:
    """The rule's estimate on a GPU (bfloat16, LoRA r16, a quarter of the tokens completion) for published
    shapes, before and after."""
    from lightning_sdk.training.update.memory import GIB, ModelShape, estimate_step_memory

    lines = [
        "| model | tokens per micro-batch | before (whole logits, no checkpointing) | after (chunks, "
        "checkpointing) |",
        "| --- | --- | --- | --- |",
    ]
    for name, config in GPU_SHAPES.items():
        shape = ModelShape.from_config(config)
        for tokens in (2048, 8192, 16384):
            completion = tokens // 4  # as in the measurements: a quarter of a call's tokens
            before = estimate_step_memory(
                shape, tokens, completion_tokens=completion, gradient_checkpointing=False, chunk_tokens=None
            )
            after = estimate_step_memory(shape, tokens, completion_tokens=completion)
            lines.append(
                f"| {name} | {tokens} | {before.total / GIB:.0f} GiB | {after.total / GIB:.0f} GiB |"
            )
    return "\n".join(lines) + "\n"


def _line(row: dict[str, Any]) -> str:
    tokens = row["prompt"] + row["completion"]
    head = f"{row['shape']:<13} layers={row['layers'] or 'all':<4} tokens={tokens:<5} {row['mode']:<13}"
    if "error" in row:
        return f"{head} failed: {row['error']}"
    measured, estimated = row["peak_rise_bytes"] / 2**30, row["estimate_bytes"] / 2**30
    return (
        f"{head} measured {measured:6.2f} GiB  estimate {estimated:6.2f} GiB "
        f"({estimated / measured - 1:+.0%})"
        f"  logits {row['logits_bytes'] / 2**30:5.2f} GiB  {row['seconds']:6.1f} s"
    )


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    main()
