"""The runner protocol, on the trainer's OpenAI-compatible server and behind the same bearer key.

- `POST /v1/rollouts/lease` `{"runner": name, "wait_s": s}`: 200 with a lease (rollout id, lease id, task,
  policy version, attempt, `renew_within_s`, and `base_url`: the OpenAI endpoint as this client reached
  the server), or 204 when no rollout opened within `wait_s` (at most 30 s: a long poll).
- `POST /v1/rollouts/<id>/renew` `{"lease_id"}`: keeps the lease; 409 when it was lost.
- `POST /v1/rollouts/<id>/episode` `{"lease_id", "episode"}`: the recorded episode (the JSON of
  `Episode.to_dict()`); 200 `{"stored": true}`, or `{"stored": false}` for a repeated upload; 409 when the
  rollout is no longer leased under this lease; 404 for a rollout that is not open.
- `GET /v1/rollouts`: how many open rollouts are pending, leased and done.
- The gateway (`lightning_sdk.rollouts.gateway`), for agents that do not record themselves:
  `POST /rollouts/<id>/<lease id>/v1/chat/completions` (and `/completions`, `/responses`, `GET .../models`)
  answer as `/v1` does and record the call into the lease's episode; other routes under that base URL (an
  agent's embeddings) pass through as on `/v1` and are not recorded; `POST /v1/rollouts/<id>/reward`
  `{"lease_id", "reward", "step_rewards"?, "output"?, "error"?, "name"?}` completes the rollout.

Every error is an OpenAI-style error object; nothing already stored changes on a refused request.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response, StreamingResponse
from fastapi.routing import APIRoute

from lightning_sdk.rollouts.gateway import GatewayRecorder, parse_reward_report
from lightning_sdk.rollouts.queue import LeaseLost, RolloutQueue, UnknownRollout
from lightning_sdk.serving.errors import APIError
from lightning_sdk.serving.passthrough import PASSTHROUGH_METHODS, passthrough_endpoint
from lightning_sdk.tracing.episode import Episode

__all__ = ["MAX_EPISODE_BYTES", "MAX_LEASE_WAIT_S", "install_rollout_routes"]

MAX_LEASE_WAIT_S = 30.0
"""Longest long poll of a lease request."""
MAX_EPISODE_BYTES = 32 * 1024 * 1024
"""Largest episode upload; a larger one is refused with 413 (an episode of a 135M model's rollout is
tens of kilobytes; this leaves room for long multi-agent episodes)."""


def install_rollout_routes(
    app: FastAPI,
    authorize: Callable[[Request], None],
    queue: RolloutQueue,
    max_episode_bytes: int = MAX_EPISODE_BYTES,
) -> None:
    """Add the runner protocol's routes to `app` (`authorize(request)` raises for a wrong or missing key)."""

    @app.post("/v1/rollouts/lease")
    async def lease(request: Request) -> Any:
        authorize(request)
        body = await _json_object(request, 64 * 1024)
        runner = body.get("runner", "runner")
        wait_s = body.get("wait_s", 0.0)
        if not isinstance(runner, str) or not runner or len(runner) > 200:
            raise APIError.bad_request(
                "runner must be a non-empty name of at most 200 characters.", param="runner"
            )
        if (
            isinstance(wait_s, bool)
            or not isinstance(wait_s, int | float)
            or not 0 <= wait_s <= MAX_LEASE_WAIT_S
        ):
            raise APIError.bad_request(
                f"wait_s must be a number from 0 to {MAX_LEASE_WAIT_S:g}.", param="wait_s"
            )
        granted = await run_in_threadpool(queue.lease, runner, float(wait_s))
        if granted is None:
            return Response(status_code=204)
        root = str(request.base_url).rstrip("/")
        return {
            "rollout_id": granted.rollout_id,
            "lease_id": granted.lease_id,
            "task": granted.task,
            "policy_version": granted.policy_version,
            "attempt": granted.attempt,
            "renew_within_s": granted.renew_within_s,
            "base_url": f"{root}/v1",
            "gateway_base_url": f"{root}/rollouts/{granted.rollout_id}/{granted.lease_id}/v1",
        }

    @app.post("/v1/rollouts/{rollout_id}/renew")
    async def renew(rollout_id: str, request: Request) -> Any:
        authorize(request)
        body = await _json_object(request, 64 * 1024)
        with _protocol_errors():
            return {"renew_within_s": queue.renew(rollout_id, _lease_id(body))}

    @app.post("/v1/rollouts/{rollout_id}/episode")
    async def episode(rollout_id: str, request: Request) -> Any:
        authorize(request)
        body = await _json_object(request, max_episode_bytes)
        lease_id = _lease_id(body)
        recorded = _valid_episode(body.get("episode"))
        with _protocol_errors():
            stored = queue.complete(rollout_id, lease_id, recorded)
        return {"stored": stored}

    @app.get("/v1/rollouts")
    async def status(request: Request) -> Any:
        authorize(request)
        return queue.stats()

    _install_gateway(app, authorize, queue)


