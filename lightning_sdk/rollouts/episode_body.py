"""`EpisodeBody`: an uploaded episode checked field by field before anything of it is stored.

A runner uploads `Episode.to_dict()`; the trainer trains on it. Loading it as an `Episode` checks only the
keys, so `"rewards": {"r": "1"}` or `"metadata": []` used to be stored, and training then failed on them
(summing a string, `.get` on a list). These models say what every field must hold, with the rule
`ls.feedback` applies to a reward (`lightning_sdk.tracing.rewards.feedback`): a reward is a finite number,
not a boolean and not a string that reads as one. Metadata is an object, names and ids are bounded, token
ids are whole numbers, and sub-agents nest at most `MAX_EPISODE_DEPTH` deep. A body that breaks a rule is
refused with the path of the field (`episode.rewards.r`), and nothing of it is kept. Plain pydantic, no
torch: the runner imports it too.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

__all__ = ["MAX_EPISODE_DEPTH", "CallBody", "EpisodeBody", "Finite", "shallow_enough"]

MAX_EPISODE_DEPTH = 16
"""Deepest nesting of sub-agent episodes (`children`) an upload may have (an agent that calls an agent
that calls an agent is three)."""


def _finite_number(value: Any) -> Any:
    """The rule of `feedback_field_problem`, for every number of an upload that training adds up."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"must be a finite number, not {type(value).__name__} {value!r:.80}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an integer past float's range (JSON allows any number of digits)
        finite = False
    if not finite:
        raise ValueError(f"must be a finite number, not {value!r:.80}")
    return value


Finite = Annotated[float, BeforeValidator(_finite_number)]
"""A finite number: an integer is taken; a boolean, a string, NaN or an infinity is not."""
_Name = Annotated[str, Field(min_length=1, max_length=200)]
_Id = Annotated[str, Field(max_length=200)]
_TokenId = Annotated[int, Field(ge=0, lt=2**31)]
_Version = int | Annotated[str, Field(max_length=100)] | None
"""A weight version as our endpoint reports it: the step, or an adapter folder's name."""
_Rewards = Annotated[dict[_Name, Finite], Field(max_length=1000)]


def _metadata(value: dict[str, Any]) -> dict[str, Any]:
    """The keys of an uploaded episode's metadata that the trainer reads hold what it expects."""
    base_url = value.get("base_url")
    if base_url is not None and not isinstance(base_url, str):
        raise ValueError(
            f"metadata.base_url must be a string (the endpoint the agent reached), not {base_url!r:.80}"
        )
    feedback = value.get("feedback")
    if feedback is not None and not isinstance(feedback, list):
        raise ValueError(f"metadata.feedback must be a list of records, not {type(feedback).__name__}")
    return value


_Metadata = Annotated[dict[str, Any], AfterValidator(_metadata)]
_REWARDS = "an object of reward name (1 to 200 characters) to finite number"
_METADATA = "an object"
_TOKEN_IDS = "a list of whole numbers from 0 to 2**31 - 1 (the engine's token ids), or null"


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class CallBody(_Strict):
    """One `LLMCall` of an uploaded episode (`LLMCall.to_dict()`)."""

    id: _Id = ""
    request_id: _Id | None = None
    choice_index: int = Field(0, ge=0)
    kind: str = Field("chat", max_length=100)
    source: str = Field("openai", max_length=100)
    agent_name: str | None = Field(None, max_length=500)
    model: str | None = Field(None, max_length=500)
    base_url: str | None = Field(None, max_length=2000)
    adapter: str | None = Field(None, max_length=200)
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    tools: list[dict[str, Any]] | None = None
    sampling: dict[str, Any] = Field(default_factory=dict, description=_METADATA)
    response_message: dict[str, Any] | None = None
    text: str | None = None
    finish_reason: str | None = Field(None, max_length=100)
    usage: dict[str, Any] | None = None
    prompt_token_ids: list[_TokenId] | None = Field(None, description=_TOKEN_IDS)
    completion_token_ids: list[_TokenId] | None = Field(None, description=_TOKEN_IDS)
    logprobs: list[float | None] | None = Field(
        None,
        description="a list of numbers or nulls, one per completion token (training takes a value "
        "that is not finite as unknown), or null",
    )
    policy_version: _Version = Field(None, description="the version of the weights that answered, or null")
    started_at: Finite = 0.0
    latency_s: Finite | None = None
    reward: Finite | None = Field(None, description="a finite number, or null")
    reward_components: _Rewards = Field(default_factory=dict, description=_REWARDS)
    error: str | None = None
    metadata: _Metadata = Field(default_factory=dict, description=_METADATA)


class EpisodeBody(_Strict):
    """An uploaded episode (`Episode.to_dict()`): every field typed as training reads it."""

    id: _Id = ""
    name: str = Field("agent", max_length=500)
    parent_id: _Id | None = None
    run_id: _Id | None = None
    task: Any = None
    output: Any = None
    error: dict[str, str] | None = Field(
        None, description="null, or an object of strings (type, message, traceback)"
    )
    calls: list[CallBody] = Field(default_factory=list, description="a list of LLMCall.to_dict() objects")
    children: list[EpisodeBody] = Field(
        default_factory=list, description="a list of Episode.to_dict() objects (the sub-agents)"
    )
    rewards: _Rewards = Field(default_factory=dict, description=_REWARDS)
    reward_errors: list[dict[str, str]] = Field(default_factory=list)
    metadata: _Metadata = Field(default_factory=dict, description=_METADATA)
    started_at: Finite = 0.0
    ended_at: Finite | None = None

    def depth(self) -> int:
        """1 for an episode without sub-agents, 2 with sub-agents that have none, ..."""
        return 1 + max((child.depth() for child in self.children), default=0)


def shallow_enough(episode: EpisodeBody) -> EpisodeBody:
    """`episode`, or a `ValueError` when its sub-agents nest deeper than `MAX_EPISODE_DEPTH`."""
    if episode.depth() > MAX_EPISODE_DEPTH:
        raise ValueError(f"its sub-agent episodes (children) nest deeper than {MAX_EPISODE_DEPTH} levels")
    return episode
