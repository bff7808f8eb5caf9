"""The runner protocol's wire: one pydantic model per body, imported by the routes and the runner alike.

The trainer's routes (`lightning_sdk.rollouts.routes`) validate what arrives with these models and build
what they answer from them; the runner (`lightning_sdk.rollouts.runner`) builds its requests and reads the
trainer's answers with the same ones, so a field is named, typed and bounded in one place. Changing what a
lease carries is a change to `Lease` here, and nothing else.

Request bodies are strict and refuse unknown fields: a misspelt field is an error that names it, not a
silently ignored setting. Answers ignore fields they do not know, so that a newer trainer can add one
without breaking older runners. Pure pydantic (plus `Episode`, to check uploads): no FastAPI, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic.fields import FieldInfo

from lightning_sdk.rollouts.episode_body import EpisodeBody, Finite, shallow_enough
from lightning_sdk.tracing.episode import Episode
from lightning_sdk.tracing.routing import Roles

__all__ = [
    "GATEWAY_PATH",
    "MAX_LEASE_WAIT_S",
    "EpisodeStored",
    "EpisodeUpload",
    "GrantedLease",
    "Lease",
    "LeaseRequest",
    "QueueStats",
    "Refusal",
    "RenewReply",
    "RenewRequest",
    "RewardReport",
    "RewardStored",
    "RoleAdapters",
    "WireBody",
    "WireReply",
    "explain",
]

MAX_LEASE_WAIT_S = 30.0
"""Longest long poll of a lease request (seconds)."""
GATEWAY_PATH = "/rollouts/{rollout_id}/{lease_id}/v1"
"""A lease's gateway base URL on the trainer's server (`GrantedLease.gateway_base_url`)."""


class WireBody(BaseModel):
    """A request body: strict types, unknown fields refused (see the module docstring)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    error_codes: ClassVar[Mapping[str, str]] = {}
    """The `code` of the 400 answer when a field does not validate, where it is not "invalid_value"."""


class WireReply(BaseModel):
    """An answer: fields it does not know are ignored (see the module docstring)."""

    model_config = ConfigDict(extra="ignore", frozen=True)


# --- leases -----------------------------------------------------------------------------------------------
class LeaseRequest(WireBody):
    """`POST /v1/rollouts/lease`: a runner asks for the next rollout."""

    runner: str = Field(
        "runner",
        min_length=1,
        max_length=200,
        description="runner: this runner's name in the trainer's records, 1 to 200 characters.",
    )
    wait_s: float = Field(
        0.0,
        ge=0.0,
        le=MAX_LEASE_WAIT_S,
        description=f"wait_s: seconds to wait for a rollout to open (a long poll), from 0 to "
        f"{MAX_LEASE_WAIT_S:g}.",
    )


class Lease(WireReply):
    """A rollout handed to a runner (what `RolloutQueue.lease` returns)."""

    rollout_id: str
    lease_id: str
    """Sent back with every renewal, upload and reward: the rollout is this lease's only while it holds."""
    task: Any
    """The task, as JSON-ready data."""
    policy_version: Any = None
    """The version of the weights the engine serves while the rollout is open (late episodes show it)."""
    attempt: int = Field(ge=1)
    """1 for the first issue, 2 after one expired lease, ..."""
    renew_within_s: float = Field(gt=0)
    """The runner must renew (heartbeat) or upload within this many seconds, or lose the lease."""
    paused_s: float = 0.0
    """Seconds the trainer had held model calls for its updates when it granted the lease (a clock the
    renewals carry on): what it advances while the episode runs is added to the episode's time limit."""


class RoleAdapters(WireReply):
    """The run's roles with adapters of their own (`TrainerConfig.roles`), as a lease carries them."""

    names: list[str]
    """Role names: an agent of the same name is answered by its adapter."""
    others: str | None = None
    """The adapter of every other agent's calls: None for the base model, or `"shared"`."""

    @classmethod
    def of(cls, roles: Roles | None) -> RoleAdapters | None:
        return cls(names=list(roles.names), others=roles.others) if roles is not None else None

    def roles(self) -> Roles:
        """As the router takes them (a `ValueError` for names this version does not accept)."""
        return Roles(tuple(self.names), self.others)


class GrantedLease(Lease):
    """A lease as the lease route sends it: the lease, and where to send the agent's LLM calls."""

    base_url: str
    """The trainer's OpenAI endpoint as this client reached the server (`.../v1`): for agents that record
    their own calls (`@trace_agent`)."""
    gateway_base_url: str
    """The lease's own OpenAI base URL (`.../rollouts/<rollout id>/<lease id>/v1`): the server records the
    calls sent there, for agents that cannot record themselves."""
    routes: dict[str, str] | None = None
    """The run's routing map (`TrainerConfig.routes`): which of the agent's model calls the runner sends to
    `base_url`, whatever client makes them (`None`: every chat, completion and responses call)."""
    roles: RoleAdapters | None = None
    """The run's roles with adapters of their own (`TrainerConfig.roles`): the runner tells the endpoint
    which role's adapter answers each call, as the trainer's own process does (`None`: one adapter)."""

    @classmethod
    def of(
        cls,
        lease: Lease,
        server_root: str,
        routes: Mapping[str, str] | None = None,
        roles: Roles | None = None,
    ) -> GrantedLease:
        """`lease` with the URLs of the server at `server_root` (`http://host:port`, as the client reached
        it), the run's routing map and its roles."""
        return cls(
            **lease.model_dump(),
            base_url=f"{server_root}/v1",
            gateway_base_url=server_root + GATEWAY_PATH.format(**lease.model_dump()),
            routes=dict(routes) if routes is not None else None,
            roles=RoleAdapters.of(roles),
        )


