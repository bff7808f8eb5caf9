"""Rollouts that run on through the update (issue 60): wall time and learning, by `max_staleness`.

An agent on the bundled model that waits on a tool as real agents do: each episode makes one to three tool
calls of 0.5-3 s (one episode in eight waits six times longer: the heavy tail), then answers a sum with
one model call, scored 1 when the reply is the number alone and 0.5 when the right number is in it. The
arms train the same number of steps on the same tasks, seeds paired:

    s0         max_staleness=0 (the step-by-step loop)
    s1, s2     max_staleness=1 and 2
    s1-nocap   max_staleness=1 without the truncated importance weight (importance_sampling_cap=None)
    s2-wide    max_staleness=2 with every held episode running at once (max_concurrency=96, not the
               default 32, with which the later groups queue for a slot)
    instant-s0, instant-s1   the same with an instant tool: the control, where the gain should vanish
    lora-s0, lora-s2   the engine in LoRA mode (weight_sync="lora", the GPU's default; the CPU's is
               "merge"), where every request goes through the LoRA kernels; lora-s2 is compared with
               lora-s0. In both modes, with S >= 1 an evaluation between steps runs beside training on
               the evaluated step's pinned adapter (eval_beside_training; in merge mode since 007be0e, as
               a difference to the merged weights: the runs from before, whose next update waited for
               each evaluation, are in async_rollouts/evaluations-waited/)
    lora-s2-wait   lora-s2 with eval_beside_training=False: the next update waits for each evaluation
    dyn-s0, dyn-s2   s0 and s2 with dynamic sampling (dynamic_sampling_rounds=2): a step trains on four
               groups that carry a learning signal, so every arm trains the same samples a step. Step by
               step each extra round is another wait on the tools; overlapped, the groups in flight
               supply it. dyn-s2 is compared with dyn-s0
    s1-same-time   max_staleness=1 for as long as the paired s0 run trained (its wall time less its
                   final evaluation; up to 4x the steps): what the time saved buys. Not one of the
                   written rule's arms, which train the same number of steps; run it after s0.

    python benchmarks/async_rollouts.py --arms s0 s1 --seeds 0          # one pair
    python benchmarks/async_rollouts.py                                  # every arm, seeds 0 1 2

Each run is a process of its own (one engine per process). Results: one JSON per run under
benchmarks/results/async_rollouts/, and benchmarks/results/async_rollouts.md (rewritten from every JSON
there that ran this protocol; the 16-step runs on 24 held-out tasks are in async_rollouts/16-steps/ and
async_rollouts-16-steps.md): wall time per step and in total, the engine's busy share, held-out reward
against wall-clock time, time to 90% of the paired s0 run's final held-out reward, staleness, and the
predicted speed-up (T_rollout + T_update) / max(T_rollout, T_update) from the s0 run's own phases.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from learning import cpu  # benchmarks/, beside this script: the CPU and whether it has bfloat16

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "async_rollouts"
TABLE = ROOT / "benchmarks" / "results" / "async_rollouts.md"
RUNS = ROOT / "runs" / "async_rollouts"

ARMS: dict[str, dict[str, Any]] = {
    "s0": {"max_staleness": 0},
    "s1": {"max_staleness": 1},
    "s2": {"max_staleness": 2},
    "s1-nocap": {"max_staleness": 1, "importance_sampling_cap": None},
    "instant-s0": {"max_staleness": 0, "instant_tool": True},
    "instant-s1": {"max_staleness": 1, "instant_tool": True},
    "s1-same-time": {"max_staleness": 1, "same_time_as": "s0"},
    "s2-wide": {"max_staleness": 2, "max_concurrency": 96},
    "lora-s0": {"max_staleness": 0, "weight_sync": "lora"},
    "lora-s2": {"max_staleness": 2, "weight_sync": "lora"},
    "lora-s2-wait": {"max_staleness": 2, "weight_sync": "lora", "eval_beside_training": False},
    "dyn-s0": {"max_staleness": 0, "dynamic_sampling_rounds": 2},
    "dyn-s2": {"max_staleness": 2, "dynamic_sampling_rounds": 2},
}
# 32 steps: by 16 the held-out reward was still climbing steeply in every arm (0.25-0.31 at step 12,
# 0.33-0.38 at 16), so an arm whose samples lag a step or two was judged mid-climb; by 32 it levels off
# (S=1 for S=0's time: 0.35-0.40 from step 24). 96 held-out tasks: on 24 a greedy score moved in steps of
# 0.021, more than the spread of S=0's three finals (0.012) that the rule's floor is made of.
STEPS, GROUP_SIZE, BATCH_SIZE, EVAL_EVERY, HELD_OUT = 32, 8, 4, 4, 96


def make_tasks(seed: int, count: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [
        {"id": i, "a": rng.randint(2, 19), "b": rng.randint(2, 19), "tools": rng.randint(1, 3)}
        for i in range(count)
    ]


def tool_wait(rng: random.Random) -> float:
    """Seconds one tool call takes: 0.5-3 s, and one episode's call in eight six times longer."""
    seconds = rng.uniform(0.5, 3.0)
    return seconds * 6 if rng.random() < 1 / 8 else seconds


