"""What one request may ask of the server, said once: the size of its body, the depth of its JSON, and how
many sequences it starts.

Every route of the app, the policy's, the pass-through, and those a route installer adds (feedback, the
runner protocol), reads its body through `BodyLimit`, the app's one ASGI middleware: a body whose
`Content-Length` is over `RequestLimits.max_body_bytes` is refused with 413 at the route's first read,
before a byte of it is read, and a body sent without a length is counted as it arrives and refused once it
passes the limit. The refusal is an `APIError`, so the app's error handlers answer it in the shape of the
route's API (OpenAI's, or Anthropic's on the Messages paths).

A route with a smaller natural size reads with `read_json_body(request, max_bytes=...)`: the same two
checks at its own bound (the smaller of the two wins). `parse_json` refuses what is not JSON, and JSON
nested deeper than `max_json_depth`, with a 400 (`json.loads` alone raises `RecursionError` at about a
thousand levels, and deep values break the recursive code after it). `max_sequences` bounds prompts x `n`
on every generating route (`ServingContext.params_for`): the cap on `n` alone lets a completions request
with 2000 prompts start 32,000 sequences.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from lightning_sdk.serving.errors import APIError

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "LIMITS_SETTING",
    "BodyLimit",
    "RequestLimits",
    "body_too_large",
    "parse_json",
    "read_json_body",
    "request_limits",
]

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
"""The default bound on any request body: Anthropic's own request limit, and room for a long episode upload
of the runner protocol (a chat request that fills a 128k-token context is a few megabytes)."""

LIMITS_SETTING = (
    "TrainerConfig(request_limits=RequestLimits(...)), serve(limits=RequestLimits(...)) "
    "or start_server(limits=...)"
)
"""Where the limits are set (ends every refusal's message)."""

_Scope = MutableMapping[str, Any]
_Message = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[_Message]]
_Send = Callable[[_Message], Awaitable[None]]
_ASGIApp = Callable[[_Scope, _Receive, _Send], Awaitable[None]]


@dataclass(frozen=True)
class RequestLimits:
    """Bounds on one request, checked before the server reads or generates more than they allow."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    """Largest request body on any route, in bytes; a larger one is refused with 413 before it is read."""
    max_json_depth: int = 64
    """Deepest nesting of a JSON body (objects and arrays); a deeper one is refused with 400. A chat request
    with tools whose schemas nest twenty levels is about 45 deep."""
    max_sequences: int = 256
    """Most sequences one request may start: its prompts times `n` (completions take a list of prompts;
    chat, responses and messages one). A request asking more is refused with 400."""

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_json_depth", "max_sequences"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"RequestLimits.{name} must be a positive integer, got {value!r}.")

    def check_sequences(self, prompts: int, n: int) -> None:
        """A 400 when `prompts` x `n` sequences are more than `max_sequences`."""
        if prompts * n > self.max_sequences:
            raise APIError.bad_request(
                f"This request would start {prompts} prompt(s) x n={n} = {prompts * n} sequences; one "
                f"request may start at most {self.max_sequences} "
                f"(RequestLimits.max_sequences: {LIMITS_SETTING}). "
                "Send fewer prompts or a smaller n, or several requests.",
                param="n",
                code="too_many_sequences",
            )


def body_too_large(limit: int) -> APIError:
    """The 413 of a body over `limit` bytes."""
    return APIError(
        413,
        f"The request body is larger than {limit} bytes, the most this route reads "
        f"(RequestLimits.max_body_bytes: {LIMITS_SETTING}).",
        code="body_too_large",
    )


class BodyLimit:
    """ASGI middleware: no route reads more than `limits.max_body_bytes` of a body (module docstring).

    It refuses inside `receive`, where the route reads, rather than answering itself: the app's error
    handlers then give the refusal its API's shape, and a route that reads no body is not affected. The body
    not read is left to the server, which discards it and keeps the connection (closing it while the client
    still sends could reset the connection before the client reads the 413).
    """

    def __init__(self, app: _ASGIApp, limits: RequestLimits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limited = limited_receive(receive, _declared_length(scope), self.limits.max_body_bytes)
        await self.app(scope, limited, send)


def limited_receive(receive: _Receive, declared: int | None, limit: int) -> _Receive:
    """`receive` that raises the 413 when the declared length or the bytes received pass `limit`."""
    received = 0

    async def receive_within_limit() -> _Message:
        nonlocal received
        if declared is not None and declared > limit:
            raise body_too_large(limit)
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > limit:
                raise body_too_large(limit)
        return message

    return receive_within_limit


def _declared_length(scope: _Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name.lower() == b"content-length":
            text = value.decode("latin-1").strip()
            return int(text) if text.isdigit() else None
    return None


def request_limits(request: Any) -> RequestLimits:
    """The limits of the app serving `request` (`AppOptions.limits`); the defaults for another app."""
    limits = getattr(request.app.state, "request_limits", None)
    return limits if isinstance(limits, RequestLimits) else RequestLimits()


async def read_json_body(request: Any, max_bytes: int | None = None) -> Any:
    """The JSON body of a starlette `request`, read up to `max_bytes` (and never past the app's
    `max_body_bytes`): 413 beyond, 400 for what is not JSON or nests too deep (`parse_json`)."""
    limits = request_limits(request)
    if max_bytes is not None and max_bytes < limits.max_body_bytes:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_bytes:
            raise body_too_large(max_bytes)
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise body_too_large(max_bytes)
            chunks.append(chunk)
        raw = b"".join(chunks)
    else:
        raw = await request.body()
    return parse_json(raw, limits.max_json_depth)


def parse_json(raw: bytes, max_depth: int) -> Any:
    """`raw` parsed as JSON; a 400 (`invalid_json`) for what is not UTF-8 JSON or nests deeper than
    `max_depth` objects and arrays."""
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        message = f"The request body is not valid JSON: {error}"
        raise APIError.bad_request(message, code="invalid_json") from None
    except RecursionError:
        raise _too_deep(max_depth) from None
    if _deeper_than(value, max_depth):
        raise _too_deep(max_depth)
    return value


def _too_deep(max_depth: int) -> APIError:
    return APIError.bad_request(
        f"The request body nests JSON objects and arrays more than {max_depth} deep "
        f"(RequestLimits.max_json_depth: {LIMITS_SETTING}).",
        code="invalid_json",
    )


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether `value` nests objects and arrays more than `limit` deep (a loop: no recursion to overflow)."""
    stack: list[tuple[Any, int]] = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False
