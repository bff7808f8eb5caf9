"""The policy's OpenAI API (and Anthropic's Messages API) as functions of a request's JSON body: what the
`/v1` routes call, and what routes that serve the same requests under another base URL call too (the rollouts
gateway).

`OpenAIAPI.serve(kind, body, observe)` answers a chat completion, text completion, Responses or Messages
request exactly as `POST /v1/chat/completions`, `/v1/completions`, `/v1/responses` or `/v1/messages` does,
and hands `observe` what it served as plain data (`lightning_sdk.serving.served`); `count_tokens(body)`
answers `POST /v1/messages/count_tokens`. `create_app` builds one per app; `openai_api(app)` finds it for the
app's route installers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request

from lightning_sdk.serving.chat.api import serve_chat, serve_completions
from lightning_sdk.serving.context import MODEL_ALIASES, ServingContext
from lightning_sdk.serving.http.disconnect import until_disconnected
from lightning_sdk.serving.messages.api import count_message_tokens, serve_messages
from lightning_sdk.serving.passthrough.forward import Forward
from lightning_sdk.serving.responses.api import serve_responses
from lightning_sdk.serving.served import ApiKind, ServedCall, ServedObserver
from lightning_sdk.tracing.routing import LANE_HEADER, ROLE_HEADER

if TYPE_CHECKING:
    from lightning_sdk.engine.types import Engine

__all__ = ["API_PATHS", "COUNT_TOKENS_PATH", "OpenAIAPI", "install_openai_routes", "openai_api"]

API_PATHS: Mapping[ApiKind, str] = {
    "chat": "/chat/completions",
    "completion": "/completions",
    "responses": "/responses",
    "messages": "/messages",
}
"""Where each API is served, under a base URL (`/v1`)."""
COUNT_TOKENS_PATH = "/messages/count_tokens"
"""Where the Messages API counts a prompt's tokens, under a base URL (not an LLM call: never recorded)."""

_Serve = Callable[[ServingContext, Any, ServedObserver | None], Awaitable[Any]]


class OpenAIAPI:
    """The app's OpenAI API: `serve` a request body of one kind, list the `models`, `pass_through` any other
    request (to the upstream API, or refused). Keys are not checked here: that is the calling route's job."""

    def __init__(self, ctx: ServingContext, forward: Forward) -> None:
        self.ctx = ctx
        self._forward = forward

    async def serve(
        self,
        kind: ApiKind,
        body: Any,
        observe: ServedObserver | None = None,
        role: str | None = None,
        lane: str | None = None,
    ) -> Any:
        """The answer to `body` (a JSON value) as `/v1` gives it: a JSON-ready dict, or a streaming response.
        `observe`, when given, is called once with what was served (for a stream, when it ends). `role`: the
        request's role header (`lightning_sdk.tracing.routing.ROLE_HEADER`), whose adapter answers; `lane`:
        its lane header (`LANE_HEADER`), whose sampling policy samples it."""
        ctx = self.ctx.for_request(role, body, lane)
        if observe is not None:
            observe = _stamped(observe, ctx.adapter, ctx.engine)
        return await _SERVE[kind](ctx, body, observe)

    def count_tokens(self, body: Any, role: str | None = None) -> dict[str, Any]:
        """`POST /v1/messages/count_tokens` for `body` (a JSON value); `role` as in `serve`."""
        return count_message_tokens(self.ctx.for_request(role, body), body)

    def models(self) -> dict[str, Any]:
        """`GET /v1/models`: the model served, and each role with an adapter of its own."""
        ctx = self.ctx
        entry = self._model_entry()
        roles = [{**entry, "id": role, "parent": ctx.served} for role in sorted(ctx.roles)]
        return {"object": "list", "data": [entry, *roles]}

    def model(self, model_id: str) -> dict[str, Any] | None:
        """`GET /v1/models/<id>` of a model this server serves (its name, an alias, a role), else `None`."""
        ctx = self.ctx
        if model_id == ctx.served or model_id in MODEL_ALIASES:
            return {**self._model_entry(), "id": model_id}
        if model_id in ctx.roles:
            return {**self._model_entry(), "id": model_id, "parent": ctx.served}
        return None

    def _model_entry(self) -> dict[str, Any]:
        engine = self.ctx.engine
        return {
            "id": self.ctx.served,
            "object": "model",
            "created": 0,
            "owned_by": "lightning-sdk",
            "max_model_len": engine.max_model_len,
            "weight_version": engine.weight_version,
        }

    async def pass_through(self, request: Request, path: str) -> Any:
        """Any other `/v1/<path>` request: to the upstream API, or a 404 that says how to name one."""
        return await self._forward(request, path)


def openai_api(app: FastAPI) -> OpenAIAPI:
    """The `OpenAIAPI` of an app built by `create_app` (route installers use it to serve the same requests
    under another base URL)."""
    api = getattr(app.state, "openai_api", None)
    if not isinstance(api, OpenAIAPI):
        raise RuntimeError(
            "This app was not built by lightning_sdk.serving.app.create_app: it has no OpenAI API."
        )
    return api


def install_openai_routes(app: FastAPI, api: OpenAIAPI) -> None:
    """`GET /v1/models` (and `/v1/models/<id>`) and `POST /v1/chat/completions`, `/v1/completions`,
    `/v1/responses`, `/v1/messages` and `/v1/messages/count_tokens`, behind the key; `openai_api(app)`
    returns `api` afterwards. A generating route whose client goes away stops its generation
    (`lightning_sdk.serving.http.disconnect`)."""
    app.state.openai_api = api

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        api.ctx.authorize(request)
        return api.models()

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, request: Request) -> Any:
        api.ctx.authorize(request)
        # Another model's entry is the upstream's to answer (a pass-through route by default), or a 404.
        return api.model(model_id) or await api.pass_through(request, f"models/{model_id}")

    for kind, path in API_PATHS.items():
        app.add_api_route(f"/v1{path}", _route(api, kind), methods=["POST"], name=kind)

    @app.post(f"/v1{COUNT_TOKENS_PATH}")
    async def count_tokens(request: Request) -> dict[str, Any]:
        return api.count_tokens(await api.ctx.read_json(request), role=request.headers.get(ROLE_HEADER))


def _route(api: OpenAIAPI, kind: ApiKind) -> Callable[[Request], Awaitable[Any]]:
    async def route(request: Request) -> Any:
        body = await api.ctx.read_json(request)
        headers = request.headers
        answer = api.serve(kind, body, role=headers.get(ROLE_HEADER), lane=headers.get(LANE_HEADER))
        return await until_disconnected(request, answer)

    return route


def _stamped(observe: ServedObserver, adapter: str | None, engine: Engine) -> ServedObserver:
    """`observe` told which adapter answered and which weights: the engine's version as the answer ends.
    Weights change only once no request is in flight (`RequestGate`), and an update takes seconds, not
    the instant between the last token and this call."""

    def observed(served: ServedCall) -> None:
        observe(dataclasses.replace(served, adapter=adapter, weight_version=engine.weight_version))

    return observed


_SERVE: Mapping[ApiKind, _Serve] = {
    "chat": serve_chat,
    "completion": serve_completions,
    "responses": serve_responses,
    "messages": serve_messages,
}
