"""The OpenAI-compatible FastAPI app over any `Engine`.

Endpoints: `GET /v1/models`, `POST /v1/chat/completions`, `POST /v1/completions` (all with a bearer key),
and `GET /health` and `GET /openapi.json` (no key). Every error is an OpenAI error object with a 4xx/5xx status; the app never
leaves a connection hanging when the engine fails.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from lightning_sdk.engine.types import Engine, EngineError, PromptTooLongError, check_prompt_fits
from lightning_sdk.serving.chat_template import render_chat, tool_choice_prefix
from lightning_sdk.serving.errors import APIError, error_body
from lightning_sdk.serving.openapi import openapi_document
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
from lightning_sdk.serving.schemas import (
    ChatRequest,
    CompletionRequest,
    parse_request,
    requested_top_logprobs,
    sampling_params,
)
from lightning_sdk.serving.streaming import chat_events, completion_events, first_and_rest, merged_streams
from lightning_sdk.serving.tool_calls import ParsedOutput, parse_tool_calls, validate_tools

__all__ = ["RouteInstaller", "create_app"]

RouteInstaller = Callable[[FastAPI, Callable[[Request], None]], None]
"""Adds routes to the app: called with the app and its `authorize(request)` check (raises on a bad key)."""

log = logging.getLogger(__name__)
MODEL_ALIASES = ("default",)
"""Model names accepted besides the served name (many agent examples send `model="default"`)."""


def create_app(
    engine: Engine,
    *,
    api_key: str | None,
    model_name: str | None = None,
    default_max_tokens: int | None = None,
    sampling_policy: SamplingPolicy | None = None,
    routes: Sequence[RouteInstaller] = (),
) -> FastAPI:
    """Build the app. `api_key=None` turns authentication off (for trusted local use only).

    `sampling_policy` lets the owner (the trainer) override every request's sampling between phases;
    `routes` add more routes behind the same key (the trainer's runner protocol).
    """
    policy = sampling_policy or SamplingPolicy()
    served = model_name or engine.model.name
    app = FastAPI(title="lightning-sdk", docs_url=None, redoc_url=None, openapi_url=None)
    tokenizer = engine.tokenizer

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

    def authorize(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not given.startswith("Bearer ") or not hmac.compare_digest(given[7:].strip(), api_key):
            raise APIError.unauthorized("Missing or incorrect API key: send 'Authorization: Bearer <key>'.")

    async def read(request: Request, cls: type) -> Any:
        authorize(request)
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise APIError.bad_request(
                f"The request body is not valid JSON: {error}", code="invalid_json"
            ) from None
        parsed = parse_request(cls, body)
        if parsed.model != served and parsed.model not in MODEL_ALIASES and not policy.accept_any_model:
            raise APIError.model_not_found(parsed.model, served)
        return parsed

    def params_for(
        request: ChatRequest | CompletionRequest, prompt_len: int, top: int, asked: int | None
    ) -> Any:
        max_tokens = asked if asked is not None else max(1, engine.max_model_len - prompt_len)
        if asked is None and default_max_tokens is not None:
            max_tokens = min(max_tokens, default_max_tokens)
        params = policy.apply(sampling_params(request, max_tokens, top, getattr(engine, "max_n", 16)))
        try:
            check_prompt_fits(prompt_len, params.max_tokens, engine.max_model_len)
        except PromptTooLongError as error:
            raise APIError.bad_request(str(error), param="messages", code="context_length_exceeded") from None
        except ValueError as error:
            raise APIError.bad_request(str(error), param="prompt") from None
        return params

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": served, "weight_version": engine.weight_version}

    @app.get("/openapi.json")
    async def openapi() -> dict[str, Any]:
        from lightning_sdk import __version__

        return openapi_document("lightning-sdk", __version__, served)

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        authorize(request)
        entry = {
            "id": served,
            "object": "model",
            "created": 0,
            "owned_by": "lightning-sdk",
            "max_model_len": engine.max_model_len,
            "weight_version": engine.weight_version,
        }
        return {"object": "list", "data": [entry]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        req: ChatRequest = await read(request, ChatRequest)
        tools = validate_tools(req.tools)  # checked even when tool_choice="none", as OpenAI does
        prefix = tool_choice_prefix(req.tool_choice, tools)
        if req.tool_choice == "none":
            tools = []  # the model is not told about them, so it cannot call one
        prompt = render_chat(tokenizer, req.messages, tools, prefix)
        want_logprobs, top = requested_top_logprobs(req)
        limit = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        params = params_for(req, len(prompt), top, limit)
        meta = ResponseMeta("chatcmpl", served, engine.weight_version)
        if req.stream:
            _, deltas = await run(first_and_rest(engine.astream(prompt, params)))
            events = chat_events(
                deltas,
                meta=meta,
                tokenizer=tokenizer,
                prompt_token_ids=prompt,
                n=params.n,
                tools_active=bool(tools),
                assistant_prefix=prefix,
                top_logprobs=top if want_logprobs else None,
                include_usage=req.include_usage,
            )
            return StreamingResponse(events, media_type="text/event-stream")
        result = await run(engine.agenerate(prompt, params))
        meta.weight_version = result.weight_version
        choices = []
        for completion in result.completions:
            parsed = (
                parse_tool_calls(prefix + completion.text) if tools else ParsedOutput(completion.text, [])
            )
            logprobs = None
            if want_logprobs:
                logprobs = chat_logprobs(
                    tokenizer, completion.token_ids, completion.logprobs, completion.top_logprobs, top
                )
            choices.append(chat_choice(completion, parsed, logprobs))
        return chat_response(meta, result, choices)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        req: CompletionRequest = await read(request, CompletionRequest)
        prompts = _prompt_ids(tokenizer, req.prompt)
        want_logprobs, top = requested_top_logprobs(req)
        params = params_for(req, max(len(p) for p in prompts), top, req.max_tokens)
        meta = ResponseMeta("cmpl", served, engine.weight_version)
        if req.stream:
            _, deltas = await run(first_and_rest(merged_streams(engine, prompts, params)))
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
        results = await run(asyncio.gather(*(engine.agenerate(p, params) for p in prompts)))
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

    for install in routes:
        install(app, authorize)
    return app


async def run(awaitable: Any) -> Any:
    """Await an engine call, mapping its failures to OpenAI errors (400 for bad input, 500 otherwise)."""
    try:
        return await awaitable
    except APIError:
        raise
    except PromptTooLongError as error:
        raise APIError.bad_request(str(error), param="messages", code="context_length_exceeded") from None
    except StopAsyncIteration:
        raise APIError.server_error("The engine returned no output for this request.") from None
    except EngineError as error:
        raise APIError.server_error(str(error)) from None
    except ValueError as error:
        raise APIError.bad_request(str(error)) from None
    except Exception as error:
        log.exception("engine call failed")
        raise APIError.server_error(f"The engine failed: {error}") from None


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
