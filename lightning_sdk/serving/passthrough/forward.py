"""Requests the policy does not serve, passed through to the OpenAI-compatible API the agent would have used.

Once the trainer points `OPENAI_BASE_URL` at the policy, every OpenAI call the agent makes comes here, not
only its chat calls: a retriever's `/v1/embeddings`, a moderation check. This app serves the policy's
routes itself; a request to one of the upstream's pass-through routes (`Upstream.routes`, by default the
inference routes of `lightning_sdk.serving.passthrough.routes`, POST only but for `GET /v1/models/*`) goes
to the upstream with its normalised path, its query, body and headers, and the upstream's key in place of
ours; its answer (status, headers, body, streamed as it arrives) comes back unchanged. Any other request
gets a 404 that names the route and the setting that would pass it (or, without an upstream, the setting
that names one): the user's key never acts on their account beyond inference. Pass-through requests are
not LLM calls of the policy: the recorder never sees them.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from lightning_sdk.serving.errors import APIError
from lightning_sdk.serving.passthrough.routes import PASSTHROUGH_ROUTES_SETTING, allowed_route
from lightning_sdk.serving.passthrough.upstream import Upstream

if TYPE_CHECKING:
    import httpx

__all__ = [
    "PASSTHROUGH_METHODS",
    "PASSTHROUGH_PATH",
    "SERVE_UPSTREAM_SETTING",
    "Forward",
    "install_passthrough_route",
    "passthrough_handler",
]

log = logging.getLogger(__name__)

# Headers that describe one HTTP hop (or our own key, in either form), not the request or answer itself.
_REQUEST_HEADERS_NOT_FORWARDED = frozenset(
    {
        "host",
        "authorization",
        "x-api-key",
        "content-length",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "upgrade",
    }
)
_ANSWER_HEADERS_NOT_FORWARDED = frozenset({"content-length", "connection", "keep-alive", "transfer-encoding"})
PASSTHROUGH_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]
"""The methods the pass-through route answers (a route of `Upstream.routes` decides what passes)."""
PASSTHROUGH_PATH = "/v1/{path:path}"
"""The route that takes every `/v1/...` path no earlier route took."""
_LOOP_MARK = "x-lightning-sdk-passed-through"  # set on what we forward; an upstream that is us sends it back

SERVE_UPSTREAM_SETTING = (
    "Name one when starting the server: `lightning-sdk serve --upstream URL` or `serve(upstream=...)` "
    "(its key "
    "is read from OPENAI_API_KEY)."
)
"""How to name an upstream for a server started with `serve()` or `lightning-sdk serve`."""
_TIMEOUT_S = 600.0  # the openai client's own default


Forward = Callable[[Request, str], Awaitable[StreamingResponse]]
"""A pass-through handler: `forward(request, path)` for a request to `/v1/<path>`."""


def passthrough_handler(
    authorize: Callable[[Request], None], upstream: Upstream | None, how_to_set: str
) -> Forward:
    """The handler of requests the policy does not serve: checks our key, then passes the request to
    `upstream` when one of its routes takes it, or refuses it clearly; `how_to_set` ends the 404's message
    without an upstream (the setting that names one where this app runs: a trainer option, a flag)."""

    async def passthrough(request: Request, path: str) -> StreamingResponse:
        authorize(request)  # our key first: the upstream's key is never lent to a caller without ours
        route = f"{request.method} /v1/{path}"
        if upstream is None:
            raise APIError(
                404,
                f"{route} is not served here: this endpoint serves the policy being trained "
                "(chat/completions, completions, responses, messages, models), and no upstream API is set "
                f"for other requests. {how_to_set}",
                code="unknown_route",
            )
        normal = allowed_route(request.method, f"/v1/{path}", upstream.routes)
        if normal is None:
            listed = ", ".join(upstream.routes)
            passed = f"only {listed} are" if upstream.routes else "passthrough_routes is empty"
            raise APIError(
                404,
                f"{route} is not served here, and not passed through to the upstream API ({passed}). "
                f"{PASSTHROUGH_ROUTES_SETTING}",
                code="route_not_passed_through",
            )
        if _LOOP_MARK in request.headers:
            raise APIError(
                508,
                f"The upstream API at {upstream.base_url} sent {normal} back to this "
                "server: the upstream must be another API, not this endpoint.",
                type="server_error",
                code="upstream_loop",
            )
        return await _forward(request, upstream, normal)

    return passthrough


def install_passthrough_route(app: FastAPI, forward: Forward) -> None:
    """Answer every `/v1/...` route no earlier route took with `forward` (`passthrough_handler`).

    Install it last: routes match in order, and this one matches any path under `/v1/`.
    """
    app.api_route(PASSTHROUGH_PATH, methods=PASSTHROUGH_METHODS, include_in_schema=False)(forward)


async def _forward(request: Request, upstream: Upstream, path: str) -> StreamingResponse:
    """`request` sent to `path` (a normalised `/v1/...` path) on the upstream."""
    # A client per request, closed with its answer: the app has no lifespan hook to close a shared one, and
    # pass-through requests are few next to the policy's own.
    import httpx

    body = await request.body()  # within the app's body limit (`lightning_sdk.serving.limits`): 413 beyond
    client = httpx.AsyncClient(timeout=_TIMEOUT_S)

    headers = {
        name: value
        for name, value in request.headers.items()
        if name.lower() not in _REQUEST_HEADERS_NOT_FORWARDED
    }
    if upstream.api_key:
        headers["authorization"] = f"Bearer {upstream.api_key}"
    headers[_LOOP_MARK] = "1"
    outgoing = client.build_request(
        request.method,
        upstream.url_for(path),
        params=request.query_params,
        headers=headers,
        content=body,
    )
    try:
        answer = await client.send(outgoing, stream=True)
    except httpx.HTTPError as error:
        await client.aclose()
        log.warning("pass-through to %s failed: %s", upstream.base_url, error)
        raise APIError(
            502,
            f"The upstream API at {upstream.base_url} did not answer {request.method} {path}: {error!r}",
            type="server_error",
            code="upstream_unreachable",
        ) from error
    answer_headers = {
        name: value
        for name, value in answer.headers.items()
        if name.lower() not in _ANSWER_HEADERS_NOT_FORWARDED
    }
    # Raw bytes: the body stays exactly as the upstream encoded it (its content-encoding header comes along).
    return StreamingResponse(
        answer.aiter_raw(),
        status_code=answer.status_code,
        headers=answer_headers,
        background=BackgroundTask(_close, answer, client),
    )


async def _close(answer: httpx.Response, client: httpx.AsyncClient) -> None:
    await answer.aclose()
    await client.aclose()
