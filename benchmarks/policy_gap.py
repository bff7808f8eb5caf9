"""The gap between the policy that samples and the policy that learns, by the engine's dtype (issue 59).

Trains the quickstart's calculator agent for a few steps with the engine serving in each dtype asked for,
beside the float32 policy, and reads what every step measured (`metrics.jsonl`): the `mismatch_*`
metrics (mean |log ratio| between the engine's sampling log-probability and the trainer's, the k3 KL
estimate, the share of tokens whose ratio is outside [1/2, 2], the share of the loss's signal the
truncated importance weights removed) and the seconds of the rollout, the update and the step.

    python benchmarks/policy_gap.py                                  # bfloat16 and float32, seed 0
    python benchmarks/policy_gap.py --dtypes float32 --steps 6 --seed 1

Each dtype runs in a process of its own (one engine per process). Results: one JSON per run under
benchmarks/results/policy_gap/, and the table benchmarks/results/policy_gap.md (rewritten from every JSON
there). Learning over seeds is `benchmarks/learning.py`'s business; this measures the gap and the time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from learning import cpu  # benchmarks/, beside this script: the CPU and whether it has bfloat16

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "policy_gap"
TABLE = ROOT / "benchmarks" / "results" / "policy_gap.md"
RUNS = ROOT / "runs" / "policy_gap"
GAP_KEYS = ("mismatch_logratio_abs", "mismatch_kl", "mismatch_tail_share", "mismatch_signal_removed")
TIME_KEYS = ("time_rollout_s", "time_train_s", "time_step_s")


def train_one(dtype: str, steps: int, seed: int, run_dir: Path) -> None:
    """In the child process: the quickstart with an engine serving in `dtype`."""
    from lightning_sdk.engine import VLLMEngine
    from lightning_sdk.quickstart import run_quickstart

    engine = VLLMEngine(None, dtype=dtype, seed=seed)
    try:
        run_quickstart(steps, run_dir, report=False, engine=engine, seed=seed, test_size=8, eval_every=0)
    finally:
        engine.shutdown()


def read_run(run_dir: Path) -> dict[str, Any]:
    """Per-step gap and time from a finished run folder."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    steps = [record for record in records if "reward_mean" in record]
    run_info = json.loads((run_dir / "run.json").read_text())
    start = run_info["starts"][-1]
    return {
        "engine_dtype": start.get("engine_dtype"),
        "policy_dtype": start.get("policy_dtype"),
        "steps": [
            {key: record.get(key) for key in ("step", "reward_mean", *GAP_KEYS, *TIME_KEYS)}
            for record in steps
        ],
    }


def _median(values: list[Any]) -> float:
    numbers = [float(value) for value in values if isinstance(value, int | float) and math.isfinite(value)]
    return statistics.median(numbers) if numbers else float("nan")


def write_table() -> None:
    rows = []
    for path in sorted(RESULTS.glob("*.json")):
        result = json.loads(path.read_text())
        steps = result["steps"]
        gap = [_median([step[key] for step in steps]) for key in GAP_KEYS]
        gaps = [step["mismatch_logratio_abs"] for step in steps]
        worst = max(
            (float(gap) for gap in gaps if isinstance(gap, int | float) and math.isfinite(gap)),
            default=math.nan,
        )
        times = [_median([step[key] for step in steps[1:] or steps]) for key in TIME_KEYS]
        rows.append(
            f"| {result['engine_dtype']} | {result['policy_dtype']} | {result['seed']} | {len(steps)} | "
            f"{gap[0]:.2g} | {worst:.2g} | {gap[1]:.2g} | {gap[2]:.2%} | {gap[3]:.2%} | "
            f"{times[0]:.1f} | {times[1]:.1f} | {times[2]:.1f} | {result['cpu']} | {result['date']} |"
        )
    TABLE.write_text(
        "# The gap between the engine's policy and the trainer's, by engine dtype\n\n"
        "Written by `python benchmarks/policy_gap.py` (the quickstart's agent and settings, 8 held-out\n"
        "tasks, no evaluation between steps; each row one run). Gap columns: the median over the run's\n"
        "steps of each step's value over its trained tokens; |log r| max = the largest step's mean.\n"
        "Seconds: medians over the steps after the first (the first pays one-off warm-up).\n\n"
        "| engine dtype | policy dtype | seed | steps | mean abs log ratio | its worst step | KL (k3) | "
        "ratio outside [1/2, 2] | signal removed by the weights | rollout s | update s | step s | CPU | "
        "date |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--table", action="store_true", help="only rewrite the table")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        train_one(args.child, args.steps, args.seed, RUNS / f"{args.child}-seed{args.seed}")
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    for dtype in [] if args.table else args.dtypes:
        run_dir = RUNS / f"{dtype}-seed{args.seed}"
        if run_dir.exists():
            subprocess.run(["rm", "-rf", str(run_dir)], check=True)
        command = [
            sys.executable,
            __file__,
            "--child",
            dtype,
            "--steps",
            str(args.steps),
            "--seed",
            str(args.seed),
        ]
        started = time.time()
        subprocess.run(command, check=True, env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
        result = {
            **read_run(run_dir),
            "seed": args.seed,
            "wall_s": time.time() - started,
            "cpu": cpu(),
            "date": time.strftime("%Y-%m-%d", time.gmtime()),
        }
        (RESULTS / f"{dtype}-seed{args.seed}.json").write_text(json.dumps(result, indent=1) + "\n")
        print(f"{dtype}: {json.dumps(result['steps'][-1])}", flush=True)
    write_table()
    print(TABLE.read_text())


if __name__ == "__main__":
    main()
