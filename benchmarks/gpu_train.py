"""The training pass alone, packed against padded, beside TRL's way and Liger's fused loss: tokens run,
padding, seconds, real tokens/s and peak memory.

Needs torch, transformers and peft only (no vLLM, no Hub): the models are random weights from the
published configs of Qwen2.5-1.5B/3B/7B-Instruct (`--models`), in bfloat16 with a rank-16 LoRA adapter on
every projection, as the trainer holds them on a GPU. Gradient checkpointing as the trainer's "auto"
decides for the longest sample on this machine's memory (`--checkpointing on|off` forces it). Workloads:

- `grpo-step`: 16 samples, two groups of 8 sharing a prompt of 512 and of 1536 tokens, completions of 64
  to 2048 tokens (about 32k real tokens, counting each sample's prompt);
- `grpo-64`: nearer real training, 64 samples, eight groups of 8 with prompts of 1024 to 3712 tokens and
  completions of 64 to 4096 (on a CPU: prompts of 64-288, completions of 8-256);
- `sequence`: one sample of `--sequence-tokens` tokens, a quarter of them completion.

`--profile` also runs one warm step of the packed pass with the optimizer under torch's profiler, on the
first workload, and writes where its time goes by group (attention, LoRA, base matmuls, projection and
loss, optimizer, the rest, host gaps: `benchmarks/step_profile.py`) to `gpu_train_profile_<gpu|cpu>.md`.

Sides, each a forward and backward pass of the GRPO loss (clipped ratio, advantages +-1) over the workload:

- `packed`: `token_logprobs(layout="packed")`, the trainer's pass on a GPU (each prompt once, no padding,
  micro-batches of `--micro-batch-tokens` packed tokens; flex attention where it compiles, else SDPA);
- `padded`: `token_logprobs(layout="padded")`, the pass before packing (micro-batches of 8, padded);
- `trl-way`: TRL's way of computing the loss: micro-batches of 8 padded samples, the model's logits for the
  completion through `logits_to_keep`, log-softmax gather, the clipped ratio;
- `liger`: Liger-Kernel's `LigerFusedLinearGRPOLoss` (sequence x vocabulary chunked) on the decoder's hidden
  states, micro-batches of 8 padded samples (only when `liger-kernel` is installed).

On a machine without CUDA it runs a CPU mode at small shapes (2 layers of the Qwen2.5-0.5B shape, float32,
prompts of 64 and 192 tokens, completions of 8-256, `sequence` at 512 and 1024 tokens),
so the same table's tokens-run and padding columns, and seconds, show on every machine. Usage:

    python benchmarks/gpu_train.py                      # GPU: 1.5b 3b 7b; CPU: the small shapes
    python benchmarks/gpu_train.py --models 7b --workloads sequence --sequence-tokens 16384
    python benchmarks/gpu_train.py --models 7b --workloads grpo-step grpo-64 --profile
    python benchmarks/gpu_train.py --models 7b --workloads grpo-step --checkpointing on

MFU (GPU only) is the FLOPs the step needs (each distinct prompt once, every completion, attention within
each sample: `needed_flops`) per second against the GPU's dense bfloat16 peak, so padding and repeated
prompts lower a side's figure.

Writes `benchmarks/results/gpu_train_<device>.json` and `.md` (`--output` changes the path without suffix).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks.train_memory import GPU_SHAPES, PUBLISHED_SHAPES

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = {
    "0.5b": PUBLISHED_SHAPES["qwen2.5-0.5b"],
    "1.5b": PUBLISHED_SHAPES["qwen2.5-1.5b"],
    "3b": PUBLISHED_SHAPES["qwen2.5-3b"],
    "7b": GPU_SHAPES["Qwen2.5-7B"],
}
GPU_PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}
SIDES = ("packed", "padded", "trl-way", "liger")
PADDED_ROWS = 8  # TRL's per-device batch in the GPU measurements, and our `micro_batch_size`


def completion_lengths(count: int, shortest: int, longest: int) -> list[int]:
    """`count` lengths spread geometrically from `shortest` to `longest`."""
    ratio = (longest / shortest) ** (1 / max(count - 1, 1))
    return [round(shortest * ratio**index) for index in range(count)]


def grpo_step(prompts: tuple[int, ...], group: int, shortest: int, longest: int, vocab: int) -> list[Any]:
    """Groups of `group` samples, one per prompt length, with completions from `shortest` to `longest`."""
    from lightning_sdk.training.algorithm.samples import Sample

    generator = torch.Generator().manual_seed(0)
    samples = []
    for prompt_length in prompts:
        prompt = torch.randint(100, vocab, (prompt_length,), generator=generator).tolist()
        for index, length in enumerate(completion_lengths(group, shortest, longest)):
            completion = torch.randint(100, vocab, (length,), generator=generator).tolist()
            advantage = 1.0 if index % 2 else -1.0
            samples.append(Sample(prompt, completion, [1] * length, [None] * length, [advantage] * length))
    return samples


def one_sequence(tokens: int, vocab: int) -> list[Any]:
    return grpo_step((tokens - tokens // 4,), 1, tokens // 4, tokens // 4, vocab)


def build_policy(shape: dict[str, Any], layers: int | None, on_gpu: bool, checkpointing: bool) -> Any:
    from transformers import AutoModelForCausalLM, Qwen2Config

    from lightning_sdk.training.config import TrainerConfig
    from lightning_sdk.training.update.forward.packed_attention import choose_attention
    from lightning_sdk.training.update.lora import build_lora_model

    device = torch.device("cuda" if on_gpu else "cpu")
    config = Qwen2Config(**{**shape, "num_hidden_layers": layers or shape["num_hidden_layers"]})
    torch.manual_seed(0)
    dtype = torch.bfloat16 if on_gpu else torch.float32
    attention = choose_attention("auto", device)
    # Built on the device itself: random-initialising 7B weights on the host took minutes on the H200's
    # machine (benchmarks/results/gpu_check_h200_2026-11-27.md), on the GPU it takes seconds.
    started = time.perf_counter()
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attention)
    seconds = time.perf_counter() - started
    print(
        f"built {config.num_hidden_layers}-layer policy on {device} in {seconds:.1f} s",
        file=sys.stderr,
        flush=True,
    )
    trainer_config = TrainerConfig(gradient_checkpointing=checkpointing)
    policy = build_lora_model(model, trainer_config)
    policy.train()
    return policy


def grpo_loss(logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The clipped GRPO objective on-policy (old = current, detached), normalised per token."""
    ratio = torch.exp(logprobs - logprobs.detach())
    clipped = torch.clamp(ratio, 0.8, 1.28)
    loss = -torch.minimum(ratio * advantages, clipped * advantages)
    return (loss * mask).sum() / mask.sum().clamp(min=1)


