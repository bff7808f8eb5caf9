"""The unified data interface: one `LLMCall` per model call, one `Episode` per task run.

These are plain dataclasses so that every other part of the SDK (the store, the trainer, the
integrations) works on ordinary data. They serialise to and from JSON losslessly.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any

__all__ = ["FEEDBACK_KEY", "Episode", "LLMCall", "new_id"]

FEEDBACK_KEY = "feedback"
"""The key of `Episode.metadata` that lists every feedback the episode received, oldest first
(`lightning_sdk.tracing.rewards.feedback`)."""


def new_id() -> str:
    """A random, URL-safe identifier for episodes and calls (32 hex digits, like `uuid4().hex`).

    From the OS's generator (`os.urandom`, which `secrets` draws on too; importing `secrets` would cost
    `import lightning_sdk` milliseconds of hmac and hashlib): an episode id is what feedback names
    (`ls.feedback(episode_id, ...)`, `POST /v1/episodes/<id>/feedback`), so one must not be predictable
    from ids seen before, as those of a seeded `random.Random` are (its state can be rebuilt from its
    outputs). A user's `random.seed(...)` does not touch it, and forked workers do not repeat each other's
    ids."""
    return os.urandom(16).hex()


@dataclass
class LLMCall:
    """One model call (one choice of it): what the model saw, what it produced, and how it was scored.

    A call is *trainable* when the server returned the exact token ids it attended to and sampled
    (`prompt_token_ids` and `completion_token_ids`); our own endpoint always does.
    """

    id: str = field(default_factory=new_id)
    """Unique id of this record."""
    request_id: str | None = None
    """The server's response id; shared by the choices of one request made with `n > 1`."""
    choice_index: int = 0
    """Which choice of the response this record holds (0 unless the request asked for `n > 1`)."""
    kind: str = "chat"
    """`"chat"` for chat completions, `"completion"` for the legacy text completions API."""
    source: str = "openai"
    """What recorded the call: `"openai"` or an integration name such as `"langchain"`."""
    agent_name: str | None = None
    """The agent or role that made the call (the `@trace_agent` name, or a framework's agent name)."""
    model: str | None = None
    """The model name the request asked for."""
    base_url: str | None = None
    """The endpoint the call went to; the trainer trains only calls to its own endpoint."""
    adapter: str | None = None
    """The role whose LoRA adapter answered the call on the trainer's endpoint, when roles have their own
    adapters (`TrainerConfig.roles`); None: the one adapter of a run without roles, or the base model."""
    messages: list[dict[str, Any]] | None = None
    """Request messages of a chat call, as sent."""
    prompt: str | None = None
    """Request prompt of a text completion call."""
    tools: list[dict[str, Any]] | None = None
    """Tool definitions offered to the model, as sent."""
    sampling: dict[str, Any] = field(default_factory=dict)
    """Sampling parameters of the request (temperature, top_p, max_tokens, stop, n, seed, ...)."""
    response_message: dict[str, Any] | None = None
    """The assistant message produced: `role`, `content` and, if any, `tool_calls`."""
    text: str | None = None
    """The completion text (the message content for chat calls)."""
    finish_reason: str | None = None
    """Why generation stopped: `stop`, `length`, `tool_calls`, ..."""
    usage: dict[str, Any] | None = None
    """Token usage as reported by the server."""
    prompt_token_ids: list[int] | None = None
    """Exact prompt token ids the engine attended to."""
    completion_token_ids: list[int] | None = None
    """Exact token ids the engine sampled."""
    logprobs: list[float] | None = None
    """Sampling log-probability of each completion token."""
    policy_version: int | str | None = None
    """The version of the weights that sampled the call, as the server reported it (`weight_version`; on
    the trainer's endpoint the step whose adapter answered, None for the base model). Rollouts that run on
    through an update (`TrainerConfig.max_staleness`) measure a sample's age with it."""
    started_at: float = field(default_factory=time.time)
    """Unix time the request was sent."""
    latency_s: float | None = None
    """Seconds from request to the last byte the user consumed."""
    reward: float | None = None
    """Step reward attached by `emit_reward` (summed when emitted several times)."""
    reward_components: dict[str, float] = field(default_factory=dict)
    """Named step rewards attached by `emit_reward(value, name=...)`."""
    error: str | None = None
    """Error message when the request failed."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Free-form extra data (framework run ids, tags, ...)."""

    @property
    def trainable(self) -> bool:
        """True when the exact prompt and completion token ids are known."""
        return bool(self.prompt_token_ids) and self.completion_token_ids is not None

    def add_reward(self, value: float, name: str | None = None) -> None:
        """Attach a step reward to this call."""
        self.reward = (self.reward or 0.0) + value
        if name is not None:
            self.reward_components[name] = self.reward_components.get(name, 0.0) + value

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LLMCall:
        """Inverse of `to_dict`; unknown keys are rejected so that silent data loss cannot happen."""
        _reject_unknown_keys(cls, data)
        return cls(**data)