def build_agent(instant_tool: bool, seed: int) -> Any:
    import openai

    import lightning_sdk as ls

    counter, lock = [0], threading.Lock()

    @ls.reward
    def exact_sum(task: dict[str, Any], reply: str) -> float:
        """1 for the number alone; 0.5 for the right number inside other words ("12 + 13 = 25"), which the
        base model writes about a third of the time, so groups have a spread to learn from."""
        total = str(task["a"] + task["b"])
        if reply.strip().rstrip(".") == total:
            return 1.0
        return 0.5 if re.search(rf"(?<!\d){total}(?!\d)", reply) else 0.0

    @ls.trace_agent(name="summer")
    def summer(task: dict[str, Any]) -> str:
        with lock:  # a different wait for every episode, reproducible from the seed
            counter[0] += 1
            rng = random.Random(f"{seed}:{counter[0]}")
        for _ in range(task["tools"]):
            if not instant_tool:
                time.sleep(tool_wait(rng))  # the tool: a search, a test run, a query
        question = f"What is {task['a']} + {task['b']}? Reply with the number only."
        reply = openai.OpenAI().chat.completions.create(
            model="policy", messages=[{"role": "user", "content": question}], max_tokens=12
        )
        answer = reply.choices[0].message.content or ""
        exact_sum(task, answer)
        return answer

    return summer


def train_one(arm: str, seed: int, run_dir: Path) -> None:
    """In the child process: one arm, one seed."""
    import lightning_sdk as ls

    settings = dict(ARMS[arm])
    instant = settings.pop("instant_tool", False)
    steps = STEPS
    timed_by = settings.pop("same_time_as", None)
    if timed_by is not None:  # the clock ends the run, not the step count
        settings["max_time_s"] = training_seconds(
            json.loads((RESULTS / f"{timed_by}-seed{seed}.json").read_text())
        )
        steps = 4 * STEPS
    config = ls.TrainerConfig(
        group_size=GROUP_SIZE,
        batch_size=BATCH_SIZE,
        max_steps=steps,
        learning_rate=1e-4,
        eval_every=EVAL_EVERY,
        save_every=0,
        seed=seed,
        run_dir=str(run_dir),
        max_tokens=12,
        **settings,
    )
    agent = build_agent(instant, seed)
    train_tasks, held_out = make_tasks(1000 + seed, 64), make_tasks(2000 + seed, HELD_OUT)
    ls.Trainer(config=config).fit(agent, train_tasks, val_dataset=held_out)


def training_seconds(run: dict[str, Any]) -> float:
    """How long a stored run's loop ran: from its first evaluation's end to its last step's end, i.e. its
    wall time less the final evaluation (runs from before `time_eval_s` was kept count 20 s for it)."""
    final = run["held_out"][-1].get("time_eval_s")
    return float(run["wall_s"] - (final if final is not None else 20.0))


