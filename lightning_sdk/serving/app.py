"""The OpenAI-compatible FastAPI app over any `Engine`.

Endpoints: `GET /v1/models`, `POST /v1/chat/completions`, `POST /v1/completions`, `POST /v1/responses`
(all with a bearer key), and `GET /health` and `GET /openapi.json` (no key). Any other `/v1/...` request
passes through to an upstream API, or gets a 404 that says how to name one. Every error is an OpenAI error
object with a 4xx/5xx status; the app never leaves a connection hanging when the engine fails.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from lightning_sdk.engine.types import Engine
from lightning_sdk.serving.chat_template import template_supports_tools
from lightning_sdk.serving.context import MODEL_ALIASES, ServingContext, run_engine
from lightning_sdk.serving.errors import APIError, error_body
from lightning_sdk.serving.openapi import openapi_document
from lightning_sdk.serving.passthrough import SERVE_UPSTREAM_SETTING, install_passthrough_route
from lightning_sdk.serving.policy import SamplingPolicy
from lightning_sdk.serving.responses import (
    ResponseMeta,
    chat_choice,
    chat_logprobs,
    chat_response,
    completion_choice,
    completion_logprobs,
    completion_response,
)
from lightning_sdk.serving.responses_api import install_responses_routes
from lightning_sdk.serving.schemas import ChatRequest, CompletionRequest, requested_top_logprobs
from lightning_sdk.serving.streaming import chat_events, completion_events, first_and_rest, merged_streams
from lightning_sdk.serving.tool_parsers import HERMES, ToolCallParser, make_tool_parser
from lightning_sdk.serving.upstream import Upstream

__all__ = ["MODEL_ALIASES", "RouteInstaller", "create_app"]

RouteInstaller = Callable[[FastAPI, Callable[[Request], None]], None]
"""Adds routes to the app: called with the app and its `authorize(request)` check (raises on a bad key)."""

log = logging.getLogger(__name__)


def create_app(
    engine: Engine,
    *,
    api_key: str | None,
    model_name: str | None = None,
    default_max_tokens: int | None = None,
    sampling_policy: SamplingPolicy | None = None,
    routes: Sequence[RouteInstaller] = (),
    upstream: Upstream | None = None,
    upstream_setting: str = SERVE_UPSTREAM_SETTING,
    tool_parser: str = HERMES,
) -> FastAPI:
    """Build the app. `api_key=None` turns authentication off (for trusted local use only).

    `sampling_policy` lets the owner (the trainer) override every request's sampling between phases;
    `routes` add more routes behind the same key (the trainer's runner protocol). Other `/v1/...`
    requests go to `upstream` (`lightning_sdk.serving.passthrough`), or get a 404 that ends with
    `upstream_setting`: how the owner names an upstream. `tool_parser` names the tool-call format the
    model writes (`lightning_sdk.serving.tool_parsers`).
    """
    ctx = ServingContext(
        engine,
        api_key,
        model_name or engine.model.name,
        default_max_tokens,
        sampling_policy or SamplingPolicy(),
        _tool_parser(tool_parser, engine.tokenizer),
    )
    app = FastAPI(title="lightning-sdk", docs_url=None, redoc_url=None, openapi_url=None)
    install_error_handlers(app)
    install_info_routes(app, ctx)
    install_chat_route(app, ctx)
    install_completions_route(app, ctx)
    install_responses_routes(app, ctx)
    for install in routes:
        install(app, ctx.authorize)
    install_passthrough_route(app, ctx.authorize, upstream, upstream_setting)  # last: it takes any /v1/ path
    return app


def install_error_handlers(app: FastAPI) -> None:
    """Every failure becomes an OpenAI error object with its status."""

    @app.exception_handler(APIError)
    async def api_error(_: Request, error: APIError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(
            error_body(str(error.detail), "invalid_request_error"), status_code=error.status_code
        )

    @app.exception_handler(Exception)
    async def unexpected(_: Request, error: Exception) -> JSONResponse:
        log.exception("request failed", exc_info=error)
        return JSONResponse(error_body(f"Internal error: {error}", "server_error"), status_code=500)


def install_info_routes(app: FastAPI, ctx: ServingContext) -> None:
    """`/health`, `/openapi.json` (no key) and `/v1/models`."""

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": ctx.served, "weight_version": ctx.engine.weight_version}

    @app.get("/openapi.json")
    async def openapi() -> dict[str, Any]:
        from lightning_sdk.version import __version__

        return openapi_document("lightning-sdk", __version__, ctx.served)

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        ctx.authorize(request)
        entry = {
            "id": ctx.served,
            "object": "model",
            "created": 0,
            "owned_by": "lightning-sdk",
            "max_model_len": ctx.engine.max_model_len,
            "weight_version": ctx.engine.weight_version,
        }
        return {"object": "list", "data": [entry]}


def install_chat_route(app: FastAPI, ctx: ServingContext) -> None:
    """`POST /v1/chat/completions`."""
    engine = ctx.engine

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        req: ChatRequest = await ctx.read(request, ChatRequest)
        prepared = ctx.prepare_chat(req)
        params = prepared.params
        meta = ResponseMeta("chatcmpl", ctx.served, engine.weight_version)
        if req.stream:
            _, deltas = await run_engine(first_and_rest(engine.astream(prepared.prompt, params)))
            events = chat_events(
                deltas,
                meta=meta,
                tokenizer=ctx.tokenizer,
                prompt_token_ids=prepared.prompt,
                n=params.n,
                text_filter=prepared.text_filter if prepared.tools else None,
                top_logprobs=prepared.top if prepared.want_logprobs else None,
                include_usage=req.include_usage,
            )
            return StreamingResponse(events, media_type="text/event-stream")
        result = await run_engine(engine.agenerate(prepared.prompt, params))
        meta.weight_version = result.weight_version
        choices = []
        for completion in result.completions:
            logprobs = None
            if prepared.want_logprobs:
                logprobs = chat_logprobs(
                    ctx.tokenizer,
                    completion.token_ids,
                    completion.logprobs,
                    completion.top_logprobs,
                    prepared.top,
                )
            choices.append(chat_choice(completion, prepared.parse(completion.text), logprobs))
        return chat_response(meta, result, choices)


def install_completions_route(app: FastAPI, ctx: ServingContext) -> None:
    """`POST /v1/completions`."""
    engine, tokenizer = ctx.engine, ctx.tokenizer

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        req: CompletionRequest = await ctx.read(request, CompletionRequest)
        prompts = _prompt_ids(tokenizer, req.prompt)
        want_logprobs, top = requested_top_logprobs(req)
        params = ctx.params_for(req, max(len(p) for p in prompts), top, req.max_tokens)
        meta = ResponseMeta("cmpl", ctx.served, engine.weight_version)
        if req.stream:
            _, deltas = await run_engine(first_and_rest(merged_streams(engine, prompts, params)))
            events = completion_events(
                deltas,
                meta=meta,
                tokenizer=tokenizer,
                prompts=prompts,
                n=params.n,
                top_logprobs=top if want_logprobs else None,
                include_usage=req.include_usage,
            )
            return StreamingResponse(events, media_type="text/event-stream")
        results = await run_engine(asyncio.gather(*(engine.agenerate(p, params) for p in prompts)))
        choices = []
        for position, result in enumerate(results):
            for completion in result.completions:
                logprobs = None
                if want_logprobs:
                    logprobs = completion_logprobs(
                        tokenizer, completion.token_ids, completion.logprobs, completion.top_logprobs, top
                    )
                choices.append(
                    completion_choice(
                        position * params.n + completion.index, result.prompt_token_ids, completion, logprobs
                    )
                )
        meta.weight_version = results[0].weight_version
        return completion_response(meta, results, choices)


def _prompt_ids(tokenizer: Any, prompt: Any) -> list[list[int]]:
    if isinstance(prompt, str):
        prompts: list[Any] = [prompt]
    elif prompt and all(isinstance(token, int) for token in prompt):
        prompts = [prompt]
    else:
        prompts = list(prompt)
    if not prompts:
        raise APIError.bad_request("prompt must not be empty.", param="prompt")
    vocab = len(tokenizer)
    result = []
    for item in prompts:
        ids = tokenizer.encode(item) if isinstance(item, str) else list(item)
        if not ids:
            raise APIError.bad_request("prompt must not be empty.", param="prompt")
        if any(not 0 <= token < vocab for token in ids):
            raise APIError.bad_request(f"prompt token ids must be between 0 and {vocab - 1}.", param="prompt")
        result.append(ids)
    return result


def _tool_parser(name: str, tokenizer: Any) -> ToolCallParser:
    """The parser called `name`; another format than Hermes needs a template that shows the model its tools
    (for the others the server describes the tools in the Hermes format itself)."""
    if name != HERMES and not template_supports_tools(tokenizer):
        raise ValueError(
            f"tool_parser={name!r}: this model's chat template does not render tools, so the server "
            "tells the model about them in the Hermes format and reads Hermes calls. Use "
            "tool_parser='hermes', or a model whose template renders tools in the format of the parser."
        )
    return make_tool_parser(name, tokenizer)