def ours(layout: str, budget: int) -> Callable[[Any, list[Any]], dict[str, int]]:
    def run(policy: Any, samples: list[Any]) -> dict[str, int]:
        from lightning_sdk.training.update.forward.batching import batch_tokens, collate, micro_batches
        from lightning_sdk.training.update.forward.logprobs import token_logprobs

        device = next(policy.parameters()).device
        packed = layout == "packed"
        chunks = micro_batches(samples, None if packed else PADDED_ROWS, budget, packed=packed)
        for chunk in chunks:
            batch = collate(chunk, 0, device)
            logprobs, _ = token_logprobs(policy, batch, with_entropy=True, layout=layout)  # type: ignore[arg-type]
            grpo_loss(logprobs, batch.advantages, batch.loss_mask).backward()
        tokens_run = sum(batch_tokens(chunk, packed) for chunk in chunks)
        padding = 0 if packed else tokens_run - sum(real_tokens(chunk) for chunk in chunks)
        return {"tokens_run": tokens_run, "padding": padding, "passes": len(chunks)}

    return run


def padded_rows(chunk: list[Any], device: torch.device) -> tuple[torch.Tensor, ...]:
    """TRL's layout: prompts left-padded, completions right-padded, one row per sample."""
    from lightning_sdk.training.update.forward.batching import collate

    batch = collate(chunk, 0, device)
    index = batch.prompt_index
    input_ids = torch.cat([batch.prompt_ids[index], batch.completion_ids], dim=1)
    attention = torch.cat([batch.prompt_mask[index], batch.completion_mask], dim=1)
    return input_ids, attention, batch.completion_ids, batch.loss_mask, batch.advantages


def trl_way(policy: Any, samples: list[Any]) -> dict[str, int]:
    device = next(policy.parameters()).device
    chunks = [samples[start : start + PADDED_ROWS] for start in range(0, len(samples), PADDED_ROWS)]
    for chunk in chunks:
        input_ids, attention, completion, mask, advantages = padded_rows(chunk, device)
        width = completion.shape[1]
        logits = policy(input_ids=input_ids, attention_mask=attention, logits_to_keep=width + 1).logits[
            :, :-1
        ]
        logits = logits.float()
        picked = torch.gather(logits, -1, completion.unsqueeze(-1)).squeeze(-1)
        logprobs = picked - torch.logsumexp(logits, dim=-1)
        grpo_loss(logprobs, advantages, mask).backward()
    return padded_counts(chunks)


