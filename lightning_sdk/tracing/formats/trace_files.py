"""Trace files to stored episodes: which reader a file needs, the checks every import makes, and what an
episode already in the store keeps when the same file is imported again.

`read_traces` reads OTLP JSON (`otlp_import.read_otlp_traces`: spans, and log records holding the calls'
content) or our own JSONL exports, and refuses a file that gave no model call unless `allow_empty`;
`store_traces` adds the episodes to a store, deriving each one's task from its first user message and
keeping the feedback, rewards and hand-set task of an episode stored before (a nightly import of a
growing collector file); `import_traces` does both.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from lightning_sdk.tracing.episode import FEEDBACK_KEY, Episode
from lightning_sdk.tracing.formats.otlp_import import ImportReport, TracePaths, read_otlp_traces, trace_paths
from lightning_sdk.tracing.formats.otlp_messages import TraceImportError
from lightning_sdk.tracing.store import EpisodeStore

__all__ = ["TASK_FROM_KEY", "import_traces", "read_jsonl_episodes", "read_traces", "store_traces"]


def import_traces(
    path: TracePaths,
    store: EpisodeStore,
    *,
    format: str = "auto",
    skip_invalid: bool = False,
    allow_empty: bool = False,
) -> ImportReport:
    """Read a trace file and add its episodes to `store`; returns what was read (`read_traces`, then
    `store_traces`).

    Args:
        path: an OTLP JSON trace file, or several (the spans and the log records that hold the calls'
            content may be exported apart), or a JSONL file of episodes (`EpisodeStore.export_jsonl`).
        store: where the episodes go. An episode already there (by id: importing a growing file again,
            nightly) is replaced by what the file says, but keeps what was attached to it since: its
            feedback and rewards, and a task set by hand.
        format: `"otlp"`, `"jsonl"`, or `"auto"` (JSONL when the first line is an episode).
        skip_invalid: store the spans that read and report the others (default: nothing is stored
            unless every span reads).
        allow_empty: accept a file with no model call (default: a `TraceImportError` that says whether
            the file held no spans, or spans of which none was a model call, so a script can tell
            "nothing there" from "not understood").
    """
    report = read_traces(path, format=format, skip_invalid=skip_invalid, allow_empty=allow_empty)
    store_traces(report, store)
    return report


def read_traces(
    path: TracePaths,
    *,
    format: str = "auto",
    skip_invalid: bool = False,
    allow_empty: bool = False,
) -> ImportReport:
    """The episodes of a trace file, checked as `import_traces` checks them, without a store: a file that
    is refused leaves nothing behind, not even a new store file (the command reads before it opens one)."""
    if format not in ("auto", "otlp", "jsonl"):
        raise ValueError(f"format={format!r} must be 'auto', 'otlp' or 'jsonl'.")
    paths = trace_paths(path)
    if format == "jsonl" or (format == "auto" and all(_looks_like_episodes(item) for item in paths)):
        episodes = [episode for item in paths for episode in read_jsonl_episodes(item)]
        report = ImportReport(episodes, sum(len(episode.all_calls()) for episode in episodes))
        report.spans = -1  # not a trace file
    else:
        report = read_otlp_traces(paths, skip_invalid=skip_invalid)
    nothing = not report.episodes if report.spans < 0 else report.calls == 0
    if nothing and not allow_empty:
        raise TraceImportError(_nothing_found(", ".join(str(item) for item in paths), report))
    return report


def store_traces(report: ImportReport, store: EpisodeStore) -> None:
    """Add what `read_traces` read to `store`, keeping what was attached to episodes already there. The
    stored copies are read and replaced in one write transaction, so feedback given meanwhile (by another
    process) is not lost."""
    for episode in report.episodes:
        _take_task(episode)
    store.add_many(report.episodes, merge=_keep_attached)


def _nothing_found(path: str, report: ImportReport) -> str:
    """Why a file gave no model call, and what to do (see `import_traces`'s `allow_empty`)."""
    empty = " Pass allow_empty=True (--allow-empty) where an empty file is expected."
    if report.spans < 0:
        return f"{path} holds no episodes: nothing to import.{empty}"
    if report.spans == 0:
        return f"{path} holds no spans (an empty export?): nothing to import.{empty}"
    if report.skipped:
        return f"{path}: every model call span was skipped ({len(report.skipped)}): {report.skipped[0]}"
    names = ", ".join(repr(name) for name in report.span_names[:8])
    return (
        f"{path} holds {report.spans} span(s) but no model call: a model call span has "
        "gen_ai.operation.name 'chat', 'text_completion' or 'generate_content' (or, from OpenLLMetry before "
        f"0.55, llm.request.type 'chat' or 'completion'). Its spans are named {names}. Was the GenAI "
        f"instrumentation of the model client on when they were recorded?{empty}"
    )


TASK_FROM_KEY = "task_from"
"""`Episode.metadata` key saying where an imported episode's task came from."""


def _take_task(episode: Episode) -> None:
    """An imported episode's task, for `EpisodeStore.tasks`: the text of the first user message of its
    first call (what an agent that takes a question was asked). A task already set is kept."""
    if episode.task is not None:
        return
    calls = episode.all_calls()
    messages = calls[0].messages or [] if calls else []
    text = next((m.get("content") for m in messages if m.get("role") == "user"), None)
    if isinstance(text, str) and text:
        episode.task = text
        episode.metadata[TASK_FROM_KEY] = "first user message"


def _keep_attached(episode: Episode, stored: Episode) -> None:
    """`episode` (read again from the file) with what was attached to its stored copy since it was first
    imported: rewards and their feedback records, reward errors, and a task set by hand."""
    episode.rewards = {**stored.rewards, **episode.rewards}
    records = stored.metadata.get(FEEDBACK_KEY)
    if records:
        episode.metadata[FEEDBACK_KEY] = list(records)
    episode.reward_errors = stored.reward_errors + [
        error for error in episode.reward_errors if error not in stored.reward_errors
    ]
    derived = stored.metadata.get(TASK_FROM_KEY) is not None and stored.task == episode.task
    if stored.task is not None and not derived:  # set by hand (the derivation's marker may still be there)
        episode.task = stored.task
        episode.metadata.pop(TASK_FROM_KEY, None)


def _looks_like_episodes(path: Path) -> bool:
    with open(path, encoding="utf-8") as file:
        first = next((line for line in file if line.strip()), "")
    try:
        data = json.loads(first)
    except json.JSONDecodeError:
        return False
    return isinstance(data, dict) and "calls" in data and "resourceSpans" not in data


def read_jsonl_episodes(path: str | os.PathLike[str]) -> list[Episode]:
    """Episodes from a JSON Lines file written by `EpisodeStore.export_jsonl` (one `Episode.to_json()`
    per line); a line that is not one is a `TraceImportError` naming its line number."""
    episodes = []
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            try:
                episodes.append(Episode.from_json(line))
            except (ValueError, TypeError) as error:
                raise TraceImportError(f"{path}, line {number}: not an episode ({error}).") from None
    return episodes
