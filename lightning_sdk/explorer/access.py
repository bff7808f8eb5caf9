"""Who may read the explorer: anyone on this machine when it listens on 127.0.0.1 only; with a key otherwise.

The key is checked with the serving endpoint's own helpers (`serving/keys.py`): `Authorization: Bearer <key>`
or `x-api-key: <key>`, compared in constant time as bytes. A browser cannot set
headers on a link, so the address the command prints carries the key once (`?key=...`); the explorer keeps
it in an HttpOnly cookie and sends the browser to the same address without it, so the key does not stay in
the address bar or the history. Browsers keep one set of cookies for every port of a host, so the cookie is
named after the port: two explorers on one host do not overwrite each other's key.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from lightning_sdk.serving.keys import offered_keys, offers

if TYPE_CHECKING:  # FastAPI loads with the server only: `lightning-sdk view --help` stays light
    from fastapi import Request, Response

__all__ = ["COOKIE", "KeyCheck", "cookie_name", "is_loopback"]

COOKIE = "lightning_sdk_view_key"


def cookie_name(port: int | None) -> str:
    """The key's cookie for an explorer on `port` (None: an app not served on a known port, as in tests)."""
    return COOKIE if port is None else f"{COOKIE}_{int(port)}"


def is_loopback(host: str) -> bool:
    """Whether `host` is reachable from this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class KeyCheck:
    """The middleware that refuses a request without the key (`key=None`: every request passes)."""

    def __init__(self, key: str | None, cookie: str = COOKIE) -> None:
        self.key = key
        self.cookie = cookie

    def given(self, request: Request) -> list[str]:
        keys = offered_keys(request.headers.get("authorization", ""), request.headers.getlist("x-api-key"))
        carried = (request.cookies.get(self.cookie), request.query_params.get("key"))
        return keys + [value for value in carried if value]

    async def __call__(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        """The app's HTTP middleware: a 401 without the key, else the page (and the key's cookie)."""
        from fastapi.responses import PlainTextResponse

        if self.key is None:
            # Without a key only this machine's names are answered: a web page elsewhere that points its
            # own name at 127.0.0.1 (DNS rebinding) must not read the recorded episodes through the browser.
            if not is_loopback(_host_name(request.headers.get("host", ""))):
                return PlainTextResponse(
                    "This explorer answers requests to 127.0.0.1 or localhost only.", status_code=421
                )
            return await call_next(request)
        if not offers(self.given(request), self.key):
            return PlainTextResponse(
                "This explorer listens beyond this machine and needs its key: open the address the command "
                "printed (it ends in ?key=...), or send 'Authorization: Bearer <key>'.",
                status_code=401,
            )
        if request.query_params.get("key"):  # the printed address: keep the key, then drop it from the URL
            from fastapi.responses import RedirectResponse

            rest = [(name, value) for name, value in request.query_params.multi_items() if name != "key"]
            address = request.url.replace(query=urlencode(rest))
            redirect = RedirectResponse(str(address), status_code=303)
            redirect.set_cookie(self.cookie, self.key, httponly=True, samesite="strict")
            return redirect
        return await call_next(request)


def _host_name(host: str) -> str:
    """The name in a Host header, without its port (`[::1]:8765` -> `::1`)."""
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host