def liger(policy: Any, samples: list[Any]) -> dict[str, int]:
    from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss  # type: ignore[import-not-found]

    device = next(policy.parameters()).device
    loss_function = LigerFusedLinearGRPOLoss(beta=0.0, compiled=False, use_ref_model=False)
    causal = policy.get_base_model()
    chunks = [samples[start : start + PADDED_ROWS] for start in range(0, len(samples), PADDED_ROWS)]
    for chunk in chunks:
        input_ids, attention, completion, mask, advantages = padded_rows(chunk, device)
        width = completion.shape[1]
        hidden = causal.model(input_ids=input_ids, attention_mask=attention).last_hidden_state
        result = loss_function(
            hidden[:, -(width + 1) : -1], causal.lm_head.weight, completion, mask, advantages[:, 0]
        )
        (result[0] if isinstance(result, tuple) else result).backward()
    return padded_counts(chunks)


def real_tokens(samples: list[Any]) -> int:
    """Each sample's prompt and completion, as a trainer without prompt sharing runs them unpadded."""
    return sum(len(sample.prompt_ids) + len(sample.completion_ids) for sample in samples)


def padded_counts(chunks: list[list[Any]]) -> dict[str, int]:
    from lightning_sdk.training.update.forward.batching import batch_tokens

    tokens_run = sum(batch_tokens(chunk) for chunk in chunks)
    return {
        "tokens_run": tokens_run,
        "padding": tokens_run - sum(real_tokens(c) for c in chunks),
        "passes": len(chunks),
    }


def measure(policy: Any, run: Callable[[Any, list[Any]], dict[str, int]], samples: list[Any], repeats: int):
    on_gpu = next(policy.parameters()).is_cuda
    seconds = []
    peak = 0.0
    for attempt in range(repeats + 1):  # the first is a warm-up (compilation, allocator)
        if on_gpu:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            held = torch.cuda.memory_allocated()
        start = time.perf_counter()
        counts = run(policy, samples)
        if on_gpu:
            torch.cuda.synchronize()
            peak = max(peak, (torch.cuda.max_memory_allocated() - held) / 2**30)
        policy.zero_grad(set_to_none=True)
        if attempt:
            seconds.append(time.perf_counter() - start)
    real = real_tokens(samples)
    median = statistics.median(seconds)
    return {
        **counts,
        "real_tokens": real,
        "prompt_repeats_skipped": real + counts["padding"] - counts["tokens_run"],
        "seconds": round(median, 3),
        "real_tokens_per_s": round(real / median),
        "peak_gib_above_weights": round(peak, 2) if on_gpu else None,
    }


def needed_flops(samples: list[Any], shape: dict[str, Any]) -> float:
    """The model FLOPs the step needs: each distinct prompt once, every completion, no padding.

    A LoRA step needs the forward pass and the backward pass to the inputs of every layer (the base
    weights get no gradient; the adapter's are a rounding error): 4 x the decoder's matmul parameters per
    token, the vocabulary projection for completion tokens only (the loss needs nothing else), and causal
    attention within each sample (a completion attends to its prompt and its own earlier tokens, never to
    a sibling): 4 FLOPs per query-key pair and head dimension forward, 8 backward. Checkpointing's
    recomputed forward is hardware work, not work the step needs, so it is not counted (as MFU is
    defined), and neither are padding and repeated prompts: they lower a side's figure.
    """
    hidden, layers = shape["hidden_size"], shape["num_hidden_layers"]
    heads, kv_heads = shape["num_attention_heads"], shape["num_key_value_heads"]
    per_layer = (
        2 * hidden * hidden
        + 2 * hidden * hidden * kv_heads // heads
        + 3 * hidden * shape["intermediate_size"]
    )
    prompts = {tuple(sample.prompt_ids) for sample in samples}
    completion_tokens = sum(len(sample.completion_ids) for sample in samples)
    tokens = sum(len(prompt) for prompt in prompts) + completion_tokens
    # query-key pairs of causal attention: each prompt with itself once, each completion with its prompt
    # and its own earlier tokens
    pairs = sum(len(prompt) ** 2 / 2 for prompt in prompts) + sum(
        len(sample.prompt_ids) * len(sample.completion_ids) + len(sample.completion_ids) ** 2 / 2
        for sample in samples
    )
    linear = 4 * layers * per_layer * tokens + 4 * shape["vocab_size"] * hidden * completion_tokens
    attention = 12 * layers * hidden * pairs
    return linear + attention


