"""What roles cost in training: step time and peak memory of one agent trained with 1, 2 and 4 LoRA adapters.

The agent has four sub-agents (`a`, `b`, `c`, `d`), each making one call per episode, and is trained three
ways on the same tasks with the same seed, each in its own process (one vLLM engine per process, and a
clean peak RSS):

- `1 adapter`: no roles (weight_sync="lora", so that the engine decodes with the same LoRA kernels);
- `2 adapters`: roles `a` and `b`, with `routes` giving `c`'s calls to `a` and `d`'s to `b`;
- `4 adapters`: roles `a`, `b`, `c`, `d`.

Every configuration trains the same calls; only how many adapters they are split over changes. Reported per
configuration: the median seconds of a step (the first step excluded: it warms the engine up), of its
rollout and of its update, and the process's peak RSS. Usage:

    python benchmarks/roles_cost.py [--steps 5] [--output benchmarks/results/roles_cost.md]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CONFIGURATIONS: dict[str, dict[str, Any]] = {
    "1 adapter": {"weight_sync": "lora"},
    "2 adapters": {"roles": ["a", "b"], "routes": {"agent:c": "a", "agent:d": "b", ".*": "policy"}},
    "4 adapters": {"roles": ["a", "b", "c", "d"]},
}
TOPICS = ["rivers", "bread", "owls", "glass", "kites", "tides", "maps", "bells"]


def run_one(name: str, steps: int, run_dir: Path) -> dict[str, Any]:
    """Train configuration `name` in this process and return its timings (the child side)."""
    import lightning_sdk as ls
    from lightning_sdk.training.records.metrics import read_metrics

    @ls.trace_agent
    def team(task: dict[str, Any]) -> str:
        from openai import OpenAI

        client = OpenAI()
        replies = [_sub_agent(role)(client, task["topic"]) for role in "abcd"]
        return " ".join(replies)

    config = ls.TrainerConfig(
        group_size=4,
        batch_size=2,
        max_steps=steps,
        max_tokens=16,
        learning_rate=1e-3,
        save_every=0,
        eval_every=0,
        run_dir=str(run_dir),
        progress_bar=False,
        seed=0,
        **CONFIGURATIONS[name],
    )
    tasks = [{"topic": topic} for topic in TOPICS]
    started = time.perf_counter()
    ls.Trainer(config=config, engine_options={"max_model_len": 512}).fit(
        team,
        tasks,
        reward=lambda task, answer: len(answer) / 400,  # lengths differ: every group has a spread
    )
    steps_seen = [record for record in read_metrics(run_dir) if "time_step_s" in record][1:]
    return {
        "configuration": name,
        "step_s": statistics.median(record["time_step_s"] for record in steps_seen),
        "rollout_s": statistics.median(record["time_rollout_s"] for record in steps_seen),
        "train_s": statistics.median(record["time_train_s"] for record in steps_seen),
        "weight_sync_s": statistics.median(record["time_weight_sync_s"] for record in steps_seen),
        "trained_sequences": statistics.median(record["trained_sequences"] for record in steps_seen),
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "wall_s": time.perf_counter() - started,
    }


def _sub_agent(role: str) -> Any:
    import lightning_sdk as ls

    @ls.trace_agent(name=role)
    def ask(client: Any, topic: str) -> str:
        reply = client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": f"One fact about {topic}, please."}]
        )
        return reply.choices[0].message.content or ""

    return ask


def table(results: list[dict[str, Any]], steps: int) -> str:
    lines = [
        "# Roles: what one adapter per role costs in training",
        "",
        f"Written by `python benchmarks/roles_cost.py --steps {steps}` on "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} CPU cores, the bundled",
        "135M model, an agent of four sub-agents (one call each, 16 tokens), 2 tasks x 4 episodes per step,",
        "LoRA rank 16, the engine in weight_sync='lora' in every row. Medians of the steps after the first.",
        "",
        "| configuration | step (s) | rollout (s) | update (s) | weight sync (s) | trained sequences | "
        "peak RSS (GiB) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in results:
        lines.append(
            f"| {row['configuration']} | {row['step_s']:.1f} | {row['rollout_s']:.1f} | {row['train_s']:.2f} "
            f"| {row['weight_sync_s']:.2f} | {row['trained_sequences']:.0f} | {row['peak_rss_gib']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "roles_cost.md")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_one(args.child, args.steps, args.run_dir)))
        return
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for index, name in enumerate(CONFIGURATIONS):
            print(f"[{index + 1}/{len(CONFIGURATIONS)}] {name}: training {args.steps} steps...", flush=True)
            command = [sys.executable, __file__, "--child", name, "--steps", str(args.steps)]
            command += ["--run-dir", str(Path(scratch) / f"run{index}")]
            output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            results.append(json.loads(output.strip().splitlines()[-1]))
            print(f"    step {results[-1]['step_s']:.1f} s, peak RSS {results[-1]['peak_rss_gib']:.2f} GiB")
    page = table(results, args.steps)
    args.output.write_text(page)
    args.output.with_suffix(".json").write_text(json.dumps(results, indent=2))
    print(page)


if __name__ == "__main__":
    main()
