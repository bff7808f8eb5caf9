"""What credit gave each call, by the situation it was in: the two-step calculator, the retrieval agent and
the SQL agent with its checker.

Reads the training episodes of `benchmarks/learning.py` runs (each call keeps the advantage it was trained
with in `call.metadata`, under every credit rule) and prints the mean advantage of each kind of call, split
by whether the episode's first decision was right and whether the episode was solved (reward 1):

- `calc_two_step` (first and second call): the first call computed the first part, the decision a second
  call cannot repair;
- `rag_openai_agents` (first and second call): the first search returned the entry holding the answer
  (the gold answer appears in the tool's result), without which the answer call can only guess;
- `sql_checked` (each role; the checker split by its verdict): the first query returned the gold rows
  ("error" when it did not run). A right first query that the checker rejected and the rewrite
  spoiled is the case the episode's outcome alone blames wrongly.

    python benchmarks/credit_by_call.py runs/learning/credit-equal/calc_two_step/seed0 \
        runs/learning/credit-step/calc_two_step/seed0

Under `credit="equal"` every call of an episode gets its advantage; under `credit="step"` a call is also
compared with the calls that faced the same state (the same prompt), so a call after a wrong first
decision should be blamed less, and one that spoiled a right first decision more.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import two_step_calc  # benchmarks/, beside this script

import lightning_sdk as ls
from lightning_sdk.tracing.store import EpisodeStore


class Reading(NamedTuple):
    """How to read one agent's episodes."""

    first_decision: Callable[[ls.Episode], str]
    """The episode's first decision: "right", "wrong", or what kept it from being made."""
    call_kind: Callable[[int, ls.LLMCall], str | None]
    """A call's row label from its number (1-based) and itself; None leaves it out."""


def advantages_by_situation(run_dir: Path) -> dict[tuple[str, str, bool], list[float]]:
    """(kind of call, first decision, solved) -> the advantages those trained calls got."""
    path = run_dir / "episodes.sqlite"
    if not path.is_file():
        raise SystemExit(f"{run_dir}: no episodes.sqlite here; pass a run folder of benchmarks/learning.py")
    with EpisodeStore(path) as store:
        episodes = store.episodes()
    reading = _reading_for(run_dir, episodes)
    found: dict[tuple[str, str, bool], list[float]] = {}
    for episode in episodes:
        situation = (reading.first_decision(episode), (episode.reward or 0.0) >= 1.0)
        for number, call in enumerate(episode.all_calls(), start=1):
            kind = reading.call_kind(number, call)
            advantage = call.metadata.get("advantage")
            if kind is not None and advantage is not None:  # untrained calls (no spread) have none
                found.setdefault((kind, *situation), []).append(float(advantage))
    return found


def _reading_for(run_dir: Path, episodes: list[ls.Episode]) -> Reading:
    """Which agent's runs these are, by their tasks."""
    tasks = [episode.task if isinstance(episode.task, dict) else {} for episode in episodes]
    if tasks and all("expression" in task for task in tasks):
        return Reading(
            lambda episode: "right" if two_step_calc.first_call_right(episode) else "wrong", _first_two
        )
    if tasks and all("answer" in task and "corpus" in task for task in tasks):
        return Reading(first_search, _first_two)
    if tasks and all("gold_sql" in task for task in tasks):
        return Reading(first_query, role_and_verdict)
    # Other agents' calls have no known first decision: every call would read as wrong.
    raise SystemExit(
        f"{run_dir}: not a calc_two_step, rag_openai_agents or sql_checked run (no task 'expression', "
        "no 'answer' with a 'corpus', no 'gold_sql'); this report reads those agents' runs only"
    )


def _first_two(number: int, call: ls.LLMCall) -> str | None:
    """The calculator's and the retrieval agent's rows: the first and second call, by number."""
    return str(number) if number <= 2 else None


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


def first_query(episode: ls.Episode) -> str:
    """The SQL agent's first query, run again on the task's database: "right" when it returns the gold
    rows (the reward's test), "error" when it did not run (SQLite refused it, or the reply held no SQL),
    else "wrong"."""
    from lightning_sdk.examples.sql_langchain.agent import answers_question
    from lightning_sdk.examples.sql_langchain.sql_tools import extract_sql, run_query

    calls = episode.all_calls()
    if not calls:
        return "no query"
    result = run_query(episode.task["db_path"], extract_sql(calls[0].text))
    if not result.ok:
        return "error"
    return "right" if answers_question(episode.task, result) else "wrong"


def role_and_verdict(number: int, call: ls.LLMCall) -> str:
    """The SQL agent's rows: the call's role, the checker's with its verdict as the agent read it."""
    from lightning_sdk.examples.sql_langchain.agent import is_yes

    role = call.agent_name or "?"
    if role == "check_query":
        return f"{role} ({'yes' if is_yes(call.text) else 'no'})"
    return role


def report(run_dir: Path) -> list[str]:
    header = "| call | first decision | episode | calls | mean advantage |"
    lines = [str(run_dir), header, "|---|---|---|---|---|"]
    for (kind, first, solved), values in sorted(advantages_by_situation(run_dir).items()):
        lines.append(
            f"| {kind} | {first} | {'solved' if solved else 'failed'} | "
            f"{len(values)} | {statistics.mean(values):+.3f} |"
        )
    return lines


def main(argv: Any = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "run_dirs", nargs="+", type=Path, help="calc_two_step, rag_openai_agents or sql_checked run folders"
    )
    for run_dir in parser.parse_args(argv).run_dirs:
        print("\n".join(report(run_dir)) + "\n")


if __name__ == "__main__":
    main()
