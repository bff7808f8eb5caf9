"""Learning over seeds: the quickstart and each example trained with K seeds, summarised as mean, spread
and worst seed. Written to benchmarks/results/learning.md (table) and benchmarks/results/learning/
(one JSON per finished seed, one plot per example with every seed's validation curve).

    python benchmarks/learning.py                                  # every example, seeds 0 1 2
    python benchmarks/learning.py --only quickstart --seeds 0 1 2 3 4
    python benchmarks/learning.py --only quickstart --label ds2 --set dynamic_sampling_rounds=2
    python benchmarks/learning.py --table                          # only rewrite the table and plots
    python benchmarks/learning.py --table --refresh-details        # also re-read kept run folders

    # step-level credit against equal (issue 51), paired by seed on three multi-call agents, 20 steps:
    python benchmarks/learning.py --only rag_openai_agents calc_two_step --label credit-equal
    python benchmarks/learning.py --only rag_openai_agents calc_two_step --label credit-step --set credit=step
    python benchmarks/learning.py --only sql_checked --label credit-equal --set steps=20
    python benchmarks/learning.py --only sql_checked --label credit-step --set steps=20 --set credit=step
    # the same pair with the engine in the policy's dtype (the default since issue 59):
    python benchmarks/learning.py --only calc_two_step --label credit-equal-agree
    python benchmarks/learning.py --only calc_two_step --label credit-step-agree --set credit=step
    python benchmarks/learning.py --only quickstart --label policies-agree
    python benchmarks/learning.py --only calc_two_step --label credit-state-value \
        --set credit=step --set step_estimate=state_value

Each seed trains in its own process (so one seed's memory or crash does not touch the next, and its
peak RSS is its own), seeding both the example's data and the trainer. A sweep resumes where it
stopped: a seed whose result file exists is skipped, so an interrupted sweep is rerun with the same
command; a seed without one trains again from step 0 in an emptied folder. `--label` names a
configuration (`--set field=value` are `TrainerConfig` overrides); results of different labels sit side
by side in the table, which is how a change to the trainer is judged.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SEEDS_DIR = RESULTS / "learning"
TABLE = RESULTS / "learning.md"
RUNS = ROOT / "runs" / "learning"  # run folders (episodes, adapters): large, not committed

EXAMPLES: dict[str, str] = {
    "quickstart": "the calculator agent, `lightning-sdk quickstart` (what `make demo` runs)",
    "calc_autogen": "calculator (AutoGen), `examples/calc_autogen/train.py`",
    "sql_langchain": "text-to-SQL (LangChain / LangGraph), `examples/sql_langchain/train.py`",
    "rag_openai_agents": "retrieval QA (OpenAI Agents SDK), `examples/rag_openai_agents/train.py`",
    "quickstart_distilled": "the quickstart after SFT on a teacher's recorded traffic (`from_traffic.py`)",
    "quickstart_judged": "the quickstart rewarded by the bundled model as judge (`from_traffic.py`)",
    "quickstart_distilled_small": "the quickstart after SFT on a small share of the teacher's traffic "
    "(a weaker warm start, `from_traffic.py`)",
    "sql_checked": "text-to-SQL with the paper's checker and rewriter (`checked_sql_agent`, one shared "
    "adapter), `examples/sql_langchain/train.py` with checker=True",
    "calc_two_step": "two-step word problems, one calculator call per step: the first call decides "
    "(`benchmarks/two_step_calc.py`)",
}

PAIRED = (
    ("credit-equal", "credit-step"),
    ("credit-equal", "credit-state-value"),
    ("credit-equal-agree", "credit-step-agree"),
)
"""Configurations compared seed by seed on the area under the validation curve (the step-credit rule of
docs/trainer.md: the second becomes the default only if its area is higher in every paired seed on at
least one example and no example loses more than one standard deviation). The `-agree` pair re-measures
the first with the engine serving in the policy's dtype (issue 59); the first ran a bfloat16 engine."""