def read_run(run_dir: Path) -> dict[str, Any]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    info = json.loads((run_dir / "run.json").read_text())
    started = min(record["time"] for record in records)
    steps = [record for record in records if "reward_mean" in record]
    evals = [record for record in records if "val_reward" in record]
    step_ended = {record["step"]: record["time"] for record in steps}
    defaults = {"staleness_mean": 0.0, "groups_too_old": 0.0, "calls_held": 0}

    def known_at(r: dict[str, Any]) -> float:
        """When the score was known: an evaluation beside training is recorded at the first step boundary
        after it ended, so its end is its step's end plus its own seconds; others are recorded as they end."""
        if r.get("eval_beside_training"):
            return step_ended[r["step"]] + r["time_eval_s"]
        return float(r["time"])

    return {
        "engine_dtype": info["starts"][-1].get("engine_dtype"),
        "steps": [{**defaults, **r} for r in steps],  # every metric, for columns not yet in the table
        "held_out": [
            {
                "step": r["step"],
                "seconds": known_at(r) - started,
                "reward": r["val_reward"],
                "time_eval_s": r.get("time_eval_s"),
                "beside_groups": "eval_groups_in_flight" in r or bool(r.get("eval_beside_training")),
            }
            for r in evals
        ],
        "wall_s": max(record["time"] for record in records) - started,
    }


def _median(values: list[Any]) -> float:
    numbers = [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]
    return statistics.median(numbers) if numbers else math.nan


def time_to(held_out: list[dict[str, Any]], target: float, clock: str = "seconds") -> float:
    """Seconds (`clock`: "seconds" since the start, or "train_seconds" without the evaluations) until the
    held-out reward first reached `target` (inf when it never did)."""
    times = [point[clock] for point in held_out if point["reward"] >= target]
    return times[0] if times else math.inf


