"""From a step's episodes to training samples: error policy, call selection, credit, advantages, samples.

These are the stages of docs/training.md between rollout and update, as one function over plain data:

    prepared = prepare_samples(groups, config, endpoint_base_url=..., model=...)
    stats = train_on_samples(model, optimizer, scheduler, prepared.samples, config, pad_token_id)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lightning_sdk.tracing.episode import Episode
from lightning_sdk.training.algorithm.advantages import compute_advantages, group_advantages
from lightning_sdk.training.algorithm.credit import (
    assign_credit,
    count_untrained_calls,
    select_trainable_calls,
)
from lightning_sdk.training.algorithm.samples import Sample, build_samples

if TYPE_CHECKING:
    from lightning_sdk.training.config import TrainerConfig

__all__ = [
    "PreparedBatch",
    "apply_error_policy",
    "episode_failed",
    "group_has_signal",
    "prepare_samples",
    "reward_stats",
]


@dataclass
class PreparedBatch:
    """The samples of one step and what happened on the way (for metrics)."""

    samples: list[Sample]
    """Samples ready for `train_on_samples`."""
    metrics: dict[str, float] = field(default_factory=dict)
    """`reward_mean`, `reward_std`, `episodes`, `episodes_failed`, `episodes_unscored`, `groups`,
    `groups_skipped_no_spread`, `groups_skipped_too_few_episodes`, `calls_trained`,
    `calls_untrained_<reason>`, `samples`, `tokens_sampled` (completion tokens of every call of
    every episode, trained or not)."""


def episode_failed(episode: Episode) -> bool:
    """True when the agent raised or timed out (`episode.error` is set, or `metadata["timed_out"]`)."""
    return episode.error is not None or bool(episode.metadata.get("timed_out"))


def apply_error_policy(group: Sequence[Episode], on_error: str) -> tuple[list[Episode], dict[str, int]]:
    """The episodes of a group that can be trained, and counts of the others.

    A failed episode (see `episode_failed`) is dropped under `"drop"`; under `"zero"` it keeps its calls
    and its return becomes 0 (a `"failed"` reward replaces any partial rewards), so what led to the
    failure is discouraged. An episode that finished but has no reward (its reward function raised or
    never ran) is always dropped: there is nothing to learn from it, and the agent is not to blame.
    """
    kept: list[Episode] = []
    counts = {"episodes_failed": 0, "episodes_unscored": 0}
    for episode in group:
        if episode_failed(episode):
            counts["episodes_failed"] += 1
            if on_error == "zero":
                episode.rewards = {"failed": 0.0}
                kept.append(episode)
            continue
        if episode.reward is None or not math.isfinite(episode.reward):
            counts["episodes_unscored"] += 1
            continue
        kept.append(episode)
    return kept, counts


def group_has_signal(
    group: Sequence[Episode],
    config: TrainerConfig,
    endpoint_base_url: str | None = None,
    model: str | None = None,
) -> bool:
    """True when GRPO can learn from the group: after the error policy and credit assignment, at least
    two episodes have trainable calls and their credited rewards differ (`prepare_samples` would give it
    advantages). Under `on_error="zero"` failed episodes are scored 0 in place, as there."""
    kept, _ = apply_error_policy(group, config.on_error)
    rewards = [
        assign_credit(
            episode,
            select_trainable_calls(episode, config.train_agents, endpoint_base_url, model),
            config.credit,
            config.gamma,
        )
        for episode in kept
    ]
    advantages, _ = group_advantages(rewards, scale=config.scale_advantages, eps=config.advantage_eps)
    return advantages is not None


def prepare_samples(
    groups: Sequence[Sequence[Episode]],
    config: TrainerConfig,
    endpoint_base_url: str | None = None,
    model: str | None = None,
) -> PreparedBatch:
    """Turn a step's episodes (one group per task) into training samples.

    Args:
        groups: per task, its `group_size` finished episodes (failed ones included).
        config: the `TrainerConfig` (on_error, train_agents, credit, gamma, scale_advantages,
            advantage_eps, mode, temperature).
        endpoint_base_url: the trainer's endpoint; calls to any other server are not trained.
        model: the served model name; calls that asked for another model are not trained.

    Failed episodes of a `"zero"` group are modified in place (their return becomes 0).
    """
    metrics: dict[str, float] = {"episodes": 0, "episodes_failed": 0, "episodes_unscored": 0}
    kept_groups: list[list[Episode]] = []
    for group in groups:
        kept, counts = apply_error_policy(group, config.on_error)
        metrics["episodes"] += len(group)
        for key, value in counts.items():
            metrics[key] += value
        kept_groups.append(kept)

    metrics.update(reward_stats(kept_groups))
    for reason, count in count_untrained_calls(
        [episode for group in kept_groups for episode in group], config.train_agents, endpoint_base_url, model
    ).items():
        metrics[f"calls_untrained_{reason}"] = count

    selected = [
        [select_trainable_calls(episode, config.train_agents, endpoint_base_url, model) for episode in group]
        for group in kept_groups
    ]
    rewards = [
        [
            assign_credit(episode, calls, config.credit, config.gamma)
            for episode, calls in zip(group, group_calls, strict=True)
        ]
        for group, group_calls in zip(kept_groups, selected, strict=True)
    ]
    advantages = compute_advantages(rewards, scale=config.scale_advantages, eps=config.advantage_eps)
    metrics["groups"] = len(groups)
    for reason in ("no_spread", "too_few_episodes"):
        metrics[f"groups_skipped_{reason}"] = advantages.skipped_groups.get(reason, 0)

    samples: list[Sample] = []
    for group, group_calls, advantages_of_group in zip(
        kept_groups, selected, advantages.advantages, strict=True
    ):
        if advantages_of_group is None:
            continue
        for episode, calls, call_advantages in zip(group, group_calls, advantages_of_group, strict=True):
            samples += build_samples(
                calls, call_advantages, episode.id, config.mode, None, config.temperature
            )
    metrics["calls_trained"] = sum(
        1
        for group in advantages.advantages
        if group
        for episode in group
        for value in episode
        if value is not None
    )
    samples, metrics["samples_dropped_too_long"] = _within_cap(samples, config.max_sample_tokens)
    metrics["samples"] = len(samples)
    metrics["tokens_sampled"] = sum(
        len(call.completion_token_ids or [])
        for group in groups
        for episode in group
        for call in episode.all_calls()
    )
    return PreparedBatch(samples=samples, metrics=metrics)


def reward_stats(groups: Sequence[Sequence[Episode]]) -> dict[str, float]:
    """`reward_mean` and `reward_std` over the returns of the groups' scored episodes (NaN for none)."""
    returns = [episode.reward for group in groups for episode in group if episode.reward is not None]
    mean = math.fsum(returns) / len(returns) if returns else math.nan
    return {"reward_mean": mean, "reward_std": _std(returns)}


def _within_cap(samples: list[Sample], max_tokens: int | None) -> tuple[list[Sample], int]:
    """The samples of at most `max_tokens` tokens, and how many were longer."""
    if max_tokens is None:
        return samples, 0
    kept = [sample for sample in samples if len(sample) <= max_tokens]
    return kept, len(samples) - len(kept)


def _std(values: list[float]) -> float:
    if not values:
        return math.nan
    mean = math.fsum(values) / len(values)
    return math.sqrt(math.fsum((value - mean) ** 2 for value in values) / len(values))