_LEASE_ID_HELP = "lease_id: the lease_id of the lease you hold (from POST /v1/rollouts/lease)."


class RenewRequest(WireBody):
    """`POST /v1/rollouts/<id>/renew`: keep the lease."""

    lease_id: str = Field(min_length=1, max_length=200, description=_LEASE_ID_HELP)


class RenewReply(WireReply):
    """The answer to a renewal."""

    renew_within_s: float
    """Renew again (or upload) within this many seconds."""
    paused_s: float = 0.0
    """The trainer's clock of seconds it has held model calls for its updates (`Lease.paused_s`)."""


# --- results ----------------------------------------------------------------------------------------------
class EpisodeUpload(WireBody):
    """`POST /v1/rollouts/<id>/episode`: the episode a runner recorded, every field checked as training
    reads it (`lightning_sdk.rollouts.episode_body`)."""

    error_codes: ClassVar[Mapping[str, str]] = {"episode": "invalid_episode"}

    lease_id: str = Field(min_length=1, max_length=200, description=_LEASE_ID_HELP)
    episode: Annotated[EpisodeBody, AfterValidator(shallow_enough)] = Field(
        description="episode: the JSON object of Episode.to_dict()."
    )

    def stored_episode(self) -> dict[str, Any]:
        """The episode as the trainer stores it: `Episode.to_dict()`, with the fields the runner left out
        at their defaults."""
        return Episode.from_dict(self.episode.model_dump(exclude_unset=True)).to_dict()


class EpisodeStored(WireReply):
    """The answer to an upload."""

    stored: bool
    """True when stored now; False when an earlier try of the same upload (same lease) had stored it."""


class RewardReport(WireBody):
    """`POST /v1/rollouts/<id>/reward`: an agent that used the gateway is done, and says how it did."""

    error_codes: ClassVar[Mapping[str, str]] = dict.fromkeys(
        ("reward", "step_rewards", "output", "error", "name"), "invalid_reward"
    )

    lease_id: str = Field(min_length=1, max_length=200, description=_LEASE_ID_HELP)
    reward: Finite = Field(description="reward: the episode's return, a finite number.")
    step_rewards: list[Finite | None] = Field(
        default_factory=list,
        description="step_rewards: a list of finite numbers or nulls, one per recorded call, in order.",
    )
    output: Any = None
    """The agent's answer, any JSON."""
    error: str | None = Field(None, description="error: why the agent failed (a string), or leave it out.")
    name: str = Field("gateway", min_length=1, description="name: the agent's name, a non-empty string.")


class RewardStored(WireReply):
    """The answer to a reward report."""

    stored: bool
    """As for an upload: False when this lease had already completed the rollout."""
    calls: int
    """How many recorded calls the episode holds."""


class QueueStats(WireReply):
    """`GET /v1/rollouts`: the open rollouts, by state."""

    pending: int
    leased: int
    done: int


# --- refusals ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Refusal:
    """Why a body was refused, for a 400 answer: the field, what is wrong and what to send instead."""

    param: str | None
    message: str
    code: str


def explain(error: ValidationError, model: type[WireBody]) -> Refusal:
    """The first problem of a body that did not validate as `model`: the field (its whole path, such as
    `episode.rewards.r`), what is wrong with it, and what to send instead (the field's description)."""
    first = error.errors()[0]
    location = list(first["loc"])
    param = _path(location)
    top = str(location[0]) if location else ""
    code = model.error_codes.get(top, "invalid_value")
    if first["type"] == "extra_forbidden":
        holder = _model_at(model, location[:-1]) or model
        return Refusal(
            param, f"Unknown field {param!r}: this body takes {', '.join(holder.model_fields)}.", code
        )
    problem = str(first["ctx"]["error"]) if first["type"] == "value_error" else first["msg"]
    if location[-1:] == ["[key]"]:  # pydantic's path to an object's key: the object, and which key
        problem = f"its key {location[-2]!r:.80}: {problem}"
        location = location[:-2]
        param = _path(location)
    field, reach = _field_at(model, location)
    described = field.description if field is not None else None
    if described and reach > 1:  # a nested field's description is its rule: say whose
        described = f"{_path(location[:reach])}: {described}."
    hint = f" Send {described}" if described else ""
    return Refusal(param or None, f"{param or 'The body'}: {problem.rstrip('.')}.{hint}", code)


def _path(location: list[Any]) -> str:
    """`["episode", "calls", 0, "reward"]` as `episode.calls[0].reward`."""
    return "".join(
        f"[{part}]" if isinstance(part, int) else (f".{part}" if index else str(part))
        for index, part in enumerate(location)
    )


def _field_at(model: type[BaseModel], location: list[Any]) -> tuple[FieldInfo | None, int]:
    """The innermost model field on `location`, and how many parts of it lead there (a dict key or list
    index below the field belongs to it)."""
    found, reach = None, 0
    current: type[BaseModel] | None = model
    for index, part in enumerate(location):
        if isinstance(part, int) or current is None:
            continue
        field = current.model_fields.get(str(part))
        if field is None:
            current = None
            continue
        found, reach, current = field, index + 1, _inner_model(field.annotation)
    return found, reach


def _model_at(model: type[BaseModel], location: list[Any]) -> type[BaseModel] | None:
    """The model whose fields the object at `location` holds (None: not a model)."""
    current: type[BaseModel] | None = model
    for part in location:
        if isinstance(part, int):
            continue
        field = current.model_fields.get(str(part)) if current is not None else None
        current = _inner_model(field.annotation) if field is not None else None
    return current


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    """The model an annotation holds (`EpisodeBody`, `list[CallBody]`, `CallBody | None`), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in get_args(annotation):
        inner = _inner_model(argument)
        if inner is not None:
            return inner
    return None