def model_flop_utilisation(
    result: dict[str, Any], samples: list[Any], shape: dict[str, Any], device_name: str
) -> float | None:
    """The step's needed FLOPs (`needed_flops`) per second, against the GPU's dense bfloat16 peak."""
    peak = next((value for key, value in GPU_PEAK_TFLOPS.items() if key in device_name), None)
    if peak is None or result.get("error"):
        return None
    return round(needed_flops(samples, shape) / result["seconds"] / (peak * 1e12), 3)


def workload_samples(workloads: list[str], sequence_tokens: list[int], vocab: int, on_gpu: bool):
    """The samples of each workload asked for, by name."""
    cases: list[tuple[str, list[Any]]] = []
    if "grpo-step" in workloads:
        prompts, shortest, longest = ((512, 1536), 64, 2048) if on_gpu else ((64, 192), 8, 256)
        cases.append(("grpo-step", grpo_step(prompts, 8, shortest, longest, vocab)))
    if "grpo-64" in workloads:  # nearer real training: 8 groups of 8, long prompts and completions
        prompts = tuple(1024 + 384 * index for index in range(8)) if on_gpu else tuple(range(64, 320, 32))
        shortest, longest = (64, 4096) if on_gpu else (8, 256)
        cases.append(("grpo-64", grpo_step(prompts, 8, shortest, longest, vocab)))
    if "sequence" in workloads:
        cases += [(f"sequence {tokens}", one_sequence(tokens, vocab)) for tokens in sequence_tokens]
    return cases


def checkpointing_for(
    setting: str, shape: dict[str, Any], cases: list[tuple[str, list[Any]]], budget: int, on_gpu: bool
) -> tuple[bool, str]:
    """`--checkpointing`: on, off, or as the trainer's `gradient_checkpointing="auto"` decides for the
    longest sample of the workloads, on the memory this machine has (a GPU's less a tenth, as the trainer
    counts it; a CPU's available now)."""
    if setting != "auto":
        return setting == "on", "forced"
    from lightning_sdk.training.config import TrainerConfig
    from lightning_sdk.training.update.memory import choose_gradient_checkpointing

    longest = max(len(sample) for _, samples in cases for sample in samples)
    config = TrainerConfig(micro_batch_tokens=budget, max_sample_tokens=longest)
    from lightning_sdk.training.update.memory_report import memory_for_training

    on, why = choose_gradient_checkpointing(config, shape, on_gpu, memory_for_training(on_gpu))
    return on, f"auto: {why}"


