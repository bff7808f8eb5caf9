"""A request whose client goes away stops its generation, streaming or not.

A stream stops when its client goes: the server stops reading the response's iterator, and the engine's
request stream aborts the request when its consumer stops (`lightning_sdk.engine.streams.RequestStream`).
A non-streaming request has no iterator to stop: the ASGI server does not cancel the route when the client
disconnects, so the engine would go on generating an answer nobody reads (a client that timed out and
retried doubles the load). `until_disconnected` serves such a request while it listens for the client's
disconnect, and cancels the serving task when it comes: the cancellation reaches the engine's request
stream, which aborts the request exactly as a stopped stream does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response

__all__ = ["CLIENT_CLOSED_REQUEST", "until_disconnected"]

log = logging.getLogger(__name__)
T = TypeVar("T")

CLIENT_CLOSED_REQUEST = 499
"""The status of a request whose client went away (nginx's convention; nobody receives it)."""


async def until_disconnected(request: Request, work: Awaitable[T]) -> T | Response:
    """The result of `work`, or, when the client of `request` disconnects first, `work` cancelled and a
    499 response that nobody reads. Call it after the request's body has been read: it listens to the rest
    of the request's messages, and the only one left is the disconnect."""
    serving: asyncio.Future[T] = asyncio.ensure_future(work)
    listening = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({serving, listening}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # the route itself was cancelled (the server shuts down): so is its work
        serving.cancel()
        raise
    finally:
        listening.cancel()
    if serving.done():
        return serving.result()
    serving.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await serving  # let the cancellation run through the engine's stream (its abort) before going on
    log.info("%s %s: the client went away; its generation was stopped", request.method, request.url.path)
    return Response(status_code=CLIENT_CLOSED_REQUEST)


async def _disconnected(request: Request) -> Any:
    while (await request.receive())["type"] != "http.disconnect":
        pass
