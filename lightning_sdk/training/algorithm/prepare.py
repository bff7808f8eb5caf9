"""From a step's episodes to training samples: error policy, call selection, credit, advantages, samples.

These are the stages of docs/training.md between rollout and update. Each group (one task's episodes) is
prepared once, by `prepare_group`; dynamic sampling reads `PreparedGroup.has_signal`, and
`samples_from_groups` turns the chosen groups into samples and the step's metrics. For a whole batch in
one call:

    prepared = prepare_samples(groups, config, endpoint_base_url=..., model=...)
    stats = train_on_samples(model, optimizer, scheduler, prepared.samples, config, pad_token_id)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lightning_sdk.tracing.episode import Episode, LLMCall
from lightning_sdk.training.algorithm.advantages import group_advantages
from lightning_sdk.training.algorithm.call_credit import CALL_CREDIT_KEYS, EPISODE_ADVANTAGE_KEY
from lightning_sdk.training.algorithm.credit import (
    assign_credit,
    count_untrained_calls,
    select_trainable_calls,
    untrained_reasons,
)
from lightning_sdk.training.algorithm.samples import Sample, build_samples
from lightning_sdk.training.algorithm.step_credit import StepCredit, step_credit

if TYPE_CHECKING:
    from lightning_sdk.training.config import TrainerConfig

__all__ = [
    "PreparedBatch",
    "PreparedGroup",
    "apply_error_policy",
    "episode_failed",
    "group_has_signal",
    "mark_group_untrained",
    "prepare_group",
    "prepare_samples",
    "record_call_credit",
    "reward_stats",
    "role_metrics",
    "samples_from_groups",
    "step_credit_metrics",
]

SKIP_REASONS = ("no_spread", "too_few_episodes")
"""Why a group gives no samples (see `lightning_sdk.training.algorithm.advantages`)."""


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


@dataclass
class PreparedGroup:
    """One task's episodes after the error policy, call selection, credit and advantages.

    Each stage runs once per group (the error policy changes failed episodes in place, and a `credit`
    function may be costly); dynamic sampling, the samples and the step's metrics all read this object.
    The per-episode lists are aligned with `kept`.
    """

    episodes: list[Episode]
    """Every episode of the group, failed and unscored ones included."""
    kept: list[Episode]
    """The episodes the error policy keeps (`apply_error_policy`)."""
    counts: dict[str, int]
    """`episodes_failed` and `episodes_unscored`."""
    untrained_calls: dict[str, int]
    """Calls of the kept episodes left untrained, by reason (`count_untrained_calls`)."""
    calls: list[list[LLMCall]]
    """Per kept episode, the calls that are trained (`select_trainable_calls`)."""
    rewards: list[list[float | None]]
    """Per kept episode, the credited reward of each trained call (`assign_credit`)."""
    advantages: list[list[float | None]] | None
    """Per kept episode, the advantage of each trained call; None when the group is skipped."""
    skipped: str | None
    """Why the group gives no samples (one of `SKIP_REASONS`), or None."""
    step: StepCredit | None = None
    """Under `credit="step"`: the episode and step parts of each advantage and the step groups."""

    @property
    def has_signal(self) -> bool:
        """True when GRPO can learn from the group: at least two episodes have trained calls and their
        credited rewards differ, so the group has advantages."""
        return self.advantages is not None

    @property
    def calls_trained(self) -> int:
        """How many calls carry an advantage (0 for a skipped group)."""
        return sum(value is not None for episode in self.advantages or [] for value in episode)


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


def prepare_group(
    group: Sequence[Episode],
    config: TrainerConfig,
    endpoint_base_url: str | None = None,
    model: str | None = None,
) -> PreparedGroup:
    """Run the error policy, call selection, credit and advantages on one task's episodes.

    Args:
        group: the task's `group_size` finished episodes (failed ones included).
        config: the `TrainerConfig` (on_error, train_agents, credit, gamma, scale_advantages,
            advantage_eps).
        endpoint_base_url: the trainer's endpoint; calls to any other server are not trained.
        model: the served model name; calls that asked for another model are not trained.

    Under `on_error="zero"` failed episodes are modified in place (their return becomes 0).
    """
    kept, counts = apply_error_policy(group, config.on_error)
    roles = config.role_adapters()
    adapters = roles.adapters if roles is not None else None
    untrained = count_untrained_calls(kept, config.train_agents, endpoint_base_url, model, adapters)
    left_out = {
        call_id: reason
        for episode in kept
        for call_id, reason in untrained_reasons(
            episode, config.train_agents, endpoint_base_url, model, adapters
        ).items()
    }
    calls = [
        select_trainable_calls(episode, config.train_agents, endpoint_base_url, model, adapters)
        for episode in kept
    ]
    if config.credit == "step":
        step = step_credit(
            kept,
            calls,
            gamma=config.gamma,
            weight=config.step_advantage_weight,
            state_key=config.state_key,
            scale=config.scale_advantages,
            eps=config.advantage_eps,
            baseline=config.episode_baseline,
            estimate=config.step_estimate,
        )
        prepared = PreparedGroup(
            list(group), kept, counts, untrained, calls, step.rewards, step.advantages, step.skipped, step
        )
    else:
        rewards = [
            assign_credit(episode, episode_calls, config.credit, config.gamma)
            for episode, episode_calls in zip(kept, calls, strict=True)
        ]
        advantages, skipped = group_advantages(
            rewards,
            scale=config.scale_advantages,
            eps=config.advantage_eps,
            baseline=config.episode_baseline,
        )
        prepared = PreparedGroup(list(group), kept, counts, untrained, calls, rewards, advantages, skipped)
    record_call_credit(prepared, config.credit, left_out)
    return prepared


def record_call_credit(group: PreparedGroup, rule: object, left_out: Mapping[str, str] | None = None) -> None:
    """Write what credit assignment made of each call into its `metadata`, so the run folder's episode
    store keeps it beside the call (and the run explorer shows it).

    Every call of the group's episodes gets `credit_rule` and `trained` (True when it has an advantage; a
    group that dynamic sampling leaves over, or a sample over `max_sample_tokens`, is still marked);
    a trained call `credited_reward` and `advantage`; a call without one `untrained_reason`: why
    `select_trainable_calls` left it out (`left_out`, by call id), `episode_dropped` (the error policy
    dropped its episode), `credit_none` (the rule gave it no reward) or the group's skip reason
    (`no_spread`, `too_few_episodes`). Under `credit="step"` a call with an advantage also gets
    `episode_advantage` and `step_advantage` (the parts of its advantage as they enter the loss, the step
    part before the weight: `StepParts.episode_part` and `step_part`), `step_group_size` and
    `step_estimate`. Each episode gets `metadata["advantage"]`: under `"step"` its episode advantage E,
    else the mean of its calls'.
    """
    name = rule if isinstance(rule, str) else getattr(rule, "__qualname__", repr(rule))
    left_out = left_out or {}
    kept = {id(episode) for episode in group.kept}
    for episode in group.episodes:
        episode.metadata.pop(EPISODE_ADVANTAGE_KEY, None)  # prepared again (dynamic sampling): start clean
        for call in episode.all_calls():
            for key in CALL_CREDIT_KEYS:
                call.metadata.pop(key, None)
            call.metadata.update(credit_rule=name, trained=False)
            if id(episode) not in kept:
                call.metadata["untrained_reason"] = "episode_dropped"
            elif call.id in left_out:
                call.metadata["untrained_reason"] = left_out[call.id]
    parts = group.step.parts if group.step is not None else None
    for index, (episode, calls, rewards) in enumerate(
        zip(group.kept, group.calls, group.rewards, strict=True)
    ):
        advantages = group.advantages[index] if group.advantages is not None else [None] * len(calls)
        for position, (call, reward, advantage) in enumerate(zip(calls, rewards, advantages, strict=True)):
            call.metadata["credited_reward"] = reward
            if advantage is None:
                call.metadata["untrained_reason"] = group.skipped or "credit_none"
                continue
            call.metadata.update(trained=True, advantage=advantage)
            if parts is not None:
                call.metadata["episode_advantage"] = parts.episode_part[index][position]
                call.metadata["step_advantage"] = parts.step_part[index][position]
                call.metadata["step_group_size"] = parts.group_sizes[index][position]
                call.metadata["step_estimate"] = parts.estimate
        trained = [value for value in advantages if value is not None]
        if parts is not None and calls:
            episode.metadata[EPISODE_ADVANTAGE_KEY] = parts.episode_advantages[index]
        elif trained:
            episode.metadata[EPISODE_ADVANTAGE_KEY] = math.fsum(trained) / len(trained)


def mark_group_untrained(group: PreparedGroup, reason: str) -> None:
    """Undo what `record_call_credit` wrote as trained, for a prepared group the update leaves out after
    all (too old under `max_staleness`): every call says `trained=False` and why, and keeps the reward
    credit gave it but no advantage, which never entered a loss."""
    for episode in group.episodes:
        episode.metadata.pop(EPISODE_ADVANTAGE_KEY, None)
        for call in episode.all_calls():
            for key in (
                "advantage",
                "episode_advantage",
                "step_advantage",
                "step_group_size",
                "step_estimate",
            ):
                call.metadata.pop(key, None)
            call.metadata.update(trained=False, untrained_reason=reason)


def group_has_signal(
    group: Sequence[Episode],
    config: TrainerConfig,
    endpoint_base_url: str | None = None,
    model: str | None = None,
) -> bool:
    """True when GRPO can learn from the group (see `PreparedGroup.has_signal`). Under `on_error="zero"`
    failed episodes are scored 0 in place, as in `prepare_group`."""
    return prepare_group(group, config, endpoint_base_url, model).has_signal


def samples_from_groups(groups: Sequence[PreparedGroup], config: TrainerConfig) -> PreparedBatch:
    """The training samples of prepared groups (none from a skipped group) and the metrics of
    `PreparedBatch`, over these groups only. Reads `config.mode`, `temperature` and `max_sample_tokens`."""
    metrics: dict[str, float] = _episode_counts(groups)
    metrics.update(reward_stats([group.kept for group in groups]))
    metrics.update(_untrained_call_counts(groups))
    metrics["groups"] = len(groups)
    for reason in SKIP_REASONS:
        metrics[f"groups_skipped_{reason}"] = sum(group.skipped == reason for group in groups)
    metrics["calls_trained"] = sum(group.calls_trained for group in groups)
    roles = config.role_adapters()
    if roles is not None:
        metrics.update(role_metrics(groups, roles.adapters))
    if config.credit == "step":
        metrics.update(step_credit_metrics(groups, config.step_advantage_weight))
    samples = [sample for group in groups for sample in _group_samples(group, config)]
    samples, metrics["samples_dropped_too_long"] = _within_cap(samples, config.max_sample_tokens)
    metrics["samples"] = len(samples)
    metrics["tokens_sampled"] = sum(
        len(call.completion_token_ids or [])
        for group in groups
        for episode in group.episodes
        for call in episode.all_calls()
    )
    return PreparedBatch(samples=samples, metrics=metrics)


def prepare_samples(
    groups: Sequence[Sequence[Episode]],
    config: TrainerConfig,
    endpoint_base_url: str | None = None,
    model: str | None = None,
) -> PreparedBatch:
    """Turn a step's episodes (one group per task) into training samples: `prepare_group` on each group,
    then `samples_from_groups`.

    Args:
        groups: per task, its `group_size` finished episodes (failed ones included).
        config: the `TrainerConfig` (on_error, train_agents, credit, gamma, scale_advantages,
            advantage_eps, mode, temperature, max_sample_tokens).
        endpoint_base_url: the trainer's endpoint; calls to any other server are not trained.
        model: the served model name; calls that asked for another model are not trained.

    Failed episodes of a `"zero"` group are modified in place (their return becomes 0).
    """
    prepared = [prepare_group(group, config, endpoint_base_url, model) for group in groups]
    return samples_from_groups(prepared, config)


def role_metrics(groups: Sequence[PreparedGroup], adapters: Sequence[str]) -> dict[str, float]:
    """Per role adapter: `calls/<role>` (its calls selected for training, in groups with or without a
    signal) and `reward/<role>` (the mean credited reward of those calls; NaN when it made none)."""
    rewards: dict[str, list[float]] = {adapter: [] for adapter in adapters}
    for group in groups:
        for calls, credited in zip(group.calls, group.rewards, strict=True):
            for call, reward in zip(calls, credited, strict=True):
                if call.adapter in rewards and reward is not None:
                    rewards[call.adapter].append(reward)
    metrics: dict[str, float] = {}
    for adapter, values in rewards.items():
        metrics[f"calls/{adapter}"] = len(values)
        metrics[f"reward/{adapter}"] = math.fsum(values) / len(values) if values else math.nan
    return metrics


def step_credit_metrics(groups: Sequence[PreparedGroup], weight: float) -> dict[str, float]:
    """Under `credit="step"`, over the trained calls of the groups with a signal: `step_group_share` (the
    share whose step group has 2 or more members, the root group of first calls aside; near 0, the rule
    adds nothing to the episode comparison), `advantage_episode_abs_mean` (mean |E|) and
    `advantage_step_abs_mean` (mean |w * S|), each over the parts as they enter the loss (under
    `step_estimate="state_value"` a call in a shared state has no episode part). NaN without calls."""
    shared: list[bool] = []
    episode: list[float] = []
    step: list[float] = []
    for group in groups:
        part = group.step.parts if group.step is not None else None
        if part is None:
            continue
        shared += [flag for row in part.shared for flag in row]
        episode += [abs(value) for row in part.episode_part for value in row]
        step += [abs(weight * value) for row in part.step_part for value in row]
    return {
        "step_group_share": sum(shared) / len(shared) if shared else math.nan,
        "advantage_episode_abs_mean": math.fsum(episode) / len(episode) if episode else math.nan,
        "advantage_step_abs_mean": math.fsum(step) / len(step) if step else math.nan,
    }


def reward_stats(groups: Sequence[Sequence[Episode]]) -> dict[str, float]:
    """`reward_mean` and `reward_std` over the returns of the groups' scored episodes (NaN for none)."""
    returns = [episode.reward for group in groups for episode in group if episode.reward is not None]
    mean = math.fsum(returns) / len(returns) if returns else math.nan
    return {"reward_mean": mean, "reward_std": _std(returns)}


def _episode_counts(groups: Sequence[PreparedGroup]) -> dict[str, float]:
    """`episodes` (all of them), `episodes_failed` and `episodes_unscored` over the groups."""
    return {
        "episodes": sum(len(group.episodes) for group in groups),
        "episodes_failed": sum(group.counts["episodes_failed"] for group in groups),
        "episodes_unscored": sum(group.counts["episodes_unscored"] for group in groups),
    }


def _untrained_call_counts(groups: Sequence[PreparedGroup]) -> dict[str, float]:
    """`calls_untrained_<reason>` summed over the groups, for the reasons that occurred."""
    totals: dict[str, float] = {}
    for group in groups:
        for reason, count in group.untrained_calls.items():
            key = f"calls_untrained_{reason}"
            totals[key] = totals.get(key, 0) + count
    return totals


def _group_samples(group: PreparedGroup, config: TrainerConfig) -> list[Sample]:
    if group.advantages is None:
        return []
    samples: list[Sample] = []
    for episode, calls, advantages in zip(group.kept, group.calls, group.advantages, strict=True):
        samples += build_samples(calls, advantages, episode.id, config.mode, None, config.temperature)
    return samples


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
