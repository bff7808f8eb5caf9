"""The client side of routing (see `lightning_sdk.tracing.routing`), for openai's and anthropic's clients
alike: one request's options rewritten for the policy's endpoint, or left as they were.

A request the router sends to the policy keeps its body (model name included: the trainer's endpoint
answers any model name during training) and goes to the endpoint's URL for its kind, with the run's key as
its only credential: every header the client would add of its own (its key, organisation, project, an
Azure `api-key`, a gateway's token) is removed, so nothing the agent's client carries reaches our endpoint.
A request the router keeps goes where it was going; only when it would carry the run's key to another
server (a client built during the rollout from the environment the trainer set, pointed elsewhere) is that
key taken off, so the run's key never leaves the run.

When roles have their own adapters, a request sent to the policy also carries the role whose adapter
answers it, in the `ROLE_HEADER` header, and a router with a lane names it in `LANE_HEADER` (the body is
never changed).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from lightning_sdk.tracing.routing import LANE_HEADER, POLICY, ROLE_HEADER, Router

__all__ = ["KIND_PATHS", "route_options"]

KIND_PATHS = {
    "chat": "/chat/completions",
    "completion": "/completions",
    "responses": "/responses",
    "messages": "/messages",
}
"""The endpoint path of each kind of call the capture records (and the router may redirect)."""

_KEPT_HEADERS = frozenset({"accept", "content-type", "user-agent", "anthropic-version", "anthropic-beta"})
"""Headers a routed request keeps; `x-stainless-*` (the client's own bookkeeping) are kept too."""
_CREDENTIAL_HEADERS = ("api-key", "x-api-key", "openai-organization", "openai-project")
"""Added by some clients' auth rather than their default headers (Azure's `api-key`, for one)."""

_removed_headers: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
_routed_headers: weakref.WeakKeyDictionary[Any, tuple[str, Mapping[str, Any]]] = weakref.WeakKeyDictionary()
"""Per client, the headers of a routed request that adds none of its own (the common case), read-only and
shared by all such requests: building them anew costs more than the rest of the routing."""


def route_options(
    router: Router,
    client: Any,
    options: Any,
    kind: str,
    base_url: str,
    agent: str | None,
    omit: Callable[[], Any] | None = None,
) -> tuple[Any, str, str | None]:
    """`options` as the router sends them (changed in place), the base URL the call is recorded under, and
    the adapter that answers it (None: the default one, or the base model when roles have adapters).
    `omit` makes the client library's marker that removes a header (default: openai's `Omit`)."""
    omit = omit or _omit
    body = options.json_data if isinstance(options.json_data, dict) else {}
    model = body.get("model")
    ours = router.is_endpoint(base_url)
    target, adapter = router.route(model if isinstance(model, str) else None, agent)
    if target == POLICY:
        if ours and getattr(client, "api_key", None) == router.api_key:
            # A client already pointed at the endpoint (built inside the rollout).
            marks = _policy_headers(router, adapter)
            if marks:
                options.headers = {**(options.headers or {}), **marks}
            return options, base_url, adapter
        # Changed in place: the client builds these options afresh for every request (`post()` constructs
        # them) and `request()` copies them before its first attempt, so no one else sees the change, and a
        # copy of our own would double the cost of routing.
        options.url = router.base_url + KIND_PATHS[kind]
        headers = _routed(client, router, options.headers, omit)
        marks = _policy_headers(router, adapter)
        options.headers = {**headers, **marks} if marks else headers
        return options, router.base_url, adapter
    if ours:
        # Kept, but on the endpoint anyway (a client built in the rollout, a model the map keeps): recorded
        # under the endpoint's URL, so maybe trained, so sampled in the rollout's lane like the rest.
        if router.lane is not None:
            options.headers = {**(options.headers or {}), LANE_HEADER: router.lane}
    elif getattr(client, "api_key", None) == router.api_key:
        options.headers = {**(options.headers or {}), "Authorization": omit(), "x-api-key": omit()}
    return options, base_url, None


def _policy_headers(router: Router, adapter: str | None) -> dict[str, str]:
    """What a call sent to the policy tells the endpoint: the adapter that answers, the lane it samples in."""
    marks = {ROLE_HEADER: adapter} if adapter is not None else {}
    if router.lane is not None:
        marks[LANE_HEADER] = router.lane
    return marks


def _routed(
    client: object, router: Router, request_headers: object, omit: Callable[[], Any]
) -> Mapping[str, Any]:
    """The headers of a routed request: the run's key, and removals of every credential (see the module)."""
    bearer = f"Bearer {router.api_key}"
    if not request_headers:
        cached = _routed_headers.get(client)
        if cached is None or cached[0] != router.api_key:
            headers = {**_without_credentials(client, None, omit), "Authorization": bearer}
            cached = (router.api_key, MappingProxyType(headers))
            _routed_headers[client] = cached
        return cached[1]
    return {**_without_credentials(client, request_headers, omit), "Authorization": bearer}


def _without_credentials(client: Any, request_headers: Any, omit: Callable[[], Any]) -> dict[str, Any]:
    """The request's own headers that a routed request keeps (the client reads some of them back, such as
    `x-stainless-raw-response`), and every other header of the client or the request as a removal."""
    removed = _removed_headers.get(client)
    if removed is None:
        names = {name.lower() for name in getattr(client, "default_headers", {})}
        removed = {name: omit() for name in sorted(names | set(_CREDENTIAL_HEADERS)) if _removable(name)}
        _removed_headers[client] = removed
    headers = dict(removed)
    for name, value in (request_headers or {}).items():
        headers[name.lower()] = omit() if _removable(name.lower()) else value
    return headers


def _removable(name: str) -> bool:
    return name not in _KEPT_HEADERS and not name.startswith("x-stainless-")


def _omit() -> Any:
    """openai's marker that removes a header the client would otherwise send."""
    from openai import Omit

    return Omit()
