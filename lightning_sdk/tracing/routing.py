"""Routing: during a rollout, the model calls the policy replaces reach the trainer's endpoint, whatever base
URL the agent's client was built with and whenever it was built.

Most agents build their client once, at import time (`client = OpenAI()` at the top of a module), so it
reads `OPENAI_BASE_URL` before the trainer sets it and would call the hosted model during training. The
openai capture sees every request such a client sends; while a `Router` is in force (the trainer and the
runner set one around each rollout, and only there), it sends the requests the router picks to the policy's
endpoint instead, with the run's key in place of the client's credentials, and records them with the
endpoint's URL so that they are trained. Every other request goes where it was going, untouched, except
that the run's key is never sent anywhere but the run's endpoint.

Which calls the policy replaces is one map (`TrainerConfig.routes`): keys select calls by model name, or by
agent name with an `agent:` prefix (regular expressions matched against the whole name; the first key that
matches decides), values name the target: `"policy"`, `"keep"` for the client's own destination, or a role
(below). Calls that no key selects keep their destination. With no map, every chat, completion and
responses call goes to the policy: the common agent, one model behind a client built at import, trains with
no setting.

Roles (`TrainerConfig.roles`): when roles have their own LoRA adapters, the same decision also names the
adapter that answers a call sent to the policy. A key whose value is a role sends its calls to that role's
adapter; a call sent to `"policy"` goes to the adapter of the role named like its agent, else to the
adapter of every other agent (`Roles.others`: the base model, or one shared adapter). The request carries
the choice to the endpoint in the `ROLE_HEADER` header, and the recorded call carries it in `adapter`.

Lanes: a router may also name the lane its rollouts sample in (`LANES`: a training rollout, or an
evaluation's), sent in the `LANE_HEADER` header with every call it sends to the policy. The trainer's
endpoint samples each lane as its owner set it, so an evaluation (greedy) can run while training groups
(at the training temperature) are still in flight (`TrainerConfig(max_staleness >= 1)`).
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
import re
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, get_args

from lightning_sdk.tracing.urls import same_endpoint

__all__ = [
    "LANES",
    "LANE_HEADER",
    "POLICY",
    "ROLE_HEADER",
    "SHARED_ROLE",
    "Lane",
    "Roles",
    "Route",
    "RouteRule",
    "RouteTarget",
    "Router",
    "compile_routes",
    "current_router",
    "roles_problem",
    "routing",
]

log = logging.getLogger("lightning_sdk.tracing")

RouteTarget = Literal["policy", "keep"]
"""Where a selected call goes: the policy's endpoint, or the destination its client was built with."""
POLICY: RouteTarget = "policy"
_AGENT_PREFIX = "agent:"
ROLE_HEADER = "x-lightning-role"
"""The request header that names the role whose adapter answers a call on the policy's endpoint (the
endpoint also takes the role as the request's `model`, for agents outside our recording side)."""
Lane = Literal["train", "eval"]
"""What a rollout's calls are sampled for: training (the policy's temperature) or an evaluation."""
LANES: tuple[Lane, ...] = get_args(Lane)
LANE_HEADER = "x-lightning-lane"
"""The request header that names the lane of a call on the policy's endpoint (`Lane`); a call without it,
or with a lane the endpoint does not know, is sampled as the endpoint's owner set the default."""
SHARED_ROLE = "shared"
"""The adapter every agent without a role of its own shares, with `TrainerConfig(other_agents="shared")`."""
_ROLE_NAME = re.compile(r"[A-Za-z0-9_-]+")


@dataclass(frozen=True)
class Roles:
    """The roles that have their own LoRA adapter, and what answers every other agent's calls."""

    names: tuple[str, ...]
    """Role names: an agent of the same name is answered by its adapter."""
    others: str | None = None
    """The adapter of every other agent's calls: None for the base model, or `SHARED_ROLE`."""

    def __post_init__(self) -> None:
        problem = roles_problem(self.names, self.others)
        if problem:
            raise ValueError(problem)

    @property
    def adapters(self) -> tuple[str, ...]:
        """Every adapter these roles train and serve: one per role, and the shared one when there is one."""
        return self.names + ((self.others,) if self.others is not None else ())

    def adapter_of(self, agent: str | None) -> str | None:
        """The adapter that answers a call of `agent` sent to the policy (None: the base model)."""
        return agent if agent in self.names else self.others


