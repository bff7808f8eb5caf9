"""What each role of the paper's SQL agent learned: the writer, the checker and the rewriter, step by step,
in two configurations side by side: one adapter per role against one shared adapter (`--compare checker`,
the default; benchmarks/results/roles_learning.md), or `credit="step"` against `"equal"` (`--compare
credit`; benchmarks/results/roles_credit.md). Reads the run folders `benchmarks/learning.py` kept.

    python benchmarks/learning.py --only sql_langchain --seeds 0 1 2 --label checker-shared \\
        --set checker=true
    python benchmarks/learning.py --only sql_langchain --seeds 0 1 2 --label checker-per-role \\
        --set checker=true --set 'roles=["write_query","check_query","rewrite_query"]' \\
        --set episode_timeout_s=900
    python benchmarks/roles_learning.py [--runs runs/learning]

    # credit="step" against "equal" on the same agent (one shared adapter, 20 steps; issue 51):
    python benchmarks/learning.py --only sql_checked --seeds 0 1 2 --label credit-equal --set steps=20
    python benchmarks/learning.py --only sql_checked --seeds 0 1 2 --label credit-step --set steps=20 \
        --set credit=step
    python benchmarks/roles_learning.py --compare credit   # writes benchmarks/results/roles_credit.md

The held-out reward says how the whole agent did; this says which role did what. From every recorded
episode (the greedy held-out evaluations every 5 steps, and the sampled training rollouts) it reads:

- writer right: the writer's first query returns the gold rows (its own call, before any check);
- checker: yes to right and no to wrong: how often the checker's verdict was right, on the writer queries
  that ran (a query that failed goes to the rewriter unchecked);
- rewrites that fixed: of the episodes the rewriter answered, the share whose final query was right;
- rewrites that broke: of the episodes whose first query was right, the share lost to a rewrite (the
  checker said no to a right query, and the rewrite was wrong).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from anywhere
RESULTS = ROOT / "benchmarks" / "results"


@dataclass(frozen=True)
class Comparison:
    """Configurations of `benchmarks/learning.py` read side by side, and where the report goes."""

    title: str
    arms: dict[str, str]
    """label -> what the configuration is."""
    result: Path


COMPARISONS = {
    "checker": Comparison(
        "shared adapter against one per role",
        {"checker-shared": "one shared adapter", "checker-per-role": "one adapter per role"},
        RESULTS / "roles_learning.md",
    ),
    "credit": Comparison(
        'credit="step" against "equal" (one shared adapter, 20 steps)',
        {"credit-equal": 'credit="equal"', "credit-step": 'credit="step"'},
        RESULTS / "roles_credit.md",
    ),
}
EXAMPLES = ("sql_langchain", "sql_checked")
"""The folders `benchmarks/learning.py` keeps this agent's runs under (`--set checker=true`, or the
`sql_checked` example)."""
WINDOWS = ((1, 5), (6, 10), (11, 15), (16, 20), (21, 25), (26, 30))
"""Training steps grouped for the sampled rollouts (each step alone is 32 episodes: too noisy)."""


@dataclass
class RoleCounts:
    """Counts over some episodes, from which every rate of the table is a ratio."""

    episodes: int = 0
    solved: int = 0
    writer_right: int = 0
    checked_right: int = 0
    yes_to_right: int = 0
    checked_wrong: int = 0
    no_to_wrong: int = 0
    rewritten: int = 0
    rewrite_fixed: int = 0
    rewrite_broke: int = 0

    def add(self, episode: Any) -> None:
        from credit_by_call import first_query  # benchmarks/, beside this script

        from lightning_sdk.examples.sql_langchain.agent import is_yes

        calls = {call.agent_name: call for call in reversed(episode.all_calls())}  # first call of each
        right = first_query(episode) == "right"
        solved = bool(episode.reward and episode.reward >= 1.0)
        self.episodes += 1
        self.solved += solved
        self.writer_right += right
        if "check_query" in calls:
            said_yes = is_yes(calls["check_query"].text)
            self.checked_right += right
            self.yes_to_right += right and said_yes
            self.checked_wrong += not right
            self.no_to_wrong += not right and not said_yes
        if "rewrite_query" in calls:
            self.rewritten += 1
            self.rewrite_fixed += solved
            self.rewrite_broke += right and not solved


def counts_by_step(
    episodes: Iterable[Any], windows: tuple[tuple[int, int], ...] | None
) -> dict[str, RoleCounts]:
    """Episodes counted per evaluation step (`windows=None`) or per window of training steps."""
    grouped: dict[str, RoleCounts] = {}
    for episode in episodes:
        step = int(episode.metadata.get("step", 0))
        key = str(step) if windows is None else next((f"{a}-{b}" for a, b in windows if a <= step <= b), "")
        if key:
            grouped.setdefault(key, RoleCounts()).add(episode)
    return grouped


def rate(part: int, whole: int) -> float:
    return part / whole if whole else float("nan")


def rates(counts: RoleCounts) -> dict[str, float]:
    return {
        "solved": rate(counts.solved, counts.episodes),
        "writer right": rate(counts.writer_right, counts.episodes),
        "checker: yes to right": rate(counts.yes_to_right, counts.checked_right),
        "checker: no to wrong": rate(counts.no_to_wrong, counts.checked_wrong),
        "rewrites that fixed": rate(counts.rewrite_fixed, counts.rewritten),
        "rewrites that broke a right query": rate(counts.rewrite_broke, counts.writer_right),
    }


def seed_folders(runs: Path, label: str) -> list[Path]:
    return sorted(folder for example in EXAMPLES for folder in (runs / label / example).glob("seed*"))


def arm_table(
    runs: Path, label: str, store_name: str, windows: tuple[tuple[int, int], ...] | None
) -> list[str]:
    """One markdown table: a row per step (or window), each rate as the mean over seeds with its range."""
    from lightning_sdk.tracing.store import EpisodeStore

    per_seed: list[dict[str, dict[str, float]]] = []
    for folder in seed_folders(runs, label):
        with EpisodeStore(folder / store_name) as store:
            per_seed.append({key: rates(c) for key, c in counts_by_step(store.episodes(), windows).items()})
    if not per_seed:
        return [f"No run folders under {runs / label}."]
    steps = sorted({key for seed in per_seed for key in seed}, key=lambda key: int(key.split("-")[0]))
    names = list(rates(RoleCounts()))
    lines = [f"| {'step' if windows is None else 'steps'} | " + " | ".join(names) + " |"]
    lines.append("|---" * (len(names) + 1) + "|")
    for step in steps:
        cells = [summary([seed[step][name] for seed in per_seed if step in seed]) for name in names]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return lines


def summary(values: list[float]) -> str:
    """Mean over seeds with the lowest and highest seed: `0.54 (0.50-0.60)`."""
    known = [value for value in values if value == value]  # NaN: nothing to count in that seed
    if not known:
        return "-"
    if len(known) == 1:
        return f"{known[0]:.2f}"
    return f"{statistics.fmean(known):.2f} ({min(known):.2f}-{max(known):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "learning", help="run folders' root")
    parser.add_argument(
        "--compare", choices=sorted(COMPARISONS), default="checker", help="which configurations to read"
    )
    args = parser.parse_args()
    comparison = COMPARISONS[args.compare]
    labels = ", ".join(f"`{label}`" for label in comparison.arms)
    lines = [
        f"# What each role learned: the paper's SQL agent, {comparison.title}",
        "",
        f"Written by `python benchmarks/roles_learning.py --compare {args.compare}` on "
        + time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        + f" from the run folders of `benchmarks/learning.py` ({labels}).",
        "Each cell: the mean over seeds (lowest-highest seed). Held-out: greedy, 50 questions per seed, the",
        "evaluation at each step. Training: the sampled rollouts (temperature 0.7), 32 episodes per step.",
        "",
    ]
    for label, title in comparison.arms.items():
        seeds = [folder.name for folder in seed_folders(args.runs, label)]
        lines += [f"## {title} (`{label}`, {', '.join(seeds) or 'no seeds yet'})", ""]
        lines += ["Held-out, greedy:", "", *arm_table(args.runs, label, "evaluations.sqlite", None), ""]
        lines += [
            "Training rollouts, sampled:",
            "",
            *arm_table(args.runs, label, "episodes.sqlite", WINDOWS),
            "",
        ]
    comparison.result.write_text("\n".join(lines))
    print(f"written: {comparison.result}")


if __name__ == "__main__":
    main()
