"""Credit assignment: from an episode's return and step rewards to one reward per trained LLM call.

An episode is a sequence of LLM calls `c_1 .. c_n` (the calls the trainer will train, in the order they
started), each with an optional step reward `r_k` (`emit_reward` attached to that call, 0 when absent),
and a return `R` recorded at the end (`Episode.reward`). The rules:

- `"equal"` (the Agent Lightning paper's choice): every call gets `R + r_k`. Each call shares the
  outcome; a step reward judges that call alone.
- `"last"`: only the final call is trained, with `R + r_n`. Earlier calls get `None`: they are not
  trained (in trajectory mode they stay in the sequence as context). Step rewards on earlier calls are
  ignored under this rule; use `"discounted"` to credit them.
- `"discounted"`: the reward to go, `G_k = r_k + gamma * r_{k+1} + ... + gamma^(n-k) * (r_n + R)`, as if
  the return arrived right after the final call. With `gamma = 1` and no step rewards it equals `"equal"`.
- `"step"`: each call's credited reward is its reward to go `G_k`, as under `"discounted"`; its advantage
  is not `G_k` against the whole group but its episode's advantage plus its advantage over the calls that
  faced the same state (`lightning_sdk.training.algorithm.step_credit` states the rule).
- a callable `fn(episode, calls) -> list[float | None]`, one finite value (or `None`: not trained) per call.

Which calls are trained is decided first, by `select_trainable_calls`: calls whose exact token ids
are known, that went to the trainer's endpoint, and that were made by an agent in `train_agents`.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, get_args

from lightning_sdk.tracing.episode import Episode, LLMCall
from lightning_sdk.tracing.urls import same_endpoint
from lightning_sdk.training.config import CreditRule

__all__ = [
    "AgentFilter",
    "assign_credit",
    "call_agent_name",
    "count_untrained_calls",
    "episode_return",
    "select_trainable_calls",
    "untrained_reasons",
]

AgentFilter = Sequence[str] | str | None
"""`None` (every agent), a regular expression matched against the whole agent name, or a list of names."""


def episode_return(episode: Episode) -> float:
    """The episode's return `R`; raises when nothing scored the episode."""
    value = episode.reward
    if value is None:
        raise ValueError(
            f"Episode {episode.id} ({episode.name!r}) has no reward, so it cannot be trained: score it "
            "with an @reward function or emit_reward(...), pass reward=fn(task, output) to Trainer.fit, "
            "or drop it before credit assignment."
        )
    if not math.isfinite(value):
        raise ValueError(f"Episode {episode.id} has a non-finite return {value}; rewards must be finite.")
    return value


def assign_credit(
    episode: Episode,
    calls: Sequence[LLMCall],
    rule: str | Callable[[Episode, list[LLMCall]], Sequence[float | None]] = "equal",
    gamma: float = 1.0,
) -> list[float | None]:
    """One reward per call in `calls` (the episode's trained calls, in order); `None`: left untrained.

    Args:
        episode: the finished episode; its return is `episode.reward`.
        calls: the calls to credit, usually `select_trainable_calls(episode, ...)`.
        rule: `"equal"`, `"last"`, `"discounted"`, `"step"` or a callable (see the module docstring).
        gamma: the discount per call of `"discounted"` and `"step"`.
    """
    calls = list(calls)
    if not calls:
        return []
    if callable(rule):
        return _validated(rule(episode, calls), calls, rule)
    total = episode_return(episode)
    steps = [_step_reward(call) for call in calls]
    if rule == "equal":
        return [total + step for step in steps]
    if rule == "last":
        return [None] * (len(calls) - 1) + [total + steps[-1]]
    if rule in ("discounted", "step"):
        return list[float | None](_reward_to_go(steps, total, gamma))
    raise ValueError(f"Unknown credit rule {rule!r}; use one of {get_args(CreditRule)} or a callable.")


def _step_reward(call: LLMCall) -> float:
    return float(call.reward) if call.reward is not None else 0.0


def _reward_to_go(steps: list[float], final_return: float, gamma: float) -> list[float]:
    rewards: list[float] = []
    to_go = final_return
    for step in reversed(steps):
        to_go = step + to_go
        rewards.append(to_go)
        to_go *= gamma
    return rewards[::-1]