# --- one seed, in its own process -------------------------------------------------------------------------
def train_one(
    example: str, seed: int, run_dir: Path, model: str | None, overrides: dict[str, Any]
) -> dict[str, Any]:
    """Train `example` with `seed` (data and trainer) and return the example's summary."""
    common: dict[str, Any] = {"run_dir": str(run_dir), "model": model, "curve_to": None, **overrides}
    if example == "quickstart":
        from lightning_sdk.quickstart import run_quickstart

        steps = common.pop("steps", None)
        return run_quickstart(**({"steps": steps} if steps else {}), seed=seed, **common)
    if example == "calc_autogen":
        from lightning_sdk.examples.calc_autogen.train import train as train_calc

        return train_calc(seed=seed, **common)
    if example in ("sql_langchain", "sql_checked"):
        from lightning_sdk.examples.sql_langchain.train import train as train_sql

        checker = {"checker": True} if example == "sql_checked" else {}
        return train_sql(data_seed=seed, seed=seed, **checker, **common)
    if example == "calc_two_step":
        import two_step_calc  # benchmarks/, beside this script

        common.pop("curve_to")
        return two_step_calc.train(seed, Path(common.pop("run_dir")), **common)
    if example == "rag_openai_agents":
        from lightning_sdk.examples.rag_openai_agents.train import train as train_rag

        return train_rag(data_seed=seed, seed=seed, **common)
    if example in ("quickstart_distilled", "quickstart_judged", "quickstart_distilled_small"):
        import from_traffic  # benchmarks/, beside this script

        arms = {
            "quickstart_distilled": from_traffic.distilled,
            "quickstart_judged": from_traffic.judged,
            "quickstart_distilled_small": from_traffic.distilled_small,
        }
        arm = arms[example]
        common.pop("steps", None)
        return arm(seed, Path(common.pop("run_dir")), **common)
    raise ValueError(f"unknown example {example!r}; choose from {sorted(EXAMPLES)}")


def run_worker(args: argparse.Namespace) -> None:
    """The child process: train one seed and write its result file."""
    from lightning_sdk.training.records.run_dir import read_run_info

    started = time.perf_counter()
    commit = git_commit()  # the code this seed runs (the tree may change while it trains)
    run_dir = RUNS / args.label / args.example / f"seed{args.seed}"
    if run_dir.exists():
        # A seed without a result file is run afresh. Its folder is what a stopped run left: training into
        # it would append this run's metrics and episodes to those (a stopped run's validation points
        # once entered a finished seed's curve), so it goes first.
        print(f"removing {run_dir}: left by a run that did not finish", file=sys.stderr, flush=True)
        shutil.rmtree(run_dir)
    overrides = parse_overrides(args.set)
    summary = train_one(args.example, args.seed, run_dir, args.model, overrides)
    history = read_history(run_dir)
    result = {
        "example": args.example,
        "seed": args.seed,
        "label": args.label,
        "model": args.model or "bundled SmolLM2-135M-Instruct",
        "overrides": overrides,
        "base": summary["base_reward"],
        "trained": summary["trained_reward"],
        "kept": summary.get("best_reward", math.nan),
        "kept_step": summary.get("best_step"),
        "curve": summary["curve"],
        "steps": summary["steps"],
        "training_s": sum(record.get("time_step_s", 0.0) for record in history),
        "wall_s": time.perf_counter() - started,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "signal_share": signal_share(history),
        "auc": curve_area(summary["curve"]),
        "step_group_share": mean([record.get("step_group_share", math.nan) for record in history]),
        "calls_per_episode": calls_per_episode(run_dir),
        "rollout_rounds": mean(
            [record["rollout_rounds"] for record in history if "rollout_rounds" in record]
        ),
        "extra": summary.get("extra") or {},
        "held_out": held_out_details(args.example, run_dir),
        "training_rollouts": training_details(args.example, run_dir),
        "engine_dtype": read_run_info(run_dir)["starts"][-1].get("engine_dtype"),
        "policy_dtype": read_run_info(run_dir)["starts"][-1].get("policy_dtype") or "float32",
        "policy_gap": median_of(history, "mismatch_logratio_abs"),
        "cpu": cpu(),
        "run_dir": str(run_dir),
        "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": commit,
        "load_average_at_end": os.getloadavg()[0],
    }
    out = result_path(args.label, args.example, args.seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".part")
    partial.write_text(json.dumps(result, indent=1))
    partial.replace(out)  # a killed worker leaves no half-written result behind


