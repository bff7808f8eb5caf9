"""Engine throughput: tokens/s at 1, 8 and 32 concurrent chats, and weight-update latency.

Rows (bundled SmolLM2-135M-Instruct, sampled at temperature 1 with a fixed seed per chat, so the app and
the engine produce the very same tokens and their speeds compare directly):

- `app (HTTP)`: the real `openai.AsyncOpenAI` client against our OpenAI-compatible app on 127.0.0.1;
- `engine direct`: `VLLMEngine.agenerate` called concurrently in-process (no HTTP, no template);
- `AsyncLLM direct` (`--async-llm`): vLLM's `AsyncLLM`, whose engine core runs in a child process;
- `transformers generate`: plain `model.generate` on a left-padded batch of the same prompts (float32);
- `LoRA active` (`--lora`): the engine with weight_sync="lora" while a rank-16 adapter is served;
- `engine direct, <dtype>` (`--dtypes bfloat16 float32`): the engine forced to each dtype, beside the
  default (`dtype="auto"`, see `lightning_sdk.engine.placement.serving_dtype`);
- `LoRA, N role adapters` (`--roles N`): weight_sync="lora" with N adapters loaded as roles and the 32
  requests spread over them round robin (`SamplingParams.adapter`), beside one adapter answering all 32
  (`TrainerConfig(roles=...)` serves each role this way). `--only-roles` measures just these two rows.

Weight updates: `load_adapter` of a rank-16 adapter on all projections, by merging and pushing the full
weights (CPU default) and by LoRA hot-load. Only one engine runs at a time. Usage:

    python benchmarks/engine_throughput.py [--max-tokens 128] [--repeats 3] [--lora] [--async-llm] \
        [--dtypes bfloat16 float32] [--roles 4 [--only-roles]]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from lightning_sdk.engine import SamplingParams, VLLMEngine, resolve_model
from lightning_sdk.serving import start_server

CONCURRENCY = (1, 8, 32)
TOPICS = ["a cat", "the sea", "a robot", "a lighthouse", "a dragon", "the moon", "a baker", "a storm"]


def chats(count: int) -> list[list[dict[str, str]]]:
    """Distinct chat requests (different prompts, so the prefix cache does not flatter anyone)."""
    return [
        [{"role": "user", "content": f"Write a short story about {TOPICS[i % 8]} (story {i})."}]
        for i in range(count)
    ]


def render(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def rates(
    runs: dict[str, Any], repeats: int, counts: tuple[int, ...] = CONCURRENCY
) -> dict[str, dict[int, list[float]]]:
    """tokens/s of `repeats` runs per row and concurrency, for rows `{name: run(count) -> (tokens, s)}`.

    Everything runs once first (warm-up): an engine's first batches of a new size pay one-off costs
    (KV-cache pages touched for the first time, kernels planned per batch shape), which used to land in
    whatever was measured first. Then, per concurrency and repeat, the rows run back to back, so a
    change of background load hits every row alike instead of one row's whole column.
    """
    for count in counts:
        for run in runs.values():
            run(count)
    samples: dict[str, dict[int, list[float]]] = {name: {c: [] for c in counts} for name in runs}
    for count in counts:
        for _ in range(repeats):
            for name, run in runs.items():
                tokens, seconds = run(count)
                samples[name][count].append(tokens / seconds)
    return samples


def engine_direct(
    engine: VLLMEngine, prompts: list[list[int]], max_tokens: int, roles: list[str] | None = None
) -> tuple[int, float]:
    """Tokens and seconds of the prompts sampled concurrently; with `roles`, request i asks for the adapter
    of role `roles[i % len(roles)]`."""

    async def go() -> int:
        results = await asyncio.gather(
            *(
                engine.agenerate(
                    p,
                    SamplingParams(
                        max_tokens=max_tokens, seed=i, adapter=roles[i % len(roles)] if roles else None
                    ),
                )
                for i, p in enumerate(prompts)
            )
        )
        return sum(len(r.completions[0].token_ids) for r in results)

    started = time.perf_counter()
    tokens = asyncio.run(go())
    return tokens, time.perf_counter() - started


def through_app(endpoint: Any, messages: list[list[dict[str, str]]], max_tokens: int) -> tuple[int, float]:
    async def go() -> int:
        async with endpoint.async_openai_client(max_retries=0, timeout=600) as client:
            replies = await asyncio.gather(
                *(
                    client.chat.completions.create(
                        model=endpoint.model, messages=m, max_tokens=max_tokens, temperature=1.0, seed=i
                    )
                    for i, m in enumerate(messages)
                )
            )
        return sum(len(r.choices[0].token_ids) for r in replies)

    started = time.perf_counter()
    tokens = asyncio.run(go())
    return tokens, time.perf_counter() - started


def transformers_generate(
    model: Any, tokenizer: Any, prompts: list[list[int]], max_tokens: int
) -> tuple[int, float]:
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            max_new_tokens=max_tokens,
            pad_token_id=tokenizer.pad_token_id,
        )
    seconds = time.perf_counter() - started
    generated = out[:, width:]
    eos = tokenizer.eos_token_id
    tokens = sum(int((row == eos).nonzero()[0]) + 1 if (row == eos).any() else len(row) for row in generated)
    return tokens, seconds


def async_llm_direct(
    model_path: Path, prompts: list[list[int]], max_tokens: int, repeats: int
) -> dict[int, list[float]]:
    """vLLM's AsyncLLM (engine core in a child process), same settings as VLLMEngine on CPU."""
    from vllm import SamplingParams as VSamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.platforms import current_platform
    from vllm.v1.engine.async_llm import AsyncLLM

    from lightning_sdk.engine.placement import serving_dtype

    async def main() -> dict[int, float]:
        engine = AsyncLLM.from_engine_args(
            AsyncEngineArgs(
                model=str(model_path),
                dtype=serving_dtype(current_platform.is_cpu()),
                max_model_len=2048,
                logprobs_mode="processed_logprobs",
                generation_config="vllm",
                disable_log_stats=True,
            )
        )

        async def one(i: int, prompt: list[int]) -> int:
            params = VSamplingParams(max_tokens=max_tokens, seed=i, logprobs=0)
            final = None
            async for final in engine.generate(
                {"prompt_token_ids": prompt}, params, request_id=f"r{i}-{time.time()}"
            ):
                pass
            return len(final.outputs[0].token_ids)

        async def run(count: int) -> tuple[int, float]:
            started = time.perf_counter()
            tokens = sum(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts[:count]))))
            return tokens, time.perf_counter() - started

        by_count = {}
        for count in CONCURRENCY:
            await run(count)
            samples = [await run(count) for _ in range(repeats)]
            by_count[count] = [t / s for t, s in samples]
        engine.shutdown()
        return by_count

    return asyncio.run(main())


