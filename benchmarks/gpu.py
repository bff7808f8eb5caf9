"""Seconds per GRPO step, rollout tokens/s and peak GPU memory on one CUDA GPU, beside TRL.

Not run yet: the project has no GPU machine. This is the first command to run on one, after
`scripts/gpu_smoke.sh` (docs/gpu.md); on a machine without CUDA it refuses at once.

For each Qwen2.5-Instruct model (0.5B, 1.5B and 3B from the Hugging Face Hub, `--models`) and each episode
length (`--prompt-tokens`, 2k and 8k by default), both trainers run a few GRPO steps on the same synthetic
task: one chat call whose prompt has that many tokens (random words from a fixed list, a different text per
task) and at most `--max-tokens` sampled tokens, rewarded by the reply's length in words (up to 64), which
gives every group a reward spread so that every step trains.

- ours: `ls.Trainer` with its co-located vLLM engine (sleeps during the update, LoRA hot-loaded).
- TRL: `trl.GRPOTrainer` with `use_vllm=True, vllm_mode="colocate"` and vLLM's sleep mode, TRL's
  recommended single-GPU setup (skipped with a note when `trl` is not installed: `pip install
  'lightning-sdk[bench]'`).

Both train a rank-16 LoRA adapter on every attention and MLP projection, in bfloat16, with gradient
checkpointing, the same vLLM share of the GPU, the same temperature, learning rate and micro-batch token
budget, no KL term. Each (model, length, trainer) runs in its own child process, one after the other.

Measured per run: median seconds per step (the first step, with its compilation and warm-up, is left out
when there are more), rollout tokens/s (sampled tokens over the rollout time; TRL's rollout time includes
its weight sync, ours pushes after the update), `torch.cuda.max_memory_allocated` (what torch's
allocator handed out, which includes what vLLM allocates through it in its sleep-mode memory pool) and the
most memory in use on the device, sampled every 0.2 s (everything: the CUDA context, other processes).
Usage:

    python benchmarks/gpu.py [--models 0.5b 1.5b 3b] [--prompt-tokens 2048 8192] [--sides ours trl]
                             [--steps 4] [--group-size 8] [--batch-size 4] [--max-tokens 128]

Writes `benchmarks/results/gpu.json` (every measurement and the machine) and `benchmarks/results/gpu.md`
(the table); `--output` changes the path without its suffix.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

MODELS = {
    "0.5b": "Qwen/Qwen2.5-0.5B-Instruct",
    "1.5b": "Qwen/Qwen2.5-1.5B-Instruct",
    "3b": "Qwen/Qwen2.5-3B-Instruct",
}
SIDES = {"ours": "lightning-sdk Trainer (vLLM)", "trl": "TRL GRPOTrainer (vLLM colocate)"}
LORA_RANK, LORA_ALPHA = 16, 32
MICRO_BATCH_TOKENS = 16384
"""Padded tokens per forward/backward pass on both sides (ours: `micro_batch_tokens`)."""
REWARD_WORDS = 64
CHILD_ENV = {"WANDB_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false"}
WORD_LIST = (
    "river stone lamp garden window paper orange music winter bridge cloud forest engine market silver "
    "letter harbor candle mountain village ticket summer planet basket mirror doctor island kitchen "
    "pencil rabbit signal tunnel violin wallet yellow anchor blanket castle desert feather glacier "
    "hammer jacket ladder meadow needle ocean pillow quarry saddle timber valley whistle"
)
INSTRUCTION = "Summarise these notes in a few sentences:\n\n"


@dataclass(frozen=True)
class Settings:
    """What every run of one command shares."""

    steps: int
    group_size: int
    batch_size: int
    max_tokens: int
    learning_rate: float
    temperature: float
    seed: int

    def context(self, prompt_tokens: int) -> int:
        """The engines' context window for a prompt length: the prompt, the reply and a margin for the
        prompt's rounding to whole words."""
        return prompt_tokens + self.max_tokens + 64


@dataclass(frozen=True)
class Case:
    """One child process: a model, a prompt length and a trainer."""

    model: str
    prompt_tokens: int
    side: str


# --- the synthetic task -----------------------------------------------------------------------------------


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": INSTRUCTION + text}]


def prompt_length(tokenizer: Any, text: str) -> int:
    """Tokens of the chat-templated prompt for `text`, as the engines see it."""
    ids = tokenizer.apply_chat_template(chat(text), add_generation_prompt=True, return_dict=False)
    return len(ids)


def synthetic_text(tokenizer: Any, prompt_tokens: int, seed: int) -> str:
    """Random words whose chat-templated prompt has about `prompt_tokens` tokens."""
    rng, vocabulary = random.Random(seed), WORD_LIST.split()
    overhead = prompt_length(tokenizer, "")
    words = " ".join(rng.choice(vocabulary) for _ in range(prompt_tokens))  # at least one token per word
    ids = tokenizer(words, add_special_tokens=False)["input_ids"][: max(prompt_tokens - overhead, 1)]
    return str(tokenizer.decode(ids))