def recover_result(label: str, example: str, seed: int, why: str) -> None:
    """The result of a seed whose process ended after its final evaluation (a crash while writing the
    report, say), read from its run folder: every figure the worker writes except the process's peak
    memory (NaN) and its wall time, which counts from the engine's start to the last record."""
    from lightning_sdk.training.records.metrics import read_metrics
    from lightning_sdk.training.records.run_dir import read_run_info

    out = result_path(label, example, seed)
    run_dir = RUNS / label / example / f"seed{seed}"
    records = read_metrics(run_dir)
    history = [record for record in records if "reward_mean" in record]
    evaluations = [record for record in records if "val_reward" in record]
    info = read_run_info(run_dir)
    steps = info["config"]["max_steps"]
    if out.exists() or not history or int(history[-1]["step"]) != steps or evaluations[-1]["step"] != steps:
        raise SystemExit(f"{run_dir}: no finished run to recover (a result exists, or it stopped early)")
    best = max(evaluations, key=lambda record: (record["val_reward"], -record["step"]))
    start = info["starts"][-1]
    result = {
        "example": example,
        "seed": seed,
        "label": label,
        "model": "bundled SmolLM2-135M-Instruct",
        "overrides": {},
        "base": evaluations[0]["val_reward"],
        "trained": evaluations[-1]["val_reward"],
        "kept": best["val_reward"],
        "kept_step": best["step"],
        "curve": [[record["step"], record["val_reward"]] for record in evaluations],
        "steps": len(history),
        "training_s": sum(record.get("time_step_s", 0.0) for record in history),
        "wall_s": records[-1]["time"] - start["at"],
        "peak_rss_gib": math.nan,
        "signal_share": signal_share(history),
        "auc": curve_area([[record["step"], record["val_reward"]] for record in evaluations]),
        "step_group_share": mean([record.get("step_group_share", math.nan) for record in history]),
        "calls_per_episode": calls_per_episode(run_dir),
        "rollout_rounds": mean(
            [record["rollout_rounds"] for record in history if "rollout_rounds" in record]
        ),
        "extra": {},
        "held_out": held_out_details(example, run_dir),
        "training_rollouts": training_details(example, run_dir),
        "engine_dtype": start.get("engine_dtype"),
        "policy_dtype": start.get("policy_dtype") or "float32",
        "policy_gap": median_of(history, "mismatch_logratio_abs"),
        "cpu": cpu(),
        "run_dir": str(run_dir),
        "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(records[-1]["time"])),
        "commit": "recovered",
        "load_average_at_end": math.nan,
        "recovered": why,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"recovered {out}: held-out {result['base']:.3f} -> {result['trained']:.3f}", flush=True)


def read_history(run_dir: Path) -> list[dict[str, Any]]:
    from lightning_sdk.training.records.metrics import read_metrics

    return [record for record in read_metrics(run_dir) if "reward_mean" in record]


def curve_area(curve: list[Any]) -> float:
    """The area under the validation curve (trapezoids between evaluations) divided by its steps: the mean
    held-out reward over the run, which credits learning early as well as ending high."""
    points = sorted((float(step), float(reward)) for step, reward in curve)
    if len(points) < 2 or points[-1][0] == points[0][0]:
        return points[0][1] if points else math.nan
    area = math.fsum((b[0] - a[0]) * (a[1] + b[1]) / 2 for a, b in itertools.pairwise(points))
    return area / (points[-1][0] - points[0][0])


def calls_per_episode(run_dir: Path) -> float:
    """Mean calls with token ids (the ones the trainer can train) per training episode of the run."""
    from lightning_sdk.tracing.store import EpisodeStore

    path = run_dir / "episodes.sqlite"
    if not path.exists():
        return math.nan
    with EpisodeStore(path) as store:
        return mean([float(len(episode.trainable_calls())) for episode in store.episodes()])


def engine_dtype(result: dict[str, Any]) -> str:
    """The dtypes the seed's rollouts were sampled in and its policy trained in, as "engine / policy".
    Results written before the engine's was recorded (2026-11-24) all ran vLLM in its default bfloat16;
    every CPU run so far trained in float32 (recorded from 2026-11-28)."""
    return f"{result.get('engine_dtype') or 'bfloat16'} / {result.get('policy_dtype') or 'float32'}"


