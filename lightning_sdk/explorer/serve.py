"""Serve the explorer: `serve_explorer(run_dir)` starts it in a background thread and returns its address.

It listens on 127.0.0.1 unless told otherwise; on any other interface every request needs a key (a random
one unless given), which the printed address carries once (`?key=...`), as the serving endpoint needs its
own. The listening socket may also be handed over already open (`fd`): a trainer opens it, prints its
address at once and passes it to the viewer's own process, so the address is right before the viewer is up.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self
from urllib.parse import quote

from lightning_sdk.explorer.access import is_loopback

__all__ = ["ExplorerServer", "explorer_url", "serve_explorer"]


def explorer_url(host: str, port: int, key: str | None) -> str:
    """The address a browser opens: with the key once, when one is needed."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/" + (f"?key={quote(key, safe='')}" if key else "")


@dataclass
class ExplorerServer:
    """A running explorer: its `url` (open it in a browser), and `stop()`."""

    url: str
    """The page's address, with `?key=...` when the explorer needs a key."""
    key: str | None
    """The key every request must carry; None when it listens on this machine only."""
    _server: Any = field(default=None, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    def stop(self) -> None:
        """Stop serving (calling it again does nothing)."""
        if self._thread is not None and self._thread.is_alive():
            self._server.should_exit = True
            self._thread.join(timeout=10)

    def wait(self, parent: int | None = None) -> None:
        """Serve until Ctrl+C (or, given the `parent` process id, until that process has ended: a viewer
        a trainer started never outlives it)."""
        try:
            while self._thread is not None and self._thread.is_alive():
                self._thread.join(timeout=0.5)
                if parent is not None and os.getppid() != parent:
                    break
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to `host:port` (0: a free port) and listening."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(64)
    except OSError as error:
        sock.close()
        raise OSError(
            f"cannot listen on {host}:{port} ({error.strerror}); pick another --port (0: a free one)"
        ) from None
    return sock


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
    import uvicorn

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
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
        server = uvicorn.Server(config)
        thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name="lightning-sdk-explorer", daemon=True
        )
        thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                server.should_exit = True
                raise RuntimeError("The explorer's server did not start; see the log above.")
            time.sleep(0.02)
        undo.pop_all()  # the server owns the socket now
    return ExplorerServer(explorer_url(bound_host, bound_port, key), key, server, thread)