def synthetic_tasks(model: str, prompt_tokens: int, count: int, seed: int) -> list[dict[str, Any]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    texts = [synthetic_text(tokenizer, prompt_tokens, seed * 100_003 + index) for index in range(count)]
    return [{"text": text, "prompt_tokens": prompt_length(tokenizer, text)} for text in texts]


def length_reward(reply: str | None) -> float:
    """The reply's length in words, up to `REWARD_WORDS`, as a share: sampled replies differ in it."""
    return min(len((reply or "").split()), REWARD_WORDS) / REWARD_WORDS


# --- GPU memory -------------------------------------------------------------------------------------------


@contextmanager
def device_memory_peak(result: dict[str, float], every_s: float = 0.2) -> Iterator[None]:
    """Sample the memory in use on GPU 0 while the block runs; `result["device_peak_gib"]` is the most."""
    import torch

    done, peak = threading.Event(), [0]

    def sample() -> None:
        while not done.wait(every_s):
            free, total = torch.cuda.mem_get_info(0)
            peak[0] = max(peak[0], total - free)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield
    finally:
        done.set()
        sampler.join()
        result["device_peak_gib"] = peak[0] / 2**30


# --- our side ---------------------------------------------------------------------------------------------


def run_ours(case: Case, settings: Settings, work_dir: Path) -> dict[str, Any]:
    import openai

    import lightning_sdk as ls

    @ls.reward
    def longer_is_better(task: dict[str, Any], reply: str | None) -> float:
        return length_reward(reply)

    @ls.trace_agent(name="reader")
    def reader(task: dict[str, Any]) -> str | None:
        messages: Any = chat(task["text"])  # openai's types want its TypedDicts; these are plain dicts
        response = openai.OpenAI().chat.completions.create(
            model="default", messages=messages, max_tokens=settings.max_tokens
        )
        reply = response.choices[0].message.content
        longer_is_better(task, reply)
        return reply

    context = settings.context(case.prompt_tokens)
    config = ls.TrainerConfig(
        group_size=settings.group_size,
        batch_size=settings.batch_size,
        max_steps=settings.steps,
        max_tokens=settings.max_tokens,
        max_sample_tokens=context,
        micro_batch_tokens=MICRO_BATCH_TOKENS,
        lora_rank=LORA_RANK,
        lora_alpha=LORA_ALPHA,
        temperature=settings.temperature,
        learning_rate=settings.learning_rate,
        save_every=0,
        eval_every=0,
        progress_bar=False,
        run_dir=str(work_dir / "ours"),
        seed=settings.seed,
    )
    tasks = synthetic_tasks(
        case.model, case.prompt_tokens, settings.steps * settings.batch_size, settings.seed
    )
    trainer = ls.Trainer(case.model, config, engine="vllm", engine_options={"max_model_len": context})
    steps = [record for record in trainer.fit(reader, tasks).history if "time_step_s" in record]
    return {
        "step_s": [record["time_step_s"] for record in steps],
        "rollout_s": [record["time_rollout_s"] for record in steps],
        "tokens": [record["tokens_sampled"] for record in steps],
        "prompt_tokens_measured": statistics.mean(task["prompt_tokens"] for task in tasks),
    }


# --- TRL's side -------------------------------------------------------------------------------------------


def trl_micro_batch(episodes: int, context: int) -> int:
    """TRL's `per_device_train_batch_size`: as many sequences as `MICRO_BATCH_TOKENS` holds, and a divisor
    of the step's episodes (TRL accumulates whole micro-batches up to one generation batch)."""
    fits = max(MICRO_BATCH_TOKENS // context, 1)
    return max(size for size in range(1, fits + 1) if episodes % size == 0)


def run_trl(case: Case, settings: Settings, work_dir: Path) -> dict[str, Any]:
    import torch
    from datasets import Dataset  # type: ignore[import-untyped]
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer  # type: ignore[attr-defined]  # trl exports them lazily

    from lightning_sdk.engine.placement import DEFAULT_GPU_MEMORY_SHARE
    from lightning_sdk.training.config import DEFAULT_LORA_TARGET_MODULES

    tokens: list[int] = []
    rollout_s: list[float] = []
    step_s: list[float] = []

    def longer_is_better(
        completions: list[Any], completion_ids: list[list[int]], **_: Any
    ) -> list[float | None]:
        tokens.append(sum(len(ids) for ids in completion_ids))
        return [length_reward(completion[0]["content"]) for completion in completions]

    class TimedGRPOTrainer(GRPOTrainer):
        """TRL's trainer, timing its rollouts (vLLM generation, after its weight sync). If a TRL release
        renames the method, `rollout_s` stays empty and the table says n/a."""

        def _generate_single_turn(self, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return super()._generate_single_turn(*args, **kwargs)  # type: ignore[no-untyped-call]
            finally:
                rollout_s.append(time.perf_counter() - started)

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            self.started = time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            step_s.append(time.perf_counter() - self.started)

    episodes = settings.group_size * settings.batch_size
    context = settings.context(case.prompt_tokens)
    micro_batch = trl_micro_batch(episodes, context)
    config = GRPOConfig(
        output_dir=str(work_dir / "trl"),
        per_device_train_batch_size=micro_batch,
        gradient_accumulation_steps=episodes // micro_batch,
        generation_batch_size=episodes,
        num_generations=settings.group_size,
        max_completion_length=settings.max_tokens,
        temperature=settings.temperature,
        learning_rate=settings.learning_rate,
        lr_scheduler_type="constant",
        max_steps=settings.steps,
        beta=0.0,
        max_grad_norm=1.0,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=DEFAULT_GPU_MEMORY_SHARE,
        vllm_max_model_length=context,
        vllm_enable_sleep_mode=True,
        bf16=True,
        gradient_checkpointing=True,
        save_strategy="no",
        report_to="none",
        logging_steps=1,
        disable_tqdm=True,
        seed=settings.seed,
    )
    tasks = synthetic_tasks(
        case.model, case.prompt_tokens, settings.steps * settings.batch_size, settings.seed
    )
    trainer = TimedGRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(case.model, dtype=torch.bfloat16),
        reward_funcs=longer_is_better,
        args=config,
        train_dataset=Dataset.from_list([{"prompt": chat(task["text"])} for task in tasks]),
        processing_class=AutoTokenizer.from_pretrained(case.model),
        peft_config=LoraConfig(
            r=LORA_RANK,
            lora_alpha=LORA_ALPHA,
            target_modules=list(DEFAULT_LORA_TARGET_MODULES),
            task_type="CAUSAL_LM",
        ),
        callbacks=[StepTimer()],
    )
    trainer.train()
    return {
        "step_s": step_s,
        "rollout_s": rollout_s,
        "tokens": tokens,
        "micro_batch": micro_batch,
        "prompt_tokens_measured": statistics.mean(task["prompt_tokens"] for task in tasks),
    }


# --- one child process per case ---------------------------------------------------------------------------


def child_main(case: Case, settings: Settings, output: Path) -> None:
    """Run one case in this process and write its measurements to `output`."""
    import torch

    measured: dict[str, Any] = {}
    with device_memory_peak(measured):
        run = run_ours if case.side == "ours" else run_trl
        measured.update(run(case, settings, output.parent))
    measured["torch_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    output.write_text(json.dumps(measured))


def run_case(case: Case, settings: Settings, work_dir: Path) -> dict[str, Any]:
    """One case in a child process; its measurements, or `{"error": ...}` with the end of its output."""
    case_dir = work_dir / f"{case.model.replace('/', '--')}-{case.prompt_tokens}-{case.side}"
    case_dir.mkdir(parents=True, exist_ok=True)
    output = case_dir / "measured.json"
    command = [sys.executable, __file__, "--child", json.dumps(asdict(case)), "--child-output", str(output)]
    command += settings_arguments(settings)
    print(f"\n=== {case.model}, {case.prompt_tokens}-token prompts, {SIDES[case.side]} ===", flush=True)
    log = case_dir / "output.log"
    with log.open("w") as sink:
        completed = subprocess.run(
            command, stdout=sink, stderr=subprocess.STDOUT, env=child_env(), check=False
        )
    if completed.returncode != 0 or not output.exists():
        tail = log.read_text().strip().splitlines()[-3:]
        return {"error": f"exit code {completed.returncode}: {' / '.join(tail)[-400:]} (log: {log})"}
    return dict(json.loads(output.read_text()))


def child_env() -> dict[str, str]:
    return {**os.environ, **CHILD_ENV}


def settings_arguments(settings: Settings) -> list[str]:
    """The command-line options that give a child the same settings."""
    return [f"--{name.replace('_', '-')}={value}" for name, value in asdict(settings).items()]


# --- the table --------------------------------------------------------------------------------------------

HEADER = [
    "model",
    "prompt tokens",
    "trainer",
    "steps",
    "s / step (median)",
    "rollout tokens/s",
    "torch peak (GiB)",
    "device peak (GiB)",
]


def timed_steps(values: list[float]) -> list[float]:
    """The steps that count: all but the first (compilation, warm-up) when there are more."""
    return values[1:] if len(values) > 1 else values


def table_row(case: Case, measured: dict[str, Any]) -> list[str]:
    head = [case.model, str(case.prompt_tokens), SIDES[case.side]]
    if "error" in measured or "skipped" in measured:
        return [*head, f"did not run: {measured.get('error') or measured['skipped']}", "", "", "", ""]
    steps, rollouts = measured["step_s"], timed_steps(measured["rollout_s"])
    tokens = timed_steps(measured["tokens"])
    return [
        *head,
        str(len(steps)),
        f"{statistics.median(timed_steps(steps)):.1f}",
        f"{sum(tokens) / sum(rollouts):.0f}" if rollouts and sum(rollouts) else "n/a",
        f"{measured['torch_peak_gib']:.1f}",
        f"{measured['device_peak_gib']:.1f}",
    ]


def markdown_table(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "|".join("---" for _ in HEADER) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def machine() -> dict[str, Any]:
    import platform
    from importlib.metadata import PackageNotFoundError, version

    import torch

    versions: dict[str, str | None] = {}
    for name in ("torch", "vllm", "transformers", "peft", "trl", "lightning-sdk"):
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = None
    return {
        "gpu": torch.cuda.get_device_name(0),
        "gpu_memory_gib": torch.cuda.get_device_properties(0).total_memory / 2**30,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "versions": versions,
    }


def write_results(path: Path, runs: list[tuple[Case, dict[str, Any]]], settings: Settings) -> None:
    """`<path>.json` with every measurement and the machine, `<path>.md` with the table."""
    facts: dict[str, Any] = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="minutes"),
        "command": "python benchmarks/gpu.py " + shlex.join(sys.argv[1:]),
        "machine": machine(),
        "settings": asdict(settings),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    results = [{**asdict(case), **measured} for case, measured in runs]
    path.with_suffix(".json").write_text(json.dumps({**facts, "runs": results}, indent=2))
    table = markdown_table([table_row(case, measured) for case, measured in runs])
    gpu, versions = facts["machine"]["gpu"], facts["machine"]["versions"]
    path.with_suffix(".md").write_text(
        f"# GRPO steps on one GPU: ours and TRL\n\n- Date: {facts['date']}\n- Command: `{facts['command']}`\n"
        f"- GPU: {gpu}, CUDA {facts['machine']['cuda']}; versions: {json.dumps(versions)}\n"
        f"- Setup: {settings.batch_size} prompts x {settings.group_size} samples, at most "
        f"{settings.max_tokens} new tokens, LoRA r{LORA_RANK}, bfloat16, {settings.steps} steps\n\n"
        f"{table}\n\nSeconds per step: median over the steps after the first. Rollout tokens/s: sampled "
        "tokens over rollout time. Torch peak: `torch.cuda.max_memory_allocated`; device peak: the most "
        "memory in use on the GPU, sampled every 0.2 s.\n"
    )
    print("\n" + table + f"\n\nwrote {path.with_suffix('.md')} and {path.with_suffix('.json')}")


# --- the command ------------------------------------------------------------------------------------------


def require_cuda() -> None:
    """Refuse at once on a machine without a CUDA GPU, before anything is loaded."""
    import torch

    if not torch.cuda.is_available():
        raise SystemExit(
            f"benchmarks/gpu.py needs a CUDA GPU, and torch {torch.__version__} sees none here. Run it on a "
            "GPU machine installed with `make install EXTRAS=all,dev,docs,bench` (docs/gpu.md); "
            "benchmarks/train_step.py and benchmarks/vs_trl.py measure on a CPU."
        )


def hub_id(name: str) -> str:
    return MODELS.get(name.lower(), name)


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), help="0.5b, 1.5b, 3b or Hub ids")
    parser.add_argument("--prompt-tokens", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--sides", nargs="+", choices=list(SIDES), default=list(SIDES))
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--learning-rate", type=float, default=1e-5)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / "gpu"))
    parser.add_argument("--work-dir", default=None, help="runs and logs go here (default: a temp folder)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-output", help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse_arguments()
    require_cuda()
    settings = Settings(
        args.steps,
        args.group_size,
        args.batch_size,
        args.max_tokens,
        args.learning_rate,
        args.temperature,
        args.seed,
    )
    if args.child:
        child_main(Case(**json.loads(args.child)), settings, Path(args.child_output))
        return
    work_dir = Path(args.work_dir or tempfile.mkdtemp(prefix="gpu-bench-"))
    trl_installed = importlib.util.find_spec("trl") is not None
    runs: list[tuple[Case, dict[str, Any]]] = []
    for model in map(hub_id, args.models):
        for prompt_tokens in args.prompt_tokens:
            for side in args.sides:
                case = Case(model, prompt_tokens, side)
                if side == "trl" and not trl_installed:
                    runs.append(
                        (case, {"skipped": "trl is not installed (pip install 'lightning-sdk[bench]')"})
                    )
                    continue
                runs.append((case, run_case(case, settings, work_dir)))
    write_results(Path(args.output), runs, settings)


if __name__ == "__main__":
    main()