def _validated(
    values: Sequence[float | None], calls: list[LLMCall], rule: Callable[..., Any]
) -> list[float | None]:
    name = getattr(rule, "__qualname__", repr(rule))
    try:
        values = list(values)
    except TypeError:
        raise TypeError(f"credit function {name} returned {type(values).__name__}; return a list") from None
    if len(values) != len(calls):
        raise ValueError(
            f"credit function {name} returned {len(values)} rewards for {len(calls)} calls; return "
            "exactly one per call (None for a call that should not be trained)."
        )
    checked: list[float | None] = []
    for index, value in enumerate(values):
        if value is None:
            checked.append(None)
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(
                f"credit function {name} returned {value!r} for call {index}; rewards must be finite "
                "numbers or None."
            )
        checked.append(float(value))
    return checked


def call_agent_name(call: LLMCall, owner: Episode) -> str:
    """The agent a call belongs to: its recorded `agent_name`, else the name of the episode that made it."""
    return call.agent_name or owner.name


def _agent_matcher(train_agents: AgentFilter) -> Callable[[str], bool]:
    if train_agents is None:
        return lambda name: True
    if isinstance(train_agents, str):
        pattern = re.compile(train_agents)
        return lambda name: pattern.fullmatch(name) is not None
    names = frozenset(train_agents)
    return lambda name: name in names


def _untrained_reason(
    call: LLMCall,
    owner: Episode,
    agent_matches: Callable[[str], bool],
    endpoint: str | None,
    model: str | None,
    adapters: Collection[str] | None,
) -> str | None:
    if call.error is not None:
        return "failed"
    if not call.trainable:
        return "no_token_ids"
    if endpoint is not None and not same_endpoint(call.base_url, endpoint):
        # Tokens from another server may come from another model (or tokenizer): never train on them.
        return "other_endpoint"
    if model is not None and call.model is not None and call.model != model:
        return "other_model"
    if not agent_matches(call_agent_name(call, owner)):
        return "other_agent"
    if adapters is not None and call.adapter not in adapters:
        return "base_model"  # answered by the base model (roles have adapters, this call's agent none)
    if not call.completion_token_ids:
        return "empty_completion"
    return None


def select_trainable_calls(
    episode: Episode,
    train_agents: AgentFilter = None,
    endpoint_base_url: str | None = None,
    model: str | None = None,
    adapters: Collection[str] | None = None,
) -> list[LLMCall]:
    """The calls of an episode (sub-agents included, in start order) that the trainer trains.

    A call is kept when it did not fail, its exact prompt and completion token ids are known and the
    completion is not empty, it went to `endpoint_base_url` (by `same_endpoint`; a call
    with no recorded `base_url` is not kept), it asked for
    `model` (when both are known), and its agent (its `agent_name`, else the name of the episode that
    made it) passes `train_agents`, and, when roles have adapters (`adapters`: their names), one of them
    answered it. `None` for a filter means no filtering on it.
    """
    matcher = _agent_matcher(train_agents)
    return [
        call
        for call, owner in episode.calls_with_owner()
        if _untrained_reason(call, owner, matcher, endpoint_base_url, model, adapters) is None
    ]


def untrained_reasons(
    episode: Episode,
    train_agents: AgentFilter = None,
    endpoint_base_url: str | None = None,
    model: str | None = None,
    adapters: Collection[str] | None = None,
) -> dict[str, str]:
    """Why each call of an episode that `select_trainable_calls` leaves out is left out, by call id (the
    reasons of `count_untrained_calls`)."""
    matcher = _agent_matcher(train_agents)
    reasons = {
        call.id: _untrained_reason(call, owner, matcher, endpoint_base_url, model, adapters)
        for call, owner in episode.calls_with_owner()
    }
    return {call_id: reason for call_id, reason in reasons.items() if reason is not None}


def count_untrained_calls(
    episodes: Iterable[Episode],
    train_agents: AgentFilter = None,
    endpoint_base_url: str | None = None,
    model: str | None = None,
    adapters: Collection[str] | None = None,
) -> dict[str, int]:
    """Why calls were left out by `select_trainable_calls`, counted by reason (for metrics and warnings).

    Reasons: `failed`, `no_token_ids`, `other_endpoint`, `other_model`, `other_agent`, `base_model`,
    `empty_completion`.
    """
    matcher = _agent_matcher(train_agents)
    reasons: Counter[str] = Counter()
    for episode in episodes:
        for call, owner in episode.calls_with_owner():
            reason = _untrained_reason(call, owner, matcher, endpoint_base_url, model, adapters)
            if reason is not None:
                reasons[reason] += 1
    return dict(reasons)
