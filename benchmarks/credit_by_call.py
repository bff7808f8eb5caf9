"""What credit gave each call, by the situation it was in: the two-step calculator and the retrieval agent.

Reads the training episodes of `benchmarks/learning.py` runs (each call keeps the advantage it was trained
with in `call.metadata`, under every credit rule) and prints the mean advantage of first and second calls,
split by whether the first call was right and whether the episode was solved (reward 1):

- `calc_two_step`: the first call computed the first part, the decision a second call cannot repair;
- `rag_openai_agents`: the first search returned the entry holding the answer (the gold answer appears
  in the tool's result), without which the answer call can only guess.

    python benchmarks/credit_by_call.py runs/learning/credit-equal/calc_two_step/seed0 \
        runs/learning/credit-step/calc_two_step/seed0

Under `credit="equal"` both calls of an episode get its advantage; under `credit="step"` a second call
is also compared with the second calls that faced the same state (the same first result), so one after
a wrong first call should be blamed less, and one that spoiled a right first call more.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import two_step_calc  # benchmarks/, beside this script

import lightning_sdk as ls
from lightning_sdk.tracing.store import EpisodeStore


def advantages_by_situation(run_dir: Path) -> dict[tuple[int, str, bool], list[float]]:
    """(call number, first call "right" / "wrong" / "no search", solved) -> the advantages those trained
    calls got."""
    path = run_dir / "episodes.sqlite"
    if not path.is_file():
        raise SystemExit(f"{run_dir}: no episodes.sqlite here; pass a run folder of benchmarks/learning.py")
    with EpisodeStore(path) as store:
        episodes = store.episodes()
    first_call = _first_call_rule(run_dir, episodes)
    found: dict[tuple[int, str, bool], list[float]] = {}
    for episode in episodes:
        situation = (first_call(episode), (episode.reward or 0.0) >= 1.0)
        for number, call in enumerate(episode.all_calls()[:2], start=1):
            advantage = call.metadata.get("advantage")
            if advantage is not None:  # untrained calls (a group without spread) have none
                found.setdefault((number, *situation), []).append(float(advantage))
    return found


def _first_call_rule(run_dir: Path, episodes: list[ls.Episode]) -> Callable[[ls.Episode], str]:
    """Which agent's runs these are, by their tasks: how to tell whether a first call was right."""
    tasks = [episode.task if isinstance(episode.task, dict) else {} for episode in episodes]
    if tasks and all("expression" in task for task in tasks):
        return lambda episode: "right" if two_step_calc.first_call_right(episode) else "wrong"
    if tasks and all("answer" in task and "corpus" in task for task in tasks):
        return first_search
    # Other agents' calls have no known first decision: every call would read as wrong.
    raise SystemExit(
        f"{run_dir}: neither a calc_two_step nor a rag_openai_agents run (no task 'expression', no "
        "'answer' with a 'corpus'); this report reads those two agents' runs only"
    )


def first_search(episode: ls.Episode) -> str:
    """The retrieval agent's first search: "right" when it returned the answer (the gold answer appears in
    the first tool result, which the second call's prompt holds), "wrong" when it did not, "no search"
    when none ran (the first call, cut by `max_tokens`, ended the episode)."""
    calls = episode.all_calls()
    if len(calls) < 2:
        return "no search"
    messages = calls[1].messages
    question = max(
        (index for index, message in enumerate(messages) if message.get("role") == "user"), default=0
    )
    # The tool results before the question are the worked examples'.
    results = [message for message in messages[question:] if message.get("role") == "tool"]
    answer = str(episode.task["answer"]).lower()
    if not results:
        return "no search"
    return "right" if answer in str(results[0].get("content", "")).lower() else "wrong"


def report(run_dir: Path) -> list[str]:
    header = "| call | first call | episode | calls | mean advantage |"
    lines = [str(run_dir), header, "|---|---|---|---|---|"]
    for (number, first, solved), values in sorted(advantages_by_situation(run_dir).items()):
        lines.append(
            f"| {number} | {first} | {'solved' if solved else 'failed'} | "
            f"{len(values)} | {statistics.mean(values):+.3f} |"
        )
    return lines


def main(argv: Any = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "run_dirs", nargs="+", type=Path, help="calc_two_step or rag_openai_agents run folders"
    )
    for run_dir in parser.parse_args(argv).run_dirs:
        print("\n".join(report(run_dir)) + "\n")


if __name__ == "__main__":
    main()
