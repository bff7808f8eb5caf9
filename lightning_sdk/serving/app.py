"""The OpenAI-compatible FastAPI app over any `Engine`, which also speaks Anthropic's Messages API.

Endpoints: `GET /v1/models`, `POST /v1/chat/completions`, `POST /v1/completions`, `POST /v1/responses`,
`POST /v1/messages` and `POST /v1/messages/count_tokens` (all with the key, as a bearer token or in
`x-api-key`), and `GET /health` and `GET /openapi.json` (no key). Any other `/v1/...` request passes through
to an upstream API when it is one of the upstream's pass-through routes, or gets a 404 that names the route
and the setting. Every error is an OpenAI error object with a 4xx/5xx status, or Anthropic's error object on
the Messages paths; the app never leaves a connection hanging when the engine fails. Every route reads its
body within the app's `RequestLimits` (`lightning_sdk.serving.limits`), and a request whose client goes
away stops its generation (`lightning_sdk.serving.http.disconnect`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from lightning_sdk.engine.types import Engine
from lightning_sdk.serving.chat.template import template_supports_tools
from lightning_sdk.serving.context import MODEL_ALIASES, ServingContext
from lightning_sdk.serving.errors import APIError
from lightning_sdk.serving.limits import BodyLimit, RequestLimits
from lightning_sdk.serving.messages.errors import is_messages_path, messages_error
from lightning_sdk.serving.openai_api import OpenAIAPI, install_openai_routes
from lightning_sdk.serving.options import AppOptions
from lightning_sdk.serving.passthrough.forward import (
    SERVE_UPSTREAM_SETTING,
    install_passthrough_route,
    passthrough_handler,
)
from lightning_sdk.serving.routes.openapi import openapi_document
from lightning_sdk.serving.tools.parsers import HERMES, ToolCallParser, make_tool_parser

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["MODEL_ALIASES", "create_app"]

log = logging.getLogger(__name__)


def create_app(engine: Engine, options: AppOptions | None = None) -> FastAPI:
    """Build the app serving `engine` as `options` say (`AppOptions`; default: no key, for trusted local use
    only, and nothing else set).

    The owner (the trainer) changes every request's sampling between phases through
    `options.sampling_policy`; `options.routes` add more routes behind the same key (the trainer's runner
    protocol), which find the app's OpenAI API with `openai_api(app)` (`lightning_sdk.serving.openai_api`).
    Other `/v1/...` requests go to `options.upstream` (`lightning_sdk.serving.passthrough.forward`), or get a
    404 that ends with `options.upstream_setting`. Every route reads its body within `options.limits`.
    """
    options = options or AppOptions()
    limits = options.limits or RequestLimits()
    ctx = ServingContext(
        engine,
        options.api_key,
        options.model_name or engine.model.name,
        options.default_max_tokens,
        options.sampling_policy,
        _tool_parser(options.tool_parser, engine.tokenizer),
        roles=set(options.roles),
        limits=limits,
    )
    app = FastAPI(title="lightning-sdk", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.request_limits = limits  # read by routes installed later (`limits.read_json_body`)
    app.add_middleware(BodyLimit, limits=limits)
    setting = options.upstream_setting or SERVE_UPSTREAM_SETTING
    forward = passthrough_handler(ctx.authorize, options.upstream, setting)
    install_error_handlers(app)
    install_info_routes(app, ctx)
    install_openai_routes(app, OpenAIAPI(ctx, forward))
    for install in options.routes:
        install(app, ctx.authorize)
    install_passthrough_route(app, forward)  # last: it takes any /v1/ path
    return app


def install_error_handlers(app: FastAPI) -> None:
    """Every failure becomes an error object with its status: OpenAI's, or Anthropic's on the Messages
    paths (wherever they are mounted: the key and lease checks run before the route)."""

    @app.exception_handler(APIError)
    async def api_error(request: Request, error: APIError) -> JSONResponse:
        return _error_response(request, error)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        return _error_response(request, APIError(error.status_code, str(error.detail)))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception) -> JSONResponse:
        log.exception("request failed", exc_info=error)
        return _error_response(request, APIError(500, f"Internal error: {error}", type="server_error"))


def _error_response(request: Request, error: APIError) -> JSONResponse:
    if is_messages_path(request.url.path):
        body = messages_error(error.status, error.message).model_dump()
    else:
        body = error.body()
    return JSONResponse(body, status_code=error.status)


def install_info_routes(app: FastAPI, ctx: ServingContext) -> None:
    """`/health` and `/openapi.json` (no key)."""

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": ctx.served, "weight_version": ctx.engine.weight_version}

    @app.get("/openapi.json")
    async def openapi() -> dict[str, Any]:
        from lightning_sdk.version import __version__

        return openapi_document("lightning-sdk", __version__, ctx.served)


def _tool_parser(name: str, tokenizer: PreTrainedTokenizerBase) -> ToolCallParser:
    """The parser called `name`; another format than Hermes needs a template that shows the model its tools
    (for the others the server describes the tools in the Hermes format itself)."""
    if name != HERMES and not template_supports_tools(tokenizer):
        raise ValueError(
            f"tool_parser={name!r}: this model's chat template does not render tools, so the server "
            "tells the model about them in the Hermes format and reads Hermes calls. Use "
            "tool_parser='hermes', or a model whose template renders tools in the format of the parser."
        )
    return make_tool_parser(name, tokenizer)
