"""`BackgroundServer`: an ASGI app served by uvicorn in a daemon thread, for everything this package serves.

The model's endpoint (`lightning_sdk.serving.server`) and the run explorer (`lightning_sdk.explorer.serve`)
both start here: a socket opened here (IPv4 or IPv6) or handed over already listening, a thread, a wait until
the server accepts connections, and a handle that stops it, waits on it, and closes it as a context manager.
What fails while starting leaves neither the thread nor the port behind.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any, Self

__all__ = ["BackgroundServer", "http_url", "listening_socket"]


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to `host:port` (0: a free port; an IPv6 address gets an IPv6 socket) and listening.
    A port that is taken raises an `OSError` that says what to do."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as error:
        sock.close()
        raise OSError(
            error.errno,
            f"Cannot listen on {host}:{port} ({error.strerror}); choose another port, or 0 for a free one",
        ) from None
    return sock


def http_url(host: str, port: int) -> str:
    """The address a client on this machine uses: `0.0.0.0` and `::` become the loopback address, an IPv6
    address is bracketed (`http://[::1]:8000`)."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class BackgroundServer:
    """A running server: its `url`, and `stop()`, `wait()`, `with ... as server:`."""

    def __init__(self, server: Any, thread: threading.Thread, host: str, port: int) -> None:
        self._server, self._thread = server, thread
        self.host, self.port = host, port
        self.url = http_url(host, port)
        """`http://host:port`, as a client on this machine reaches it."""

    @classmethod
    def start(
        cls,
        app: Any,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        sock: socket.socket | None = None,
        name: str = "lightning-sdk-server",
        startup_timeout: float = 30.0,
        **uvicorn_options: Any,
    ) -> BackgroundServer:
        """Serve `app` on `sock` (a socket already listening, which the server then owns) or on a new one
        on `host:port`, and return once it accepts connections. `uvicorn_options` go to `uvicorn.Config`
        (quiet by default: warnings only, no access log)."""
        import uvicorn

        sock = sock if sock is not None else listening_socket(host, port)
        bound_host, bound_port = sock.getsockname()[:2]
        options = {"log_level": "warning", "access_log": False, **uvicorn_options}
        server = uvicorn.Server(uvicorn.Config(app, **options))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=name, daemon=True)
        try:
            thread.start()
            deadline = time.monotonic() + startup_timeout
            while not server.started:
                if not thread.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"The server did not start on {bound_host}:{bound_port}; see the log above."
                    )
                time.sleep(0.02)
        except BaseException:  # a server that did not come up, or a Ctrl+C while waiting: nothing left behind
            server.should_exit = True
            if thread.is_alive():
                thread.join(timeout=30)
            sock.close()
            raise
        return cls(server, thread, bound_host, bound_port)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop accepting requests and end the thread (calling it again does nothing)."""
        if self._thread.is_alive():
            self._server.should_exit = True
            self._thread.join(timeout=timeout_s)

    def wait(self, parent: int | None = None) -> None:
        """Serve until Ctrl+C (or, given the `parent` process id, until that process has ended), then stop."""
        try:
            while self._thread.is_alive():
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