def write_profile(
    policy: Any, samples: list[Any], budget: int, on_gpu: bool, shape: dict[str, Any], title: str
) -> None:
    """`--profile`: one warm step of the packed pass with the optimizer, under the profiler, summarized by
    `step_profile.py` into `gpu_train_profile_<gpu|cpu>.md` and `.json`."""
    from benchmarks.step_profile import as_markdown, profile_step, summarize
    from lightning_sdk.training.config import TrainerConfig
    from lightning_sdk.training.update.optim import build_optimizer

    config = TrainerConfig()
    optimizer = build_optimizer(policy, config)
    run = ours("packed", budget)

    def optimizer_step() -> None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    run(policy, samples)  # warm: compilation, the allocator
    optimizer_step()
    runs = profile_step(lambda: run(policy, samples), optimizer_step, on_gpu)
    summary = summarize(runs, on_gpu, rank=config.lora_rank, vocab=shape["vocab_size"])
    stem = RESULTS / f"gpu_train_profile_{'gpu' if on_gpu else 'cpu'}"
    stem.with_suffix(".json").write_text(json.dumps({"title": title, **summary}, indent=2) + "\n")
    stem.with_suffix(".md").write_text(as_markdown(summary, title, on_gpu))
    print(as_markdown(summary, title, on_gpu))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    on_gpu = torch.cuda.is_available()
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=None)
    parser.add_argument("--workloads", nargs="+", choices=["grpo-step", "grpo-64", "sequence"], default=None)
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    parser.add_argument("--sequence-tokens", nargs="+", type=int, default=None)
    parser.add_argument("--micro-batch-tokens", type=int, default=16384)
    parser.add_argument("--layers", type=int, default=None, help="keep the first N decoder layers")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument(
        "--checkpointing",
        choices=["auto", "on", "off"],
        default="auto",
        help="recompute layers in the backward pass: as the trainer's 'auto' decides (default), or forced",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also profile one step of the packed pass on the first workload (gpu_train_profile_*.md)",
    )
    args = parser.parse_args()
    models = args.models or (["1.5b", "3b", "7b"] if on_gpu else ["0.5b"])
    layers = args.layers or (None if on_gpu else 2)
    sequence_tokens = args.sequence_tokens or ([2048, 8192, 16384, 32768] if on_gpu else [512, 1024])
    workloads = args.workloads or ["grpo-step", "sequence"]
    device_name = torch.cuda.get_device_name() if on_gpu else platform.processor() or "cpu"
    rows: list[dict[str, Any]] = []
    for name in models:
        shape = {**MODELS[name], "num_hidden_layers": layers or MODELS[name]["num_hidden_layers"]}
        cases = workload_samples(workloads, sequence_tokens, shape["vocab_size"], on_gpu)
        recompute, why = checkpointing_for(args.checkpointing, shape, cases, args.micro_batch_tokens, on_gpu)
        print(f"{name}: gradient checkpointing {'on' if recompute else 'off'} ({why})", file=sys.stderr)
        policy = build_policy(MODELS[name], layers, on_gpu, recompute)
        attention = policy.get_base_model().config._attn_implementation
        if args.profile:
            title = f"{name} {cases[0][0]}, packed, checkpointing {'on' if recompute else 'off'} ({why})"
            write_profile(
                policy, cases[0][1], args.micro_batch_tokens, on_gpu, shape, f"{title}, {device_name}"
            )
        for workload, samples in cases:
            for side in args.sides:
                run = {
                    "packed": ours("packed", args.micro_batch_tokens),
                    "padded": ours("padded", args.micro_batch_tokens),
                    "trl-way": trl_way,
                    "liger": liger,
                }[side]
                row: dict[str, Any] = {
                    "model": name,
                    "workload": workload,
                    "side": side,
                    "attention": attention,
                    "checkpointing": recompute,
                }
                try:
                    row.update(measure(policy, run, samples, args.repeats))
                    row["mfu"] = model_flop_utilisation(row, samples, shape, device_name)
                except ImportError as error:
                    row["error"] = f"not installed: {error.name}"
                except Exception as error:  # noqa: BLE001  # one side failing still leaves the others' numbers
                    row["error"] = f"{type(error).__name__}: {str(error)[:200]}"
                    policy.zero_grad(set_to_none=True)
                if on_gpu:
                    torch.cuda.empty_cache()
                rows.append(row)
                print(json.dumps(row), flush=True)
        del policy
        # Each model starts with flex attention uncompiled, as in a run (one model per process). The sides
        # bring their own masks (ours packed, transformers' padded and causal ones), each compiled twice
        # (first shape, then dynamic shapes); over two models that passed torch.compile's limit of 8, and
        # the 7B rows then ran flex attention unfused and out of memory (gpu_check_h200_2026-11-27_rerun.md).
        torch._dynamo.reset()
    write(rows, args.output, device_name, on_gpu, layers)


def write(
    rows: list[dict[str, Any]], output: Path | None, device_name: str, on_gpu: bool, layers: int | None
):
    stem = output or RESULTS / f"gpu_train_{'gpu' if on_gpu else 'cpu'}"
    machine = {
        "device": device_name,
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
        "layers": layers,
        "dtype": "bfloat16" if on_gpu else "float32",
    }
    stem.with_suffix(".json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=2) + "\n")
    lines = [
        f"Training pass on {device_name} (torch {machine['torch']}, {machine['dtype']}, "
        f"{'all' if layers is None else layers} layers), "
        f"{machine['date']}: `python benchmarks/gpu_train.py`",
        "",
        "Real tokens count each sample's prompt; `padding`: tokens of the pass beyond them; `repeats",
        "skipped`: prompt tokens run once instead of once per sample. Peak: GPU memory above the weights.",
        "",
        "| model | workload | side | attention | checkpointing | real tokens | tokens run | padding | "
        "repeats skipped | passes | seconds | real tok/s | peak GiB | MFU |",
        "| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        if "error" in row:
            lines.append(
                f"| {row['model']} | {row['workload']} | {row['side']} | | | {row['error']} |" + " |" * 8
            )
            continue
        peak = "" if row["peak_gib_above_weights"] is None else row["peak_gib_above_weights"]
        mfu = "" if row["mfu"] is None else f"{row['mfu']:.0%}"
        recompute = {True: "on", False: "off"}.get(row.get("checkpointing"), "")
        lines.append(
            f"| {row['model']} | {row['workload']} | {row['side']} | {row['attention']} | {recompute} | "
            f"{row['real_tokens']} | {row['tokens_run']} | {row['padding']} | "
            f"{row['prompt_repeats_skipped']} | "
            f"{row['passes']} | "
            f"{row['seconds']} | {row['real_tokens_per_s']} | {peak} | {mfu} |"
        )
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
