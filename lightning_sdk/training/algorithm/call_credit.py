"""What training wrote on each call: one contract, read by the run explorer and written by the trainer.

`record_call_credit` (`prepare.py`) writes these keys into `LLMCall.metadata` and the episode's advantage
into `Episode.metadata`, so the run folder's episode store keeps them beside the call; the explorer reads
them back through `call_credit` and `episode_advantage`. A run that wrote nothing (an imported trace, an
older run) reads as an empty `CallCredit`, and the explorer shows "not recorded" rather than a number of
its own.
"""

from __future__ import annotations

from typing import Any, TypedDict

from lightning_sdk.tracing.episode import Episode, LLMCall
from lightning_sdk.training.config import StepEstimate

__all__ = ["CALL_CREDIT_KEYS", "EPISODE_ADVANTAGE_KEY", "CallCredit", "call_credit", "episode_advantage"]


class CallCredit(TypedDict, total=False):
    """The training signal of one call, as `record_call_credit` writes it into `call.metadata`."""

    credit_rule: str
    """The credit rule's name (`"equal"`, `"step"`, ... or a function's qualified name)."""
    credited_reward: float | None
    """The reward credit assignment gave the call (None: the rule gave it none)."""
    advantage: float
    """The call's advantage as it entered the loss (trained calls only)."""
    trained: bool
    """Whether the call's tokens were in the update's samples."""
    untrained_reason: str
    """Why not: a `select_trainable_calls` reason, `episode_dropped`, `credit_none`, the group's skip
    reason (`no_spread`, `too_few_episodes`), or `too_old` (sampled more than `max_staleness` updates
    before the step that took it)."""
    episode_advantage: float
    """Under `credit="step"`: the episode part of `advantage`."""
    step_advantage: float
    """Under `credit="step"`: the step part, before its weight."""
    step_group_size: int
    """Under `credit="step"`: how many calls shared the call's state."""
    step_estimate: StepEstimate
    """Under `credit="step"`: how the step part was estimated (`TrainerConfig.step_estimate`)."""


CALL_CREDIT_KEYS: tuple[str, ...] = tuple(CallCredit.__annotations__)
"""The keys of `LLMCall.metadata` that `record_call_credit` writes (and clears before writing again)."""

EPISODE_ADVANTAGE_KEY = "advantage"
"""The key of `Episode.metadata` holding the episode's advantage (under `"step"` its episode part)."""


def call_credit(call: LLMCall) -> CallCredit:
    """The training signal recorded on `call` (only the keys that were written)."""
    recorded: dict[str, Any] = {key: call.metadata[key] for key in CALL_CREDIT_KEYS if key in call.metadata}
    return recorded  # type: ignore[return-value]  # the keys are CallCredit's; the trainer wrote the values


def episode_advantage(episode: Episode) -> Any:
    """The episode's recorded advantage, or None (a run that did not record one)."""
    return episode.metadata.get(EPISODE_ADVANTAGE_KEY)