def roles_problem(names: Any, others: Any) -> str | None:
    """What is wrong with a roles setting, or None."""
    if isinstance(names, str) or not all(isinstance(name, str) for name in names):
        return f"roles={names!r} must be a list of role names, e.g. ['writer', 'checker']."
    if not names:
        return "roles=[] names no role; leave roles unset for one adapter for every agent."
    bad = [name for name in names if not _ROLE_NAME.fullmatch(name)]
    if bad:
        return (
            f"role name {bad[0]!r} must be letters, digits, '_' or '-' (it names an adapter folder); give "
            f"an agent with another name its role through routes, e.g. routes={{'agent:{bad[0]}': 'writer'}}."
        )
    reserved = [name for name in names if name in (POLICY, "keep", SHARED_ROLE, "default")]
    if reserved:
        return (
            f"role name {reserved[0]!r} is reserved (a routes target, the shared or the default adapter); "
            "rename it."
        )
    if len(set(names)) != len(names):
        return f"roles={list(names)!r} names a role twice."
    if others not in (None, SHARED_ROLE):
        return f"other agents' adapter must be None (the base model) or {SHARED_ROLE!r}, not {others!r}."
    return None


class Route(NamedTuple):
    """Where one call goes: `target` (`"policy"` or `"keep"`), and for the policy the adapter that answers
    it (None: the default adapter, or the base model when roles have adapters)."""

    target: RouteTarget
    adapter: str | None = None


@dataclass(frozen=True)
class RouteRule:
    """One key of the routing map, compiled."""

    key: str
    """The key as the user wrote it (for messages)."""
    by: Literal["model", "agent"]
    pattern: re.Pattern[str]
    target: str
    """`"policy"`, `"keep"` or a role name."""

    def selects(self, model: str | None, agent: str | None) -> bool:
        name = model if self.by == "model" else agent
        return name is not None and self.pattern.fullmatch(name) is not None


def compile_routes(routes: Mapping[str, str] | None, roles: Roles | None = None) -> tuple[RouteRule, ...]:
    """The map as rules, in order; a `ValueError` that names the bad key otherwise. None: everything goes
    to the policy. With `roles`, a value may also name one of their adapters."""
    if routes is None:
        return (RouteRule(".*", "model", re.compile(".*", re.DOTALL), POLICY),)
    if not isinstance(routes, Mapping):
        raise ValueError(
            f"routes={routes!r} must map model names (or 'agent:<name>') to 'policy' or 'keep', "
            'e.g. {"gpt-4o-mini": "policy"}.'
        )
    targets = get_args(RouteTarget) + (roles.adapters if roles is not None else ())
    rules = []
    for key, target in routes.items():
        if not isinstance(key, str) or not key.strip() or key.strip() == _AGENT_PREFIX:
            raise ValueError(f"routes: key {key!r} must be a model name or 'agent:<agent name>'.")
        if target not in targets:
            raise ValueError(f"routes[{key!r}] = {target!r}: the target must be one of {', '.join(targets)}.")
        by: Literal["model", "agent"] = "agent" if key.startswith(_AGENT_PREFIX) else "model"
        text = key.removeprefix(_AGENT_PREFIX) if by == "agent" else key
        try:
            pattern = re.compile(text.strip())
        except re.error as error:
            raise ValueError(
                f"routes: key {key!r} is not a valid regular expression ({error}); write the model name "
                "as it is, escaping characters such as '(' or '[' with a backslash."
            ) from None
        rules.append(RouteRule(key, by, pattern, target))
    return tuple(rules)


