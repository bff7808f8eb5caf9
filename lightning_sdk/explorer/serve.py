"""Serve the explorer: `serve_explorer(run_dir)` starts it in a background thread and returns its address.

It listens on 127.0.0.1 unless told otherwise; on any other interface every request needs a key (a random
one unless given), which the printed address carries once (`?key=...`), as the serving endpoint needs its
own. The listening socket may also be handed over already open (`fd`): a trainer opens it, prints its
address at once and passes it to the viewer's own process, so the address is right before the viewer is up.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self
from urllib.parse import quote

from lightning_sdk.explorer.access import is_loopback
from lightning_sdk.serving.http.background import BackgroundServer, http_url, listening_socket

__all__ = ["ExplorerServer", "explorer_url", "serve_explorer"]


def explorer_url(host: str, port: int, key: str | None) -> str:
    """The address a browser opens: with the key once (URL-encoded), when one is needed."""
    return f"{http_url(host, port)}/" + (f"?key={quote(key, safe='')}" if key else "")


@dataclass
class ExplorerServer:
    """A running explorer: its `url` (open it in a browser), and `stop()`."""

    url: str
    """The page's address, with `?key=...` when the explorer needs a key."""
    key: str | None
    """The key every request must carry; None when it listens on this machine only."""
    _background: BackgroundServer | None = field(default=None, repr=False)

    def stop(self) -> None:
        """Stop serving (calling it again does nothing)."""
        if self._background is not None:
            self._background.stop(timeout_s=10)

    def wait(self, parent: int | None = None) -> None:
        """Serve until Ctrl+C (or, given the `parent` process id, until that process has ended: a viewer
        a trainer started never outlives it)."""
        if self._background is not None:
            self._background.wait(parent)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def serve_explorer(
    run_dir: str | Path | None = None,
    *,
    store: str | Path | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    key: str | None = None,
    fd: int | None = None,
) -> ExplorerServer:
    """Serve the explorer over a run folder (or, with `store`, an episode store file) in a background
    thread; returns once it accepts connections.

    Args:
        run_dir: a training run's folder.
        store: an episode store file (production traces), instead of `run_dir`.
        host: the interface to listen on; beyond 127.0.0.1 a key is required.
        port: the port (0: a free one).
        key: the key requests must carry (default: none on 127.0.0.1, a random one elsewhere).
        fd: an already listening socket to serve on, instead of `host` and `port`.

    Raises `StoreProblem` when the folder or the store cannot be read, `OSError` when the port is taken.
    """
    from lightning_sdk.explorer.app import build_app

    if key is not None and not key.strip():
        raise ValueError("the explorer's key is empty: give a key of your own, or none for a random one")
    sock = socket.socket(fileno=fd) if fd is not None else listening_socket(host, port)
    with contextlib.ExitStack() as undo:
        undo.callback(sock.close)
        bound_host, bound_port = sock.getsockname()[:2]
        if key is None and not is_loopback(bound_host):
            key = secrets.token_urlsafe(24)
        app = build_app(run_dir, store, key, bound_port)
        undo.pop_all()  # the server owns the socket from here, and closes it should it not start
    background = BackgroundServer.start(app, sock=sock, name="lightning-sdk-explorer", lifespan="on")
    return ExplorerServer(explorer_url(bound_host, bound_port, key), key, background)
