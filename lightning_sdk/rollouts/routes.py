"""The runner protocol, on the trainer's OpenAI-compatible server and behind its key.

Two routers, one per resource; the key is one dependency, attached where each is mounted: `/v1/rollouts`
takes the run's own key only (`authorize(request, owner=True)`), the gateway also the model key a runner
hands its agent (`lightning_sdk.serving.keys`). The bodies are the
models of `lightning_sdk.rollouts.schemas`, which the runner uses too.

Rollouts (`/v1/rollouts`):

- `POST /v1/rollouts/lease` (`LeaseRequest`): 200 with a `GrantedLease` (the lease, and `base_url` /
  `gateway_base_url`: the OpenAI endpoint as this client reached the server, plain and recording), or 204
  when no rollout opened within `wait_s` (at most 30 s: a long poll).
- `POST /v1/rollouts/<id>/renew` (`RenewRequest`): keeps the lease (`RenewReply`).
- `POST /v1/rollouts/<id>/episode` (`EpisodeUpload`): the recorded episode (the JSON of
  `Episode.to_dict()`); `EpisodeStored` says whether it was stored now or by an earlier try of the upload.
- `POST /v1/rollouts/<id>/reward` (`RewardReport`): an agent that used the gateway is done; completes the
  rollout with the calls the gateway recorded (`RewardStored`).
- `GET /v1/rollouts`: how many open rollouts are pending, leased and done (`QueueStats`).

The gateway (`/rollouts/<id>/<lease id>/v1`, see `lightning_sdk.rollouts.gateway`): `chat/completions`,
`completions`, `responses` and Anthropic's `messages` are answered by the same code as on `/v1` and recorded
into the lease's episode; `GET models` and `messages/count_tokens` as on `/v1`, not recorded; anything else
(an agent's embeddings) passes through as on `/v1`, not recorded. Every request there needs the lease, and
renews it; a recorded request holds it until it is answered, however long the engine takes. (An Anthropic
client takes the gateway base URL without its `/v1`: it appends `/v1/messages`.)

Refusals are OpenAI-style error objects (Anthropic's on the gateway's Messages paths): 400 for a body that
does not validate (`param` names the field, such as `episode.rewards.r`) or is not JSON (nested past
`MAX_JSON_DEPTH` included), 401 for a wrong key, 403 (`model_key_only`) for the model key on
`/v1/rollouts`, 404 for a rollout that is not open, 409 for a lease that no
longer holds the rollout, 410 (`training_over`) once the trainer closed the queue, 413 for a body over its
size limit. Nothing of a refused request is stored. An episode or reward refused under the lease that holds
its rollout also ends that lease: the rollout goes to the next runner (`RolloutQueue.refuse`).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

from lightning_sdk.rollouts.gateway import GatewayRecorder
from lightning_sdk.rollouts.queue import LeaseLost, RolloutQueue, UnknownRollout
from lightning_sdk.rollouts.schemas import (
    GATEWAY_PATH,
    MAX_LEASE_WAIT_S,
    EpisodeStored,
    EpisodeUpload,
    GrantedLease,
    LeaseRequest,
    QueueStats,
    RenewReply,
    RenewRequest,
    RewardReport,
    RewardStored,
    WireBody,
    explain,
)
from lightning_sdk.serving.errors import APIError
from lightning_sdk.serving.openai_api import API_PATHS, COUNT_TOKENS_PATH, OpenAIAPI, openai_api
from lightning_sdk.serving.passthrough.forward import PASSTHROUGH_METHODS
from lightning_sdk.serving.routes.installer import Authorize
from lightning_sdk.serving.served import ApiKind
from lightning_sdk.tracing.routing import ROLE_HEADER, Roles

__all__ = [
    "MAX_EPISODE_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_LEASE_WAIT_S",
    "MAX_SMALL_BODY_BYTES",
    "gateway_router",
    "install_rollout_routes",
    "rollouts_router",
]

MAX_EPISODE_BYTES = 32 * 1024 * 1024
"""Largest episode upload (and gateway request); a larger one is refused with 413 (an episode of a 135M
model's rollout is tens of kilobytes; this leaves room for long multi-agent episodes)."""
MAX_SMALL_BODY_BYTES = 64 * 1024
"""Largest lease or renewal request."""
MAX_JSON_DEPTH = 100
"""Deepest nesting of objects and arrays a body may have: what is stored is copied and written by
recursive code, which a body nested thousands deep would exhaust (an episode nests a few dozen levels)."""

_Body = TypeVar("_Body", bound=WireBody)


def install_rollout_routes(
    app: FastAPI,
    authorize: Authorize,
    queue: RolloutQueue,
    max_episode_bytes: int = MAX_EPISODE_BYTES,
    routes: Mapping[str, str] | None = None,
    roles: Roles | None = None,
) -> None:
    """Mount the runner protocol's routers on `app` (built by `create_app`) behind its key: `authorize`
    raises for a wrong or missing one, and with `owner=True` (the `/v1/rollouts` routes) for the model key
    too. `routes` (the run's routing map) goes to runners with every lease."""

    async def run_key(request: Request) -> None:
        authorize(request, owner=True)

    async def model_key(request: Request) -> None:
        authorize(request)

    recorder = GatewayRecorder(queue)
    rollouts = rollouts_router(queue, recorder, max_episode_bytes, routes, roles)
    # Leases and uploads take the run's own key; the gateway is the agent's model endpoint and also takes
    # the model key a runner hands its agent (`serving/keys.py`).
    app.include_router(rollouts, dependencies=[Depends(run_key)])
    app.include_router(gateway_router(openai_api(app), queue, recorder), dependencies=[Depends(model_key)])


def rollouts_router(
    queue: RolloutQueue,
    recorder: GatewayRecorder,
    max_episode_bytes: int = MAX_EPISODE_BYTES,
    routes: Mapping[str, str] | None = None,
    roles: Roles | None = None,
) -> APIRouter:
    """`/v1/rollouts`: leases, renewals, uploads, rewards and the queue's state. Mount it behind the run's
    own key (`authorize(request, owner=True)`): behind the plain check the agents' model key would open it."""
    router = APIRouter(prefix="/v1/rollouts")
    running = [Depends(_training_not_over(queue))]

    @router.get("")
    async def status() -> QueueStats:
        return QueueStats.model_validate(queue.stats())

    @router.post("/lease", dependencies=running, response_model=None)
    async def lease(request: Request) -> GrantedLease | Response:
        asked = await _read(request, LeaseRequest, MAX_SMALL_BODY_BYTES)
        granted = await run_in_threadpool(queue.lease, asked.runner, asked.wait_s)
        if granted is None:
            _refuse_when_over(queue)  # the queue closed during the long poll
            return Response(status_code=204)
        return GrantedLease.of(granted, _server_root(request), routes, roles)

    @router.post("/{rollout_id}/renew", dependencies=running)
    async def renew(rollout_id: str, request: Request) -> RenewReply:
        asked = await _read(request, RenewRequest, MAX_SMALL_BODY_BYTES)
        with _protocol_errors():
            return RenewReply(
                renew_within_s=queue.renew(rollout_id, asked.lease_id), paused_s=queue.paused_s()
            )

    @router.post("/{rollout_id}/episode", dependencies=running)
    async def episode(rollout_id: str, request: Request) -> EpisodeStored:
        upload = await _read(request, EpisodeUpload, max_episode_bytes, _reissue(queue, rollout_id))
        with _protocol_errors():
            return EpisodeStored(stored=queue.complete(rollout_id, upload.lease_id, upload.stored_episode()))

    @router.post("/{rollout_id}/reward", dependencies=running)
    async def reward(rollout_id: str, request: Request) -> RewardStored:
        report = await _read(request, RewardReport, max_episode_bytes, _reissue(queue, rollout_id))
        with _protocol_errors():
            held = queue.leased(rollout_id, report.lease_id)
            try:
                recorded = recorder.finish(held, report, _gateway_url(request, rollout_id, report.lease_id))
            except ValueError as error:
                queue.refuse(rollout_id, report.lease_id, str(error))
                raise APIError.bad_request(str(error), param="step_rewards", code="invalid_reward") from None
            stored = queue.complete(rollout_id, report.lease_id, recorded)
        return RewardStored(stored=stored, calls=len(recorded["calls"]))

    return router


def gateway_router(api: OpenAIAPI, queue: RolloutQueue, recorder: GatewayRecorder) -> APIRouter:
    """`/rollouts/<id>/<lease id>/v1`: the app's OpenAI API, recorded into the lease's episode (mount it
    behind the key). Every request needs the lease, and renews it."""

    async def lease_held(rollout_id: str, lease_id: str) -> None:
        with _protocol_errors():
            recorder.check(rollout_id, lease_id)

    router = APIRouter(
        prefix=GATEWAY_PATH,
        dependencies=[Depends(_training_not_over(queue)), Depends(lease_held)],
    )
    for kind, path in API_PATHS.items():
        router.add_api_route(
            path, _recorded(api, queue, recorder, kind), methods=["POST"], name=f"gateway_{kind}"
        )

    @router.get("/models")
    async def models() -> dict[str, Any]:
        return api.models()

    @router.get("/models/{model_id:path}")
    async def model(model_id: str, request: Request) -> Any:
        # As on /v1: the policy's own entry here; another model's is the upstream's to answer, or a 404.
        return api.model(model_id) or await api.pass_through(request, f"models/{model_id}")

    @router.post(COUNT_TOKENS_PATH)
    async def count_tokens(request: Request) -> dict[str, Any]:
        body = await _read_object(request, MAX_EPISODE_BYTES)
        return api.count_tokens(body, role=request.headers.get(ROLE_HEADER))

    @router.api_route("/{path:path}", methods=PASSTHROUGH_METHODS, include_in_schema=False)
    async def other(path: str, request: Request) -> Any:
        # Not a policy call (an agent's embeddings, say): answered as on /v1, so passed through to the
        # upstream or refused there, and not recorded.
        return await api.pass_through(request, path)

    return router


def _recorded(
    api: OpenAIAPI, queue: RolloutQueue, recorder: GatewayRecorder, kind: ApiKind
) -> Callable[..., Awaitable[Any]]:
    async def serve(rollout_id: str, lease_id: str, request: Request) -> Any:
        body = await _read_object(request, MAX_EPISODE_BYTES)
        base_url = _gateway_url(request, rollout_id, lease_id)
        observe = recorder.recording(rollout_id, lease_id, kind, body, base_url)
        with _protocol_errors():
            queue.begin_serving(rollout_id, lease_id)  # the lease holds while we answer (queue.py)
        try:
            answer = await api.serve(kind, body, observe, role=request.headers.get(ROLE_HEADER))
        except BaseException:
            queue.end_serving(rollout_id, lease_id)
            raise
        if isinstance(answer, Response):  # a stream: answered while its events are sent, not before
            return _SentThen(answer, lambda: queue.end_serving(rollout_id, lease_id))
        queue.end_serving(rollout_id, lease_id)
        return answer

    return serve


class _SentThen(Response):
    """`response` sent as it is, then `done()`, however sending ends: finished, failed, or the client gone
    before the first event (a wrapper of the body's iterator would never start then, and not run `done`)."""

    def __init__(self, response: Response, done: Callable[[], None]) -> None:
        self.__dict__.update(response.__dict__)  # status, headers, background: the answer's own
        self._response, self._done = response, done

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._response.background = self.background  # FastAPI may have set it on this wrapper
        try:
            await self._response(scope, receive, send)
        finally:
            self._done()


def _training_not_over(queue: RolloutQueue) -> Callable[[], Awaitable[None]]:
    async def training_not_over() -> None:
        _refuse_when_over(queue)

    return training_not_over


def _refuse_when_over(queue: RolloutQueue) -> None:
    reason = queue.closed_because
    if reason is not None:
        raise APIError(
            410,
            f"Training is over ({reason}): there are no more rollouts to run, and nothing more is recorded "
            "or stored. Stop this runner or agent.",
            code="training_over",
        )


def _server_root(request: Request) -> str:
    """The server as this client reached it (`http://host:port`)."""
    return str(request.base_url).rstrip("/")


def _gateway_url(request: Request, rollout_id: str, lease_id: str) -> str:
    return _server_root(request) + GATEWAY_PATH.format(rollout_id=rollout_id, lease_id=lease_id)


def _reissue(queue: RolloutQueue, rollout_id: str) -> Callable[[dict[str, Any], str], None]:
    """What a refused result body does to its rollout: when it came under the lease that holds the
    rollout, that lease ends and the rollout goes to the next runner (`RolloutQueue.refuse`)."""

    def refused(body: dict[str, Any], reason: str) -> None:
        lease_id = body.get("lease_id")
        if isinstance(lease_id, str):
            queue.refuse(rollout_id, lease_id, reason)

    return refused


async def _read(
    request: Request,
    model: type[_Body],
    limit: int,
    on_refusal: Callable[[dict[str, Any], str], None] | None = None,
) -> _Body:
    """The body validated as `model`: a 400 that names the field and says what to send otherwise.
    `on_refusal(body, message)` runs first for a JSON object that does not validate."""
    body = await _read_object(request, limit)
    try:
        return model.model_validate(body)
    except ValidationError as error:
        refusal = explain(error, model)
        if on_refusal is not None:
            on_refusal(body, refusal.message)
        raise APIError.bad_request(refusal.message, param=refusal.param, code=refusal.code) from None


async def _read_object(request: Request, limit: int) -> dict[str, Any]:
    """The body as a JSON object, read up to `limit` bytes (413 beyond)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"The request body is larger than {limit} bytes.", code="payload_too_large")
    raw = bytearray()
    async for chunk in request.stream():  # counted as it arrives, so a missing Content-Length cannot lie
        raw += chunk
        if len(raw) > limit:
            raise APIError(413, f"The request body is larger than {limit} bytes.", code="payload_too_large")
    too_deep = APIError.bad_request(
        f"The request body nests objects and arrays more than {MAX_JSON_DEPTH} levels deep.",
        code="invalid_json",
    )
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise APIError.bad_request(
            f"The request body is not valid JSON: {error}", code="invalid_json"
        ) from None
    except RecursionError:  # the decoder's own limit, far past MAX_JSON_DEPTH
        raise too_deep from None
    if _deeper_than(body, MAX_JSON_DEPTH):
        raise too_deep
    if not isinstance(body, dict):
        raise APIError.bad_request("The request body must be a JSON object.", code="invalid_json")
    return body


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether JSON data nests more than `limit` levels (walked without recursion)."""
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return True
            pending.extend(
                (child, depth + 1) for child in (item.values() if isinstance(item, dict) else item)
            )
    return False


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