@dataclass
class Episode:
    """One run of an agent on one task: its LLM calls, output, error and rewards.

    `reward` is the episode return used for training: the sum of the final rewards recorded by
    `@reward` functions (one component per reward name), or `None` when nothing scored the episode.
    """

    id: str = field(default_factory=new_id)
    """Unique id of this episode."""
    name: str = "agent"
    """The agent's name (`@trace_agent(name=...)`, else the function's qualified name)."""
    parent_id: str | None = None
    """Id of the enclosing episode when a traced agent was called inside another."""
    run_id: str | None = None
    """Groups episodes of one training run or one deployment (set by `configure` or the trainer)."""
    task: Any = None
    """The task the agent was called with (its first argument, when JSON-serialisable)."""
    output: Any = None
    """The agent's return value (JSON-serialisable form)."""
    error: dict[str, str] | None = None
    """`type`, `message` and `traceback` of an exception the agent raised."""
    calls: list[LLMCall] = field(default_factory=list)
    """LLM calls made directly inside this episode, in the order they started."""
    children: list[Episode] = field(default_factory=list)
    """Episodes of traced agents called inside this one (sub-agents)."""
    rewards: dict[str, float] = field(default_factory=dict)
    """Final rewards by name, recorded by `@reward` functions."""
    reward_errors: list[dict[str, str]] = field(default_factory=list)
    """Reward functions that raised or returned a non-finite or non-numeric value."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Free-form extra data (group index, sample index, timeout flag, ...)."""
    started_at: float = field(default_factory=time.time)
    """Unix time the agent was called."""
    ended_at: float | None = None
    """Unix time the agent returned or raised."""

    @property
    def reward(self) -> float | None:
        """The episode return: the sum of the final rewards, or None when there is none."""
        if not self.rewards:
            return None
        return math.fsum(self.rewards.values())

    @property
    def finished(self) -> bool:
        """True once the agent has returned or raised."""
        return self.ended_at is not None

    def all_calls(self) -> list[LLMCall]:
        """This episode's calls and those of its sub-agents, in the order they started."""
        calls = list(self.calls)
        for child in self.children:
            calls.extend(child.all_calls())
        return sorted(calls, key=lambda call: call.started_at)

    def calls_with_owner(self) -> list[tuple[LLMCall, Episode]]:
        """`all_calls()`, each with the episode (this one or a sub-agent's) that made it."""
        pairs = [(call, self) for call in self.calls]
        for child in self.children:
            pairs.extend(child.calls_with_owner())
        return sorted(pairs, key=lambda pair: pair[0].started_at)

    def trainable_calls(self) -> list[LLMCall]:
        """The calls of `all_calls()` whose token ids are known."""
        return [call for call in self.all_calls() if call.trainable]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field, sub-episodes included."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Episode:
        """Inverse of `to_dict`."""
        _reject_unknown_keys(cls, data)
        data = dict(data)
        data["calls"] = [LLMCall.from_dict(call) for call in data.get("calls", [])]
        data["children"] = [Episode.from_dict(child) for child in data.get("children", [])]
        return cls(**data)

    def to_json(self) -> str:
        """Serialise to a JSON string; `Episode.from_json(ep.to_json()) == ep`."""
        return json.dumps(self.to_dict(), ensure_ascii=False, allow_nan=True)

    @classmethod
    def from_json(cls, text: str) -> Episode:
        """Inverse of `to_json`."""
        return cls.from_dict(json.loads(text))


def _reject_unknown_keys(cls: type, data: dict[str, Any]) -> None:
    known = {f.name for f in fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"{cls.__name__} has no field(s) {sorted(unknown)}; known fields: {sorted(known)}")