def make_adapter(model_path: Path, folder: Path, rank: int = 16) -> Path:
    """A rank-16 LoRA adapter on all projections, with non-zero B so that it changes the outputs."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=modules, init_lora_weights=False)
    get_peft_model(model, config).save_pretrained(folder)
    return folder


def update_latency(engine: VLLMEngine, adapter: Path, repeats: int) -> float:
    """Median seconds of `load_adapter` (a new version each time, after one warm-up)."""
    samples = []
    for version in range(1, repeats + 2):
        started = time.perf_counter()
        engine.load_adapter(adapter, version=version)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples[1:])


def measure_vllm(model: Any, args: argparse.Namespace, options: dict, adapter: Path) -> dict[str, Any]:
    """The default engine: direct vs app at each concurrency, then the merged-adapter update."""
    started = time.perf_counter()
    engine = VLLMEngine(model, **options)
    startup = time.perf_counter() - started
    dtype = engine.dtype
    messages = chats(max(CONCURRENCY))
    prompts = [render(engine.tokenizer, m) for m in messages]

    def direct(count: int) -> tuple[int, float]:
        return engine_direct(engine, prompts[:count], args.max_tokens)

    with start_server(engine) as server:
        rows = rates(
            {
                "engine direct": direct,
                "app (HTTP)": lambda c: through_app(server.endpoint, messages[:c], args.max_tokens),
            },
            args.repeats,
        )
    merge_seconds = update_latency(engine, adapter, args.repeats)
    rows |= rates({"engine direct, adapter merged in": direct}, args.repeats, (32,))
    engine.shutdown()
    return {
        "startup_s": startup,
        "dtype": dtype,
        "rows": rows,
        "merge_update_s": merge_seconds,
        "prompts": prompts,
    }


def measure_dtype(model: Any, args: argparse.Namespace, options: dict, prompts: list, dtype: str) -> dict:
    """The engine with its dtype forced to `dtype`, directly, at every concurrency."""
    engine = VLLMEngine(model, dtype=dtype, **options)

    def direct(count: int) -> tuple[int, float]:
        return engine_direct(engine, prompts[:count], args.max_tokens)

    rows = rates({f"engine direct, {dtype}": direct}, args.repeats)
    engine.shutdown()
    return rows


def measure_lora(model: Any, args: argparse.Namespace, options: dict, adapter: Path, prompts: list) -> dict:
    """weight_sync="lora": hot-load latency and speed with and without the adapter active."""
    engine = VLLMEngine(model, weight_sync="lora", max_lora_rank=16, **options)

    def direct(count: int) -> tuple[int, float]:
        return engine_direct(engine, prompts[:count], args.max_tokens)

    rows = rates({"engine direct, LoRA enabled, base weights": direct}, args.repeats, (32,))
    seconds = update_latency(engine, adapter, args.repeats)
    rows |= rates({"engine direct, LoRA adapter active": direct}, args.repeats, (32,))
    engine.shutdown()
    return {"rows": rows, "lora_update_s": seconds}


def measure_roles(model: Any, args: argparse.Namespace, options: dict, adapter: Path, prompts: list) -> dict:
    """weight_sync="lora": one adapter answering every request, against `args.roles` role adapters
    (the same weights under distinct ids, so only the number of adapters in a batch differs)."""
    count = args.roles
    engine = VLLMEngine(model, weight_sync="lora", max_lora_rank=16, max_adapters=count + 1, **options)
    roles = [f"role{index}" for index in range(count)]
    engine.load_adapter(adapter, version=1)
    for role in roles:
        engine.load_adapter(adapter, version=1, role=role)
    rows = rates(
        {
            "LoRA, 1 adapter answers all": lambda c: engine_direct(engine, prompts[:c], args.max_tokens),
            f"LoRA, {count} role adapters": lambda c: engine_direct(
                engine, prompts[:c], args.max_tokens, roles
            ),
        },
        args.repeats,
        (32,),
    )
    engine.shutdown()
    return rows


def measure_transformers(model: Any, args: argparse.Namespace, prompts: list) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoModelForCausalLM.from_pretrained(model.path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model.path)

    def generate(count: int) -> tuple[int, float]:
        return transformers_generate(hf, tokenizer, prompts[:count], args.max_tokens)

    return rates({"transformers generate": generate}, args.repeats)


def report(results: dict[str, Any], args: argparse.Namespace) -> None:
    rows = results["rows"]
    print(
        f"\nvLLM start: {results['startup_s']:.1f} s; default dtype {results['dtype']}; "
        f"max_tokens={args.max_tokens}; median of "
        f"{args.repeats} runs (min-max); 1-minute load average {results['load_before']:.1f} before, "
        f"{results['load_after']:.1f} after\n"
    )
    print("| path | " + " | ".join(f"{c} chats (tok/s)" for c in CONCURRENCY) + " |")
    print("|---|" + "---:|" * len(CONCURRENCY))
    for name, samples in rows.items():
        cells = [_cell(samples[c]) if c in samples else "" for c in CONCURRENCY]
        print(f"| {name} | " + " | ".join(cells) + " |")
    app, direct = statistics.median(rows["app (HTTP)"][32]), statistics.median(rows["engine direct"][32])
    print(f"\napp / direct at 32 chats: {app / direct:.0%} (target >= 85%)")
    print(f"adapter update, merged and written in place: {results['merge_update_s']:.3f} s (target < 0.5 s)")
    if results.get("lora_update_s") is not None:
        print(f"adapter update, LoRA hot-load: {results['lora_update_s']:.3f} s")
    if args.roles and f"LoRA, {args.roles} role adapters" in rows:
        report_roles(rows, args.roles)


def _cell(samples: list[float]) -> str:
    return f"{statistics.median(samples):.0f} ({min(samples):.0f}-{max(samples):.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--serving-threads", type=int, default=None)
    parser.add_argument("--enforce-eager", action="store_true", help="vLLM without torch.compile")
    parser.add_argument("--lora", action="store_true", help="also measure weight_sync='lora'")
    parser.add_argument("--async-llm", action="store_true", help="also measure vLLM's AsyncLLM")
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument(
        "--dtypes", nargs="*", default=[], help="also measure the engine in these dtypes (bfloat16 float32)"
    )
    parser.add_argument("--roles", type=int, default=0, help="also measure N role adapters at once")
    parser.add_argument("--only-roles", action="store_true", help="measure only the --roles rows")
    parser.add_argument("--json", type=Path, default=None, help="write the numbers here")
    args = parser.parse_args()

    model = resolve_model(None)
    load_before = os.getloadavg()[0]
    options = {
        "max_model_len": 2048,
        "serving_threads": args.serving_threads,
        "enforce_eager": args.enforce_eager,
    }
    with tempfile.TemporaryDirectory() as tmp:
        adapter = make_adapter(model.path, Path(tmp) / "adapter")
        if args.only_roles:
            measure_only_roles(model, args, options, adapter, load_before)
            return
        results = measure_vllm(model, args, options, adapter)
        prompts = results.pop("prompts")
        if args.async_llm:
            results["rows"]["AsyncLLM direct (child process)"] = async_llm_direct(
                model.path, prompts, args.max_tokens, args.repeats
            )
        for dtype in args.dtypes:
            results["rows"] |= measure_dtype(model, args, options, prompts, dtype)
        if not args.skip_transformers:
            results["rows"] |= measure_transformers(model, args, prompts)
        results["load_before"], results["load_after"] = load_before, os.getloadavg()[0]
        report(results, args)
        save(results, args)
        if args.roles:
            results["rows"] |= measure_roles(model, args, options, adapter, prompts)
            report(results, args)
            save(results, args)
        if args.lora:  # last, as the slowest part: the table above is already out
            lora = measure_lora(model, args, options, adapter, prompts)
            results["rows"] |= lora["rows"]
            results["lora_update_s"] = lora["lora_update_s"]
            results["load_after"] = os.getloadavg()[0]
            report(results, args)
            save(results, args)


def measure_only_roles(
    model: Any, args: argparse.Namespace, options: dict, adapter: Path, load_before: float
) -> None:
    from transformers import AutoTokenizer

    if args.roles < 1:
        raise SystemExit("--only-roles needs --roles N (N >= 1)")
    tokenizer = AutoTokenizer.from_pretrained(model.path)
    prompts = [render(tokenizer, messages) for messages in chats(max(CONCURRENCY))]
    results = {"rows": measure_roles(model, args, options, adapter, prompts), "load_before": load_before}
    results["load_after"] = os.getloadavg()[0]
    print(
        f"\nmax_tokens={args.max_tokens}; median of {args.repeats} runs (min-max); 1-minute load average "
        f"{results['load_before']:.1f} before, {results['load_after']:.1f} after\n"
    )
    print("| path | 32 chats (tok/s) |\n|---|---:|")
    for name, samples in results["rows"].items():
        print(f"| {name} | {_cell(samples[32])} |")
    report_roles(results["rows"], args.roles)
    save(results, args)


def report_roles(rows: dict[str, dict[int, list[float]]], count: int) -> None:
    one = statistics.median(rows["LoRA, 1 adapter answers all"][32])
    several = statistics.median(rows[f"LoRA, {count} role adapters"][32])
    print(f"\n{count} role adapters / 1 adapter at 32 chats: {several / one:.0%} (target >= 85%)")


def save(results: dict[str, Any], args: argparse.Namespace) -> None:
    if args.json:
        args.json.write_text(json.dumps({**results, "args": vars(args)}, default=str, indent=2))


if __name__ == "__main__":
    main()