def median_of(history: list[dict[str, Any]], key: str) -> float:
    """The median over the steps of a metric (NaN where no step measured it: runs before it existed)."""
    values = [float(record[key]) for record in history if isinstance(record.get(key), int | float)]
    finite = sorted(value for value in values if math.isfinite(value))
    return finite[len(finite) // 2] if finite else math.nan


def peak_cell(results: list[dict[str, Any]]) -> str:
    """The largest peak RSS of the seeds; n/a when none was measured (results recovered from a folder)."""
    peaks = [float(result["peak_rss_gib"]) for result in results if math.isfinite(result["peak_rss_gib"])]
    return f"{max(peaks):.1f}" if peaks else "n/a"


def policy_gap_cell(results: list[dict[str, Any]]) -> str:
    """The seeds' mean of each run's median engine-against-trainer gap (n/a before it was measured)."""
    gaps = [result.get("policy_gap") for result in results]
    measured = [float(gap) for gap in gaps if isinstance(gap, int | float) and math.isfinite(gap)]
    return f"{mean(measured):.2g}" if measured else "n/a"


def signal_share(history: list[dict[str, Any]]) -> float:
    """Mean over steps of the share of rolled-out groups that carried a learning signal."""
    from lightning_sdk.training.records.report import signal_share as per_step

    return mean([share for _, share in per_step(history)])


def held_out_details(example: str, run_dir: Path) -> dict[str, Any]:
    """What the final evaluation got right, broken down the way each example's issue asks: per question
    template (SQL), per number of hops and searches per episode (retrieval)."""
    from lightning_sdk.tracing.store import EpisodeStore

    path = run_dir / "evaluations.sqlite"
    if not path.exists():
        return {}
    with EpisodeStore(path) as store:
        episodes = store.episodes()
    steps = sorted({episode.metadata.get("step", 0) for episode in episodes})
    details: dict[str, Any] = {}
    for when, step in (("base", steps[0]), ("trained", steps[-1])):
        evaluated = [episode for episode in episodes if episode.metadata.get("step") == step]
        details[when] = breakdown(example, evaluated)
    return details


def training_details(example: str, run_dir: Path) -> dict[str, Any]:
    """SQL only: how often the training rollouts of each kind of question were right, in the first and
    the last quarter of the steps. Thousands of sampled queries against the held-out set's one or two
    questions per kind, so this is where a kind that rises or falls shows first."""
    from lightning_sdk.tracing.store import EpisodeStore

    path = run_dir / "episodes.sqlite"
    if example not in ("sql_langchain", "sql_checked", "calc_two_step") or not path.exists():
        return {}
    with EpisodeStore(path) as store:
        episodes = store.episodes()
    steps = sorted({episode.metadata.get("step", 0) for episode in episodes})
    quarter = max(1, len(steps) // 4)
    details: dict[str, Any] = {}
    for when, chosen in (("first", steps[:quarter]), ("last", steps[-quarter:])):
        picked = [episode for episode in episodes if episode.metadata.get("step") in chosen]
        if example == "calc_two_step":
            details[f"steps {chosen[0]}-{chosen[-1]}"] = first_calls_and_answers(picked)
        else:
            details[f"steps {chosen[0]}-{chosen[-1]}"] = solved_per_kind(picked)
    return details


def first_calls_and_answers(episodes: list[Any]) -> dict[str, int]:
    """Two-step calculator: how many episodes' first call computed the first part (the decision that
    spoils the episode when wrong) and how many were solved."""
    import two_step_calc  # benchmarks/, beside this script

    by_kind: dict[str, list[int]] = {}
    for episode in episodes:
        counts = by_kind.setdefault(two_step_calc.problem_kind(episode.task), [0, 0, 0])
        counts[0] += two_step_calc.first_call_right(episode)
        counts[1] += solved(episode)
        counts[2] += 1
    return {
        "first_call_right": sum(counts[0] for counts in by_kind.values()),
        "solved": sum(counts[1] for counts in by_kind.values()),
        "episodes": len(episodes),
        "by_kind": by_kind,  # [first call right, solved, episodes] per kind of problem
    }


def solved_per_kind(episodes: list[Any]) -> dict[str, list[int]]:
    """SQL: [right, asked] per kind of question (`KINDS` of the example's data)."""
    from lightning_sdk.examples.sql_langchain.data import KINDS

    kind_of = {template: kind for kind, templates in KINDS.items() for template in templates}
    counts: dict[str, list[int]] = {kind: [0, 0] for kind in KINDS}
    for episode in episodes:
        kind = episode.task.get("kind") or kind_of[episode.task["template"]]  # tasks before the field
        counts[kind][0] += solved(episode)
        counts[kind][1] += 1
    return counts


def solved(episode: Any) -> bool:
    return episode.reward is not None and episode.reward >= 1.0


def breakdown(example: str, episodes: list[Any]) -> dict[str, Any]:
    if example in ("sql_langchain", "sql_checked"):
        by_template: dict[str, list[int]] = {}
        for episode in episodes:
            counts = by_template.setdefault(str(episode.task.get("template")), [0, 0])
            counts[0] += solved(episode)
            counts[1] += 1
        return {"solved_per_template": by_template, "solved_per_kind": solved_per_kind(episodes)}
    if example == "rag_openai_agents":
        searches = [count_tool_calls(episode) for episode in episodes]
        by_hops: dict[str, list[float]] = {}
        for episode in episodes:
            by_hops.setdefault(str(episode.task.get("hops")), []).append(episode.reward or 0.0)
        return {
            "searches_per_episode": mean(searches),
            "episodes_with_two_searches": sum(1 for count in searches if count >= 2),
            "f1_per_hops": {hops: mean(values) for hops, values in by_hops.items()},
            "exact_answers": sum(solved(episode) for episode in episodes),
            "episodes": len(episodes),
        }
    if example == "calc_two_step":
        return first_calls_and_answers(episodes)
    return {"solved": sum(solved(episode) for episode in episodes), "episodes": len(episodes)}


def count_tool_calls(episode: Any) -> int:
    return sum(len((call.response_message or {}).get("tool_calls") or []) for call in episode.all_calls())


# --- the sweep ---------------------------------------------------------------------------------------------
def result_path(label: str, example: str, seed: int) -> Path:
    return SEEDS_DIR / label / example / f"seed{seed}.json"


def run_sweep(args: argparse.Namespace) -> None:
    overrides = parse_overrides(args.set)
    todo = [(example, seed) for example in args.only for seed in args.seeds]
    for number, (example, seed) in enumerate(todo, start=1):
        path = result_path(args.label, example, seed)
        if path.exists():
            done = json.loads(path.read_text())
            if done["overrides"] != overrides or done["model"] != (
                args.model or "bundled SmolLM2-135M-Instruct"
            ):
                sys.exit(
                    f"{path} was measured with other settings ({done['overrides']}, {done['model']}); "
                    "use another --label for a new configuration, or delete the file to measure it again."
                )
            print(f"[{number}/{len(todo)}] {example} seed {seed}: done before, skipped", flush=True)
            continue
        print(f"[{number}/{len(todo)}] {example} seed {seed} ({args.label}): training...", flush=True)
        command = [sys.executable, __file__, "--worker", "--example", example, "--seed", str(seed)]
        command += ["--label", args.label, *(["--model", args.model] if args.model else [])]
        command += [item for pair in (("--set", value) for value in args.set) for item in pair]
        started = time.perf_counter()
        finished = subprocess.run(command, cwd=ROOT, check=False)
        if finished.returncode != 0 or not path.exists():
            print(f"    failed (exit code {finished.returncode}); its result is not written", flush=True)
            continue
        result = json.loads(path.read_text())
        print(
            f"    held-out {result['base']:.3f} -> {result['trained']:.3f} after {result['steps']} steps, "
            f"{(time.perf_counter() - started) / 60:.1f} min",
            flush=True,
        )
        write_table(" ".join(sys.argv[1:]))
    write_table(" ".join(sys.argv[1:]))


# --- the table and plots -----------------------------------------------------------------------------------
def load_results() -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Every finished seed, by (label, example)."""
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for path in sorted(SEEDS_DIR.glob("*/*/seed*.json")):
        result = json.loads(path.read_text())
        grouped.setdefault((result["label"], result["example"]), []).append(result)
    for results in grouped.values():
        results.sort(key=lambda result: result["seed"])
    return grouped


def write_table(command: str) -> None:
    grouped = load_results()
    if not grouped:
        print("no finished seeds yet")
        return
    lines = [
        "# Learning over seeds",
        "",
        f"Written by `{' '.join(['python benchmarks/learning.py', command]).strip()}`"
        + f" on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())};",
        f"machine writing it: {machine()}; each seed's CPU is listed below.",
        "Held-out reward is greedy, on tasks never trained on; mean ± sd over seeds",
        "(sample standard deviation), worst = the seed with the lowest trained reward. Each seed seeds the",
        "example's data and the trainer. Training = the steps' time (rollout, update, weight sync); wall =",
        "the whole process (imports, engine start, every evaluation). Gap = the median over a run's steps of",
        "mismatch_logratio_abs (engine against trainer, nats per trained token), mean over seeds; n/a for",
        "runs from before it was measured (2026-11-28).",
        "",
        "| label | example | seeds | held-out before | held-out after | change | worst seed: after (change) "
        "| steps | training (min) | wall (min) | peak RSS (GiB) | groups with signal | engine / policy dtype "
        "| gap (nats) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    ordered = sorted(grouped.items(), key=lambda item: (item[0][1], item[0][0]))
    lines += [table_row(label, example, results) for (label, example), results in ordered]
    lines += sql_kinds_section(
        [(label, results) for (label, example), results in ordered if example == "sql_langchain"]
    )
    lines += paired_section(grouped)
    lines += first_call_section(
        [(label, results) for (label, example), results in ordered if example == "calc_two_step"]
    )
    lines += ["", "Per seed (validation curve: step:reward):", ""]
    for (label, example), results in ordered:
        overrides = results[0]["overrides"]
        lines.append(
            f"- **{label} / {example}** ({EXAMPLES.get(example, example)}; overrides: {overrides or 'none'})"
        )
        for result in results:
            curve = ", ".join(f"{step}:{reward:.3f}" for step, reward in result["curve"])
            details = json.dumps(result.get("held_out", {}).get("trained") or {}, sort_keys=True)
            kept = (
                f"; adapter kept (keep_best, chosen on the held-out set): step {result['kept_step']}, "
                f"{result['kept']:.3f}"
                if result.get("kept_step") is not None
                else ""
            )
            lines.append(
                f"  - seed {result['seed']}: {result['base']:.3f} -> {result['trained']:.3f}{kept}; "
                f"curve {curve}; "
                f"{result['steps']} steps; load average at the end {result['load_average_at_end']:.1f}; "
                f"commit {result['commit']}; CPU: {result.get('cpu', 'not recorded')}; "
                f"held-out after: {details}"
                + (f"; {json.dumps(result['extra'], sort_keys=True)}" if result.get("extra") else "")
                + (
                    f"; recovered from its run folder: {result['recovered']}"
                    if result.get("recovered")
                    else ""
                )
            )
        plot(label, example, results)
    TABLE.write_text("\n".join(lines) + "\n")
    print(f"table: {TABLE}")


def paired_section(grouped: dict[tuple[str, str], list[dict[str, Any]]]) -> list[str]:
    """For each pair of `PAIRED` configurations measured on the same example: the area under the validation
    curve (mean held-out reward over the run, `curve_area`) seed by seed, whether the second is higher in
    every paired seed, and whether it loses more than one standard deviation (of the first's areas)."""
    lines: list[str] = []
    for first, second in PAIRED:
        rows = [
            row
            for example in sorted({example for label, example in grouped if label == first})
            if (second, example) in grouped
            for row in [paired_row(example, grouped[(first, example)], grouped[(second, example)])]
            if row
        ]
        if not rows:
            continue
        lines += [
            "",
            f"Paired by seed: `{second}` against `{first}`. Area = the area under the validation curve over",
            "its steps (the run's mean held-out reward). The step rule becomes the default only if its area",
            "is higher in every paired seed on at least one example and no example loses more than one sd",
            "(docs/trainer.md).",
            "",
            f"| example | seeds | area, {first} | area, {second} | change | higher in every seed "
            "| loses > 1 sd | step-group share | calls with token ids per episode |",
            "|---|---|---|---|---|---|---|---|---|",
            *rows,
        ]
    return lines


def paired_row(example: str, firsts: list[dict[str, Any]], seconds: list[dict[str, Any]]) -> str | None:
    by_seed = {result["seed"]: result for result in firsts}
    pairs = [(by_seed[result["seed"]], result) for result in seconds if result["seed"] in by_seed]
    if not pairs:
        return None
    areas = [(area_of(a), area_of(b)) for a, b in pairs]
    base = [a for a, _ in areas]
    sd = statistics.stdev(base) if len(base) > 1 else math.nan
    change = mean([b for _, b in areas]) - mean(base)
    return (
        f"| {example} | {' '.join(str(a['seed']) for a, _ in pairs)} | "
        f"{' '.join(f'{a:.3f}' for a, _ in areas)} | {' '.join(f'{b:.3f}' for _, b in areas)} | "
        f"{change:+.3f} | {'yes' if all(b > a for a, b in areas) else 'no'} | "
        f"{'yes' if change < -sd else 'no'} | "
        f"{mean([r.get('step_group_share', math.nan) for _, r in pairs]):.0%} | "
        f"{mean([r.get('calls_per_episode', math.nan) for _, r in pairs]):.1f} |"
    )


def first_call_section(configurations: list[tuple[str, list[dict[str, Any]]]]) -> list[str]:
    """The two-step calculator's deciding call: in how many held-out episodes (before and after) and
    training rollouts (first and last quarter of the steps) the first call computed the first part."""
    rows = []
    for label, results in configurations:
        for result in results:
            held_out = result.get("held_out") or {}
            quarters = list((result.get("training_rollouts") or {}).items())
            if not quarters or "first_call_right" not in (held_out.get("trained") or {}):
                continue  # a result written before these counts (`--table --refresh-details` adds them)
            before, after = _right(held_out["base"]), _right(held_out["trained"])
            trend = " -> ".join(f"{when}: {_right(counts)}" for when, counts in quarters)
            rows.append(f"| {label} | {result['seed']} | {before} | {after} | {trend} |")
    if not rows:
        return []
    return [
        "",
        "Two-step calculator, the call that decides: episodes whose first call computed the first part",
        "(right / episodes), held-out before and after, and training rollouts in the first and last quarter",
        "of the steps.",
        "",
        "| label | seed | held-out before | held-out after | training rollouts |",
        "|---|---|---|---|---|",
        *rows,
    ]


def _right(counts: dict[str, Any]) -> str:
    """`right/episodes (share)`, then per kind of problem `kind right/episodes` when recorded."""
    right, total = counts["first_call_right"], counts["episodes"]
    if not total:
        return "-"
    kinds = counts.get("by_kind") or {}
    split = "; ".join(f"{kind}: {c[0]}/{c[2]}" for kind, c in sorted(kinds.items()))
    return f"{right}/{total} ({right / total:.0%})" + (f" [{split}]" if split else "")


def area_of(result: dict[str, Any]) -> float:
    """A seed's area under its validation curve (results written before it was recorded: from the curve)."""
    return result.get("auc", curve_area(result["curve"]))


def sql_kinds_section(configurations: list[tuple[str, list[dict[str, Any]]]]) -> list[str]:
    """The SQL example per kind of question: held-out questions solved before and after in each seed,
    and the share of training rollouts that were right in the first and the last quarter of the steps."""
    lines = [
        "",
        "Text-to-SQL per kind of question: held-out solved/asked, each seed (seeds in order), before -> "
        "after; then training rollouts right, all seeds together, first -> last quarter of the steps.",
        "",
        "| label | kind | held-out before | held-out after | seeds above 0 after | training rollouts right |",
        "|---|---|---|---|---|---|",
    ]
    for label, results in configurations:
        for kind in kind_names(results):
            before = [kind_counts(result, "base", kind) for result in results]
            after = [kind_counts(result, "trained", kind) for result in results]
            lines.append(
                f"| {label} | {kind} | {' '.join(f'{a}/{b}' for a, b in before)} | "
                f"{' '.join(f'{a}/{b}' for a, b in after)} | {sum(1 for a, _ in after if a > 0)} of "
                f"{len(results)} | {training_trend(results, kind)} |"
            )
    return lines if len(lines) > 6 else []


def kind_names(results: list[dict[str, Any]]) -> list[str]:
    names: list[str] = []
    for result in results:
        for kind in (result.get("held_out", {}).get("trained") or {}).get("solved_per_kind", {}):
            if kind not in names:
                names.append(kind)
    return names


def kind_counts(result: dict[str, Any], when: str, kind: str) -> tuple[int, int]:
    counts = (result.get("held_out", {}).get(when) or {}).get("solved_per_kind", {}).get(kind, [0, 0])
    return counts[0], counts[1]


def training_trend(results: list[dict[str, Any]], kind: str) -> str:
    """`right/asked (share) -> right/asked (share)` over the seeds that kept their training rollouts."""
    totals = {"first": [0, 0], "last": [0, 0]}
    for result in results:
        quarters = list((result.get("training_rollouts") or {}).items())
        if len(quarters) != 2:
            return "not recorded"
        for when, (_, counts) in zip(("first", "last"), quarters, strict=True):
            totals[when][0] += counts[kind][0]
            totals[when][1] += counts[kind][1]
    return " -> ".join(
        f"{right}/{asked} ({right / asked:.0%})" if asked else "0/0" for right, asked in totals.values()
    )


def refresh_details() -> None:
    """Recompute the held-out and training breakdowns of finished seeds from their kept run folders
    (runs/learning/...), e.g. after a new breakdown was added; seeds without a folder stay as they are."""
    for path in sorted(SEEDS_DIR.glob("*/*/seed*.json")):
        result = json.loads(path.read_text())
        run_dir = Path(result["run_dir"])
        if (
            not run_dir.exists()
            or run_dir != RUNS / result["label"] / result["example"] / f"seed{result['seed']}"
        ):
            continue  # gone, or a relabelled result whose folder now holds another configuration's run
        result["held_out"] = held_out_details(result["example"], run_dir)
        result["training_rollouts"] = training_details(result["example"], run_dir)
        path.write_text(json.dumps(result, indent=1))
        print(f"refreshed {path.relative_to(ROOT)}")


def table_row(label: str, example: str, results: list[dict[str, Any]]) -> str:
    """One configuration's line of the table: held-out before and after over its seeds, and its costs."""
    base = [result["base"] for result in results]
    after = [result["trained"] for result in results]
    change = [a - b for a, b in zip(after, base, strict=True)]
    worst = min(results, key=lambda result: result["trained"])
    seeds = ", ".join(str(result["seed"]) for result in results)
    cells = [
        label,
        example,
        f"{len(results)} ({seeds})",
        spread(base),
        f"**{spread(after)}**",
        spread(change, signed=True),
        f"{worst['trained']:.3f} ({worst['trained'] - worst['base']:+.3f}, seed {worst['seed']})",
        spread([result["steps"] for result in results], digits=1),
        f"{mean([result['training_s'] / 60 for result in results]):.1f}",
        f"{mean([result['wall_s'] / 60 for result in results]):.1f}",
        peak_cell(results),
        f"{mean([result['signal_share'] for result in results]):.0%}",
        ", ".join(sorted({engine_dtype(result) for result in results})),
        policy_gap_cell(results),
    ]
    return "| " + " | ".join(cells) + " |"


def plot(label: str, example: str, results: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    for result in results:
        steps, rewards = zip(*result["curve"], strict=True) if result["curve"] else ((), ())
        axes.plot(steps, rewards, marker="o", markersize=3, label=f"seed {result['seed']}")
    axes.set_xlabel("step")
    axes.set_ylabel("held-out reward (greedy)")
    axes.set_title(f"{example} ({label}): every seed")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(SEEDS_DIR / f"{label}-{example}.png")
    plt.close(figure)


# --- small helpers ------------------------------------------------------------------------------------------
def mean(values: list[float]) -> float:
    finite = [value for value in values if isinstance(value, (int, float)) and math.isfinite(value)]
    return math.fsum(finite) / len(finite) if finite else math.nan


def spread(values: list[float], signed: bool = False, digits: int = 3) -> str:
    centre = mean(values)
    text = f"{centre:+.{digits}f}" if signed else f"{centre:.{digits}f}"
    if len(values) > 1:
        text += f" ± {statistics.stdev(values):.{digits}f}"
    return text


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """`field=value` pairs; values are read as JSON when they parse (numbers, booleans), else as text."""
    overrides: dict[str, Any] = {}
    for item in items:
        name, separator, value = item.partition("=")
        if not separator or not name:
            sys.exit(f"--set {item!r}: write it as field=value, e.g. --set dynamic_sampling_rounds=2")
        try:
            overrides[name] = json.loads(value)
        except json.JSONDecodeError:
            overrides[name] = value
    return overrides


def git_commit() -> str:
    """The commit measured, with `+changes` when the working tree differed from it."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        changes = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+changes" if changes else "")


def machine() -> str:
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} CPU cores, {memory_gib:.0f} GiB, no GPU ({platform.machine()}, {cpu()})"


def cpu() -> str:
    """The CPU's model name and whether it has bfloat16 arithmetic (AVX512-BF16 or AMX): with it an engine
    serving alone samples in bfloat16 at full speed, without it in float32 (see engine/placement.py); a
    training run's engine serves in float32 on both since 2026-11-28."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    names = [line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")]
    flags = set(
        next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    )
    bf16 = "bfloat16 arithmetic" if flags & {"avx512_bf16", "amx_bf16"} else "no bfloat16 arithmetic"
    return f"{names[0] if names else platform.machine()}, {bf16}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=sorted(EXAMPLES), default=list(EXAMPLES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--label", default="default", help="name of this configuration in the table")
    parser.add_argument(
        "--set", action="append", default=[], metavar="FIELD=VALUE", help="TrainerConfig override"
    )
    parser.add_argument("--model", default=None, help="Hugging Face model (default: the bundled 135M model)")
    parser.add_argument("--table", action="store_true", help="only rewrite the table and plots")
    parser.add_argument(
        "--refresh-details",
        action="store_true",
        help="with --table: first recompute the per-kind breakdowns from the kept run folders",
    )
    parser.add_argument(
        "--recover",
        metavar="WHY",
        help="write the result of each --only/--seeds seed whose process ended after its final evaluation "
        "(its run folder holds every step), saying WHY; then rewrite the table",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--example", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run_worker(args)
    elif args.recover:
        for example in args.only:
            for seed in args.seeds:
                recover_result(args.label, example, seed, args.recover)
        write_table(f"--recover ... --label {args.label}")
    elif args.table:
        if args.refresh_details:
            refresh_details()
        write_table("--table")
    else:
        run_sweep(args)


if __name__ == "__main__":
    main()
