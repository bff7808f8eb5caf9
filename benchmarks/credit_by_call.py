"""What credit gave each call of the two-step calculator, by the situation it was in.

Reads the training episodes of `benchmarks/learning.py --only calc_two_step` runs (each call keeps the
advantage it was trained with in `call.metadata`, under every credit rule) and prints the mean advantage
of first and second calls, split by whether the first call computed the first part (the decision a
second call cannot repair) and whether the episode was solved:

    python benchmarks/credit_by_call.py runs/learning/credit-equal/calc_two_step/seed0 \
        runs/learning/credit-step/calc_two_step/seed0

Under `credit="equal"` both calls of an episode get its advantage; under `credit="step"` a second call
is also compared with the second calls that faced the same state (the same first result), so one after
a wrong first call should be blamed less, and one that spoiled a right first call more.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

import two_step_calc  # benchmarks/, beside this script

from lightning_sdk.tracing.store import EpisodeStore


def advantages_by_situation(run_dir: Path) -> dict[tuple[int, bool, bool], list[float]]:
    """(call number, first call right, solved) -> the advantages those trained calls got."""
    path = run_dir / "episodes.sqlite"
    if not path.is_file():
        raise SystemExit(f"{run_dir}: no episodes.sqlite here; pass a run folder of benchmarks/learning.py")
    with EpisodeStore(path) as store:
        episodes = store.episodes()
    if not episodes or not all(
        isinstance(episode.task, dict) and "expression" in episode.task for episode in episodes
    ):
        # Other agents' calls have no "first part" to be right about: every call would read as wrong.
        raise SystemExit(
            f"{run_dir}: not a calc_two_step run (its tasks have no 'expression'); this report "
            "reads the two-step calculator's runs only"
        )
    found: dict[tuple[int, bool, bool], list[float]] = {}
    for episode in episodes:
        situation = (two_step_calc.first_call_right(episode), (episode.reward or 0.0) >= 1.0)
        for number, call in enumerate(episode.all_calls()[:2], start=1):
            advantage = call.metadata.get("advantage")
            if advantage is not None:  # untrained calls (a group without spread) have none
                found.setdefault((number, *situation), []).append(float(advantage))
    return found


def report(run_dir: Path) -> list[str]:
    header = "| call | first call | episode | calls | mean advantage |"
    lines = [str(run_dir), header, "|---|---|---|---|---|"]
    for (number, right, solved), values in sorted(advantages_by_situation(run_dir).items()):
        lines.append(
            f"| {number} | {'right' if right else 'wrong'} | {'solved' if solved else 'failed'} | "
            f"{len(values)} | {statistics.mean(values):+.3f} |"
        )
    return lines


def main(argv: Any = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, help="calc_two_step run folders")
    for run_dir in parser.parse_args(argv).run_dirs:
        print("\n".join(report(run_dir)) + "\n")


if __name__ == "__main__":
    main()
