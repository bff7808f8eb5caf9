"""`LiveView`: the run explorer over this run's folder, in a process of its own, while the run trains.

`TrainerConfig(explorer=True)` starts it when the run starts and prints its address, so the page follows the
run live. The trainer opens the listening socket itself and hands it to the viewer (`lightning-sdk view
--fd`): the printed address is right at once, before the viewer has loaded, and no other program can take
the port in between. A process of its own, because the viewer must never take the trainer's time (the GIL)
nor its memory, and it only reads the folder (SQLite read-only). It stops with the run; it also exits by
itself if the trainer dies without stopping it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LiveView", "live_view"]

log = logging.getLogger("lightning_sdk.training")


@dataclass
class LiveView:
    """A running viewer: its `url` and `stop()`."""

    url: str
    process: subprocess.Popen[bytes]

    @classmethod
    def start(cls, run_dir: Path) -> LiveView:
        """Start the viewer over `run_dir` on 127.0.0.1 (a free port) and print its address."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        with contextlib.closing(sock):  # the child keeps its own copy of the socket
            sock.bind(("127.0.0.1", 0))
            sock.listen(64)
            port = sock.getsockname()[1]
            command = [
                sys.executable,
                "-m",
                "lightning_sdk.cli",
                "view",
                str(run_dir),
                "--fd",
                str(sock.fileno()),
            ]
            command += ["--parent", str(os.getpid())]
            process = subprocess.Popen(command, pass_fds=[sock.fileno()], stdout=subprocess.DEVNULL)
        view = cls(f"http://127.0.0.1:{port}/", process)
        print(f"Run explorer: {view.url} (follows this run; later: lightning-sdk view {run_dir})", flush=True)
        return view

    def stop(self) -> None:
        """Stop the viewer (calling it again does nothing)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.returncode not in (0, -15, None):
            log.warning(
                "The run explorer exited with code %s (see its message above).", self.process.returncode
            )


@contextlib.contextmanager
def live_view(run_dir: Path, enabled: bool) -> Iterator[LiveView | None]:
    """The viewer for the length of a `with` block when `enabled` (on rank 0 only: one page per run)."""
    if not enabled or os.environ.get("RANK", "0") != "0":
        yield None
        return
    view = LiveView.start(run_dir)
    try:
        yield view
    finally:
        view.stop()