def with_train_clock(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The held-out points with `train_seconds`: the run's time from the start of its first step to the
    point's step, less the evaluations in between, so the arms compare on the time their training took
    (every arm evaluates the same points). An evaluation that ran beside the groups in flight (its record
    has `eval_groups_in_flight`) is not subtracted: the rollouts went on through it. An evaluation's own
    seconds are its record's `time_eval_s`;
    runs from before that metric count from one step's end to the next step's start, which is the same
    for step-by-step runs and NaN for overlapped ones (their gap also holds the wait for running groups,
    which is training time)."""
    overlapped = any(s.get("groups_in_flight") is not None for s in run["steps"])
    steps = {s["step"]: s for s in run["steps"]}
    if not all("time" in step for step in steps.values()):  # stored before every metric was kept
        return [{**point, "train_seconds": math.nan} for point in run["held_out"]]
    first = steps[min(steps)]
    started = first["time"] - first["time_step_s"]
    points, evaluations = [], 0.0
    for point in run["held_out"]:
        step = point["step"]
        if step == 0:
            points.append({**point, "train_seconds": 0.0})
            continue
        points.append({**point, "train_seconds": steps[step]["time"] - started - evaluations})
        if point.get("beside_groups"):  # the groups in flight ran on through it: not time lost to training
            continue
        if point.get("time_eval_s") is not None:
            evaluations += point["time_eval_s"]
        elif overlapped:
            evaluations = math.nan
        elif step + 1 in steps:  # the evaluation after `step` ran until the next step started
            after = steps[step + 1]
            evaluations += after["time"] - after["time_step_s"] - steps[step]["time"]
    return points


def late_training_reward(run: dict[str, Any]) -> float:
    """The mean reward of the training episodes of the run's second half (steps 17-32: 512 episodes).
    Not part of the rule: a steadier reading of how much was learnt per step than one held-out score,
    whose greedy replies on 96 tasks move in steps of 0.005 and swing 0.02-0.05 between evaluations. It
    is conservative for S >= 1, whose episodes were sampled by weights a step or two older."""
    half = run["steps"][len(run["steps"]) // 2 :]
    return float(statistics.mean(step["reward_mean"] for step in half))


def _spread(values: list[float]) -> str:
    """Mean ± sample standard deviation, and the worst (lowest) value."""
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {sd:.3f} (worst {min(values):.3f})"


def baseline_arm(arm: str) -> str:
    """The S=0 arm an arm is compared with: of the same tool and engine mode."""
    for family in ("instant-", "lora-", "dyn-"):
        if arm.startswith(family):
            return f"{family}s0"
    return "s0"


def summary(results: list[dict[str, Any]]) -> str:
    """Per arm over its seeds: seconds a step, minutes in all, the final held-out reward, and each seed's
    wall time to 90% of its paired s0 run's final score as a ratio of s0's; then the written rule (docs/
    trainer.md): an S passes when in every paired seed that ratio is at most 0.6 and its final score is no
    more than one standard deviation (of the s0 finals) below s0's mean; the instant-tool control passes
    when its whole run is within 10% of instant-s0's in every seed."""
    by_arm: dict[str, dict[int, dict[str, Any]]] = {}
    for r in results:
        by_arm.setdefault(r["arm"], {})[r["seed"]] = r
    final = {arm: [runs[s]["held_out"][-1]["reward"] for s in sorted(runs)] for arm, runs in by_arm.items()}

    def floor_of(base_arm: str) -> float:
        s0 = final.get(base_arm, [])
        return statistics.mean(s0) - (statistics.stdev(s0) if len(s0) > 1 else 0.0) if s0 else math.nan

    lines = [
        "| arm | seeds | s / step (mean) | total min (mean) | final held-out, mean ± sd (worst) | "
        "wall time to 90% of s0, by seed | late training reward against s0, by seed | the rule |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm in sorted(by_arm):
        runs = by_arm[arm]
        base_arm = baseline_arm(arm)
        ratios = []
        for seed, run in sorted(runs.items()):
            base = by_arm.get(base_arm, {}).get(seed)
            if base is None:
                continue
            target = 0.9 * base["held_out"][-1]["reward"]
            ratios.append(time_to(run["held_out"], target) / time_to(base["held_out"], target))
        if arm == base_arm:
            verdict = "the baseline"
        elif arm == "s1-same-time":
            verdict = "equal wall time (outside the rule, which trains the same steps)"
        elif base_arm == "instant-s0":
            totals = [
                runs[s]["wall_s"] / by_arm[base_arm][s]["wall_s"] for s in runs if s in by_arm[base_arm]
            ]
            within = all(abs(total - 1) <= 0.10 for total in totals)
            shown = ", ".join(f"{total:.2f}x" for total in totals)
            verdict = f"{'within' if within else 'not within'} 10% of instant-s0 ({shown})"
        else:
            reasons = []
            if not (all(ratio <= 0.6 for ratio in ratios) and len(ratios) == len(runs)):
                reasons.append("over 0.6x in a seed")
            # A score exactly at the floor is not below it: held-out scores are multiples of 1/192, and
            # the mean less the sd of such numbers can land a rounding error above one of them.
            if not all(score >= floor_of(base_arm) - 1e-9 for score in final[arm]):
                reasons.append(f"a seed ends over one sd below {base_arm}'s mean")
            verdict = f"fails: {'; '.join(reasons)}" if reasons else "passes"
        steps = [
            _median([s["time_step_s"] for s in (run["steps"][1:] or run["steps"])]) for run in runs.values()
        ]
        late = [
            late_training_reward(run) - late_training_reward(by_arm[base_arm][seed])
            for seed, run in sorted(runs.items())
            if seed in by_arm.get(base_arm, {}) and arm not in (base_arm, "s1-same-time")
        ]
        lines.append(
            f"| {arm} | {len(runs)} | {statistics.mean(steps):.1f} | "
            f"{statistics.mean(run['wall_s'] for run in runs.values()) / 60:.1f} | {_spread(final[arm])} | "
            f"{', '.join(f'{ratio:.2f}x' for ratio in ratios)} | "
            f"{', '.join(f'{d:+.3f}' for d in late) or '-'} | {verdict} |"
        )
    return "\n".join(lines) + "\n"


def write_table() -> None:
    protocol = {"steps": STEPS, "batch_size": BATCH_SIZE, "held_out": HELD_OUT}
    stored = [json.loads(path.read_text()) for path in sorted(RESULTS.glob("*.json"))]
    results = [r for r in stored if r.get("protocol") == protocol]  # runs of another length elsewhere
    baseline = {(r["seed"], r["arm"]): r for r in results if r["arm"] == baseline_arm(r["arm"])}
    rows = []
    for r in sorted(results, key=lambda r: (r["arm"], r["seed"])):
        steps = r["steps"][1:] or r["steps"]  # the first step pays the warm-up
        base = baseline.get((r["seed"], baseline_arm(r["arm"])))
        target = 0.9 * base["held_out"][-1]["reward"] if base else math.nan
        reach = time_to(r["held_out"], target) if base else math.nan
        base_reach = time_to(base["held_out"], target) if base else math.nan
        ratio = reach / base_reach if base and math.isfinite(reach) and base_reach > 0 else math.nan
        train = time_to(with_train_clock(r), target, "train_seconds") if base else math.nan
        base_train = time_to(with_train_clock(base), target, "train_seconds") if base else math.nan
        train_ratio = train / base_train if base and math.isfinite(train) and base_train > 0 else math.nan
        rollout, update = (
            _median([s["time_rollout_s"] for s in steps]),
            _median([(s["time_step_s"] or 0) - (s["time_rollout_s"] or 0) for s in steps]),
        )
        predicted = (rollout + update) / max(rollout, update) if r["arm"].endswith("s0") else math.nan
        rows.append(
            f"| {r['arm']} | {r['seed']} | {len(r['steps'])} | "
            f"{_median([s['time_step_s'] for s in steps]):.1f} | "
            f"{r['wall_s'] / 60:.1f} | {_median([s['engine_busy_share'] for s in steps]):.0%} | "
            f"{r['held_out'][0]['reward']:.3f} → {r['held_out'][-1]['reward']:.3f} | "
            f"{reach / 60:.1f} ({ratio:.2f}x) | {train / 60:.1f} ({train_ratio:.2f}x) | "
            f"{_median([s['staleness_mean'] for s in steps]):.2f} | "
            f"{sum(s['groups_too_old'] or 0 for s in r['steps']):.0f} | {predicted:.2f} | "
            f"{r['engine_dtype']} | {r['cpu']} | {r['date']} |"
        )
    TABLE.write_text(
        "# Rollouts that run on through the update, by max_staleness\n\n"
        "Written by `python benchmarks/async_rollouts.py` (the docstring names the agent and the arms; "
        f"{STEPS} steps (s1-same-time: s0's time) of {BATCH_SIZE} groups of {GROUP_SIZE}, held-out reward "
        f"every {EVAL_EVERY} steps on {HELD_OUT} tasks; each row one run). Seconds per step: the median "
        "after the first step. Time to 90%: minutes until the held-out reward first reached 90% of the "
        "paired s0 run's final one (its ratio to s0's own time in brackets), on the wall clock and on "
        "the training clock (the same less the evaluations, which every arm runs alike). Predicted "
        "speed-up (s0 rows): (T_rollout + T_update) / max(T_rollout, T_update) from that run's median "
        "phases.\n\n"
        "| arm | seed | steps | s / step | total min | engine busy | held-out first → last | "
        "min to 90% of s0 | training min to 90% | staleness (mean) | groups too old | predicted "
        "speed-up | engine dtype | CPU | date |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n\n"
        "## By arm, over the seeds\n\n" + summary(results)
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--table", action="store_true", help="only rewrite the table")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        arm, seed = args.child
        train_one(arm, int(seed), RUNS / f"{arm}-seed{seed}")
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    for seed in [] if args.table else args.seeds:
        for arm in args.arms:  # paired: every arm of a seed before the next seed
            run_dir = RUNS / f"{arm}-seed{seed}"
            if run_dir.exists():
                subprocess.run(["rm", "-rf", str(run_dir)], check=True)
            started = time.time()
            command = [sys.executable, __file__, "--child", arm, str(seed)]
            subprocess.run(command, check=True, env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
            result = {
                "arm": arm,
                "seed": seed,
                "protocol": {"steps": STEPS, "batch_size": BATCH_SIZE, "held_out": HELD_OUT},
                **read_run(run_dir),
                "process_s": time.time() - started,
                "cpu": cpu(),
                "date": time.strftime("%Y-%m-%d", time.gmtime()),
            }
            (RESULTS / f"{arm}-seed{seed}.json").write_text(json.dumps(result, indent=1) + "\n")
            write_table()
            print(f"{arm} seed {seed}: {result['wall_s'] / 60:.1f} min", flush=True)
    write_table()
    print(TABLE.read_text())


if __name__ == "__main__":
    main()
