"""BackgroundServer: the one way this package serves an app in a thread (the endpoint and the explorer)."""

from __future__ import annotations

import socket
import urllib.request

import pytest

from lightning_sdk.serving.http.background import BackgroundServer, http_url, listening_socket


async def hello(scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
    """The smallest ASGI app: 200 and a word."""
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})  # type: ignore[operator]
    await send({"type": "http.response.body", "body": b"hello"})  # type: ignore[operator]


def test_addresses_a_client_on_this_machine_can_open() -> None:
    assert http_url("0.0.0.0", 80) == "http://127.0.0.1:80"
    assert http_url("::", 80) == "http://[::1]:80"
    assert http_url("::1", 8080) == "http://[::1]:8080"
    assert http_url("10.0.0.5", 8080) == "http://10.0.0.5:8080"


def test_it_serves_on_ipv4_and_ipv6_stops_and_frees_its_port() -> None:
    hosts = ["127.0.0.1"] + (["::1"] if socket.has_ipv6 and _ipv6_loopback() else [])
    for host in hosts:
        with BackgroundServer.start(hello, host=host, lifespan="off") as server:
            assert urllib.request.urlopen(server.url, timeout=10).read() == b"hello"
            port = server.port
        assert not server.running
        listening_socket(host, port).close()  # the port is free again


def test_a_socket_handed_over_is_served_and_a_taken_port_says_what_to_do() -> None:
    sock = listening_socket("127.0.0.1", 0)
    with BackgroundServer.start(hello, sock=sock, lifespan="off") as server:
        assert server.port == sock.getsockname()[1]
        assert urllib.request.urlopen(server.url, timeout=10).read() == b"hello"
        with pytest.raises(OSError, match="choose another port, or 0 for a free one"):
            listening_socket("127.0.0.1", server.port)


def _ipv6_loopback() -> bool:
    try:
        listening_socket("::1", 0).close()
    except OSError:
        return False
    return True
