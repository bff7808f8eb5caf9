"""`warnings.jsonl`: every warning the run logged, kept in its folder for the run explorer and later reading.

A run's warnings (a full episode store, samples dropped as too long, a route that selected no call, a
role that made no call) go to the `lightning_sdk` logger, which a script may not show, and are gone when the
terminal is. While a run trains, rank 0 also appends each one to `run_dir/warnings.jsonl`, one JSON object a
line: `time`, `level`, `logger`, `message`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["WARNINGS_FILE", "keep_warnings", "read_warnings"]

WARNINGS_FILE = "warnings.jsonl"


class _JsonLines(logging.Handler):
    """Appends each record to the file as one JSON line, opening it for each record rather than holding it:
    vLLM configures logging (`logging.config.dictConfig`) when its engine starts, after this handler is
    attached, and that closes every handler in the process (`logging.shutdown`). A held file would then be
    closed under a run that goes on warning, and each warning would print a "Logging error" instead of
    being kept. Warnings are few; an open per line costs nothing that matters."""

    def __init__(self, path: Path) -> None:
        super().__init__(level=logging.WARNING)
        self._path = path
        path.touch()  # the file exists from the start: the run folder says the run keeps its warnings

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = {"time": record.created, "level": record.levelname, "logger": record.name}
            text = json.dumps({**line, "message": record.getMessage()}, ensure_ascii=False) + "\n"
            with self._path.open("a", encoding="utf-8") as file:
                file.write(text)
        except (OSError, ValueError, TypeError):  # a log line must never stop the run
            self.handleError(record)


@contextlib.contextmanager
def keep_warnings(run_dir: Path) -> Iterator[None]:
    """Append the `lightning_sdk` loggers' warnings to `run_dir/warnings.jsonl` for the `with` block
    (rank 0 only: one file per run)."""
    if os.environ.get("RANK", "0") != "0":
        yield
        return
    handler = _JsonLines(run_dir / WARNINGS_FILE)
    logger = logging.getLogger("lightning_sdk")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        handler.close()


def read_warnings(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The warnings a run kept, oldest first (none when it kept no file; a torn last line is skipped)."""
    path = Path(run_dir) / WARNINGS_FILE
    if not path.is_file():
        return []
    found = []
    for line in path.read_text(encoding="utf-8", errors="replace").split("\n"):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get("message"), str):
            found.append(record)
    return found