@dataclass
class Router:
    """Where a rollout's calls go: the policy's endpoint for the calls its rules pick, else where they were
    going. Decisions are cached per (model, agent), so a call pays one dict lookup after the first.

    Args:
        base_url: The policy's OpenAI endpoint (`http://127.0.0.1:<port>/v1`).
        api_key: The run's key, sent to that endpoint in place of the client's credentials.
        rules: `compile_routes(...)`.
        roles: The roles with their own adapters (None: one adapter answers every call).
        lane: The lane its calls to the policy are sampled in (None: the endpoint's default).
    """

    base_url: str
    api_key: str = field(repr=False)
    rules: tuple[RouteRule, ...] = field(default_factory=lambda: compile_routes(None))
    roles: Roles | None = None
    lane: Lane | None = None
    _decisions: dict[tuple[str | None, str | None], Route] = field(default_factory=dict, repr=False)
    _used: set[str] = field(default_factory=set, repr=False)
    _seen_models: set[str] = field(default_factory=set, repr=False)
    _endpoints: dict[str, bool] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.base_url = self.base_url.rstrip("/")

    def in_lane(self, lane: Lane | None) -> Router:
        """This router for rollouts of `lane`; it shares the decisions and the record of keys used."""
        return self if lane == self.lane else dataclasses.replace(self, lane=lane)

    def route(self, model: str | None, agent: str | None) -> Route:
        """Where a call of `model` made by `agent` goes, and which adapter answers it there."""
        decision = self._decisions.get((model, agent))
        if decision is None:
            decision = self._decide(model, agent)
        return decision

    def target(self, model: str | None, agent: str | None) -> RouteTarget:
        """Where a call of `model` made by `agent` goes (`route(...).target`)."""
        return self.route(model, agent).target

    def is_endpoint(self, base_url: str) -> bool:
        """True when `base_url` names the policy's endpoint (`same_endpoint`, cached per URL)."""
        known = self._endpoints.get(base_url)
        if known is None:
            known = self._endpoints[base_url] = same_endpoint(base_url, self.base_url)
        return known

    def unused_keys(self) -> list[str]:
        """The map's keys that selected no call so far (to warn about after a step)."""
        with self._lock:
            return [rule.key for rule in self.rules if rule.key not in self._used]

    def models_seen(self) -> list[str]:
        """Every model name a routed-or-kept call asked for so far."""
        with self._lock:
            return sorted(self._seen_models)

    def _decide(self, model: str | None, agent: str | None) -> Route:
        matching = [rule for rule in self.rules if rule.selects(model, agent)]
        chosen = matching[0].target if matching else "keep"
        conflicting = {rule.key for rule in matching if rule.target != chosen}
        if conflicting:
            log.warning(
                "routes: the call of model %r by agent %r is selected by %r (-> %s) and also by %s; the "
                "first key decides. Reorder or narrow the keys if that is not what you meant.",
                model,
                agent,
                matching[0].key,
                chosen,
                ", ".join(repr(key) for key in sorted(conflicting)),
            )
        with self._lock:
            if matching:
                self._used.add(matching[0].key)
            if model is not None:
                self._seen_models.add(model)
            decision = self._decisions[(model, agent)] = self._as_route(chosen, agent)
        return decision

    def _as_route(self, chosen: str, agent: str | None) -> Route:
        if chosen == "keep":
            return Route("keep")
        if chosen != POLICY:  # a role named by the map
            return Route(POLICY, chosen)
        return Route(POLICY, self.roles.adapter_of(agent) if self.roles is not None else None)


_router: contextvars.ContextVar[Router | None] = contextvars.ContextVar("lightning_sdk_router", default=None)


def current_router() -> Router | None:
    """The router in force in this context (set around each rollout), or None: nothing is redirected."""
    return _router.get()


@contextmanager
def routing(router: Router | None) -> Iterator[Router | None]:
    """Route the openai calls made inside the block (and in tasks and threads that carry its context)."""
    token = _router.set(router)
    try:
        yield router
    finally:
        _router.reset(token)