def _install_gateway(app: FastAPI, authorize: Callable[[Request], None], queue: RolloutQueue) -> None:
    """Per-lease copies of the app's own OpenAI routes that record each call, and the reward route."""
    recorder = GatewayRecorder(queue)
    own = {
        (route.path, method): route.endpoint
        for route in app.routes
        if isinstance(route, APIRoute)
        for method in route.methods
    }

    def recorded(api: str, path: str) -> Callable[..., Any]:
        serve = own[(path, "POST")]

        async def gateway_route(rollout_id: str, lease_id: str, request: Request) -> Any:
            authorize(request)
            with _protocol_errors():
                recorder.check(rollout_id, lease_id)
            body = await _json_object(request, MAX_EPISODE_BYTES)
            base_url = str(request.base_url).rstrip("/") + f"/rollouts/{rollout_id}/{lease_id}/v1"
            template = recorder.template(api, body, base_url)
            response = await serve(request)  # the body was read above; Starlette hands it out again
            if isinstance(response, StreamingResponse):
                response.body_iterator = recorder.record_stream(
                    rollout_id, lease_id, api, template, aiter(response.body_iterator)
                )
            else:
                recorder.record_response(rollout_id, lease_id, api, template, response)
            return response

        return gateway_route

    app.post("/rollouts/{rollout_id}/{lease_id}/v1/chat/completions")(
        recorded("chat", "/v1/chat/completions")
    )
    app.post("/rollouts/{rollout_id}/{lease_id}/v1/completions")(recorded("completion", "/v1/completions"))
    app.post("/rollouts/{rollout_id}/{lease_id}/v1/responses")(recorded("responses", "/v1/responses"))
    models = own[("/v1/models", "GET")]

    @app.get("/rollouts/{rollout_id}/{lease_id}/v1/models")
    async def gateway_models(rollout_id: str, lease_id: str, request: Request) -> Any:
        return await models(request)

    @app.api_route(
        "/rollouts/{rollout_id}/{lease_id}/v1/{path:path}",
        methods=PASSTHROUGH_METHODS,
        include_in_schema=False,
    )
    async def gateway_other(rollout_id: str, lease_id: str, path: str, request: Request) -> Any:
        # Not a policy call (an agent's embeddings, say): answered as on /v1, so passed through to the
        # upstream or refused there, and not recorded. The lease must still be held.
        authorize(request)
        with _protocol_errors():
            recorder.check(rollout_id, lease_id)
        return await passthrough_endpoint(app)(request, path)

    @app.post("/v1/rollouts/{rollout_id}/reward")
    async def reward(rollout_id: str, request: Request) -> Any:
        authorize(request)
        body = await _json_object(request, MAX_EPISODE_BYTES)
        lease_id = _lease_id(body)
        try:
            report = parse_reward_report(body)
        except ValueError as error:
            raise APIError.bad_request(str(error), code="invalid_reward") from None
        base_url = str(request.base_url).rstrip("/") + f"/rollouts/{rollout_id}/{lease_id}/v1"
        with _protocol_errors():
            recorder.check(rollout_id, lease_id)
            try:
                episode = recorder.finish(rollout_id, lease_id, queue.task(rollout_id), report, base_url)
            except ValueError as error:
                raise APIError.bad_request(str(error), param="step_rewards", code="invalid_reward") from None
            stored = queue.complete(rollout_id, lease_id, episode)
        return {"stored": stored, "calls": len(episode["calls"])}


async def _json_object(request: Request, limit: int) -> dict[str, Any]:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"The request body is larger than {limit} bytes.", code="payload_too_large")
    raw = b""
    async for chunk in request.stream():  # counted as it arrives, so a missing Content-Length cannot lie
        raw += chunk
        if len(raw) > limit:
            raise APIError(413, f"The request body is larger than {limit} bytes.", code="payload_too_large")
    request._body = raw  # Starlette's cache of the body: the gateway hands the request on to the app's route
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise APIError.bad_request(
            f"The request body is not valid JSON: {error}", code="invalid_json"
        ) from None
    if not isinstance(body, dict):
        raise APIError.bad_request("The request body must be a JSON object.", code="invalid_json")
    return body


def _lease_id(body: dict[str, Any]) -> str:
    lease_id = body.get("lease_id")
    if not isinstance(lease_id, str) or not lease_id:
        raise APIError.bad_request("lease_id (from the lease) is required.", param="lease_id")
    return lease_id


def _valid_episode(data: Any) -> dict[str, Any]:
    """The episode as stored: it must load as an `Episode` (what the trainer will do with it)."""
    if not isinstance(data, dict):
        raise APIError.bad_request("episode must be the JSON object of Episode.to_dict().", param="episode")
    try:
        return Episode.from_dict(data).to_dict()
    except (TypeError, ValueError, AttributeError, KeyError) as error:
        raise APIError.bad_request(
            f"episode is not a valid Episode: {error}", param="episode", code="invalid_episode"
        ) from None


@contextmanager
def _protocol_errors() -> Iterator[None]:
    """Queue refusals as HTTP errors: 404 for a rollout that is not open, 409 for a lost lease."""
    try:
        yield
    except UnknownRollout as error:
        raise APIError(
            404, f"No open rollout {error.args[0]!r}: its step may be over.", code="unknown_rollout"
        ) from None
    except LeaseLost as error:
        raise APIError(409, str(error), code="lease_lost") from None
