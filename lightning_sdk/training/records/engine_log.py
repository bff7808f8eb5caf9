"""`run_dir/engine.log`: what the engine and the libraries under it print, kept out of the run's console.

Starting a run loads vLLM, torch and transformers, and each has its say: vLLM's own log lines, Triton's
"is installed, but doesn't include CPU backend", torch's C++ NUMA warning, the weight-loading progress
bars. None of it is about the user's run, and a newcomer cannot tell it from what matters. So while the
engine starts and the policy loads, the process's standard output and error (the file descriptors, so C++
writes are caught too) go to `run_dir/engine.log`; vLLM's log lines keep going there for the rest of the run.
`TrainerConfig(verbose=True)` (`--verbose`) leaves all of it on the console.

After the start, one line names the file when it holds a warning or an error. An engine that fails to start
shows the end of the file on the console with its error, so nothing needed to understand a failure is hidden.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

__all__ = ["ENGINE_LOG", "EngineOutput"]

ENGINE_LOG = "engine.log"
"""The file in the run folder."""

_NOTABLE = re.compile(r"\b(warning|error|exception|traceback)\b|^\[W", re.IGNORECASE)
"""A line worth the user's attention: a Python or vLLM warning or error, or a torch C++ warning (`[W...]`)."""
_SHOWN_ON_FAILURE = 200
"""Lines of the file shown on the console when the engine or the policy failed to load."""
_ENGINE_LOGGERS = ("vllm",)
"""Loggers whose console handlers write to the file for the rest of the run."""

log = logging.getLogger("lightning_sdk.training")


class EngineOutput:
    """Where the engine's own output goes during a run: `run_dir/engine.log`, or the console (`verbose`)."""

    def __init__(self, run_dir: Path, verbose: bool = False) -> None:
        self.path = Path(run_dir) / ENGINE_LOG
        self.verbose = verbose
        self._file: IO[str] | None = None
        self._moved: list[tuple[logging.StreamHandler[Any], Any]] = []

    @contextlib.contextmanager
    def quiet(self, what: str) -> Iterator[None]:
        """While the block runs (`what`: "starting the engine", ...), standard output and error go to the
        file. On an exception the file's last lines are printed to the console before it propagates."""
        if self.verbose:
            yield
            return
        sys.stdout.flush()
        sys.stderr.flush()
        with self.path.open("ab") as file:
            file.write(f"--- {what}\n".encode())
            file.flush()
            saved = os.dup(1), os.dup(2)
            os.dup2(file.fileno(), 1)
            os.dup2(file.fileno(), 2)
            try:
                yield
            except BaseException:
                self._restore(saved)
                self._show_end(what)
                raise
            else:
                self._restore(saved)

    def keep_engine_logs(self) -> None:
        """From now on, the engine's log lines (vLLM's handlers on the console) go to the file too."""
        if self.verbose:
            return
        for name in _ENGINE_LOGGERS:
            for handler in logging.getLogger(name).handlers:
                if isinstance(handler, logging.StreamHandler) and handler.stream in (sys.stdout, sys.stderr):
                    if self._file is None:
                        self._file = self.path.open("a", encoding="utf-8")
                    previous = handler.setStream(self._file)
                    if previous is not None:
                        self._moved.append((handler, previous))

    def say_where(self) -> None:
        """One line naming the file, when anything in it is a warning or an error."""
        if self.verbose or not self.path.exists():
            return
        lines = self.path.read_text(encoding="utf-8", errors="replace").splitlines()
        notable = sum(1 for line in lines if _NOTABLE.search(line))
        if notable:
            log.info("engine: %d warning or error line(s) while starting, in %s", notable, self.path)

    def close(self) -> None:
        """Give the engine's loggers their console back and close the file."""
        for handler, stream in self._moved:
            handler.setStream(stream)
        self._moved.clear()
        if self._file is not None:
            self._file.close()
            self._file = None

    @staticmethod
    def _restore(saved: tuple[int, int]) -> None:
        with contextlib.suppress(Exception):  # what was written still goes to the file first
            sys.stdout.flush()
            sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])

    def _show_end(self, what: str) -> None:
        lines = self.path.read_text(encoding="utf-8", errors="replace").splitlines()
        shown = "\n".join(lines[-_SHOWN_ON_FAILURE:])
        print(f"{what} failed; the end of {self.path}:\n{shown}", file=sys.stderr, flush=True)
