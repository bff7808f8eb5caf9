"""Supervised warm start: the calls of chosen episodes as samples whose every reply token is trained.

Episodes are chosen by their return (`min_reward`: those at or above it; `None`: all of them, as for a
teacher's episodes), calls by agent (`train_agents`, as in GRPO). Each chosen call gives one sample: its
prompt, then its reply, every reply token in the loss with weight 1 (the assistant's tokens only: the
prompt, tool results and earlier turns are context). Token ids come from `call_token_ids`: the engine's own
when the call has them, else the call's text rendered by the endpoint's chat template (the rule of
`lightning_sdk.training.algorithm.retokenize`). Calls without usable ids are counted by reason, never
silently dropped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lightning_sdk.tracing.episode import Episode
from lightning_sdk.training.algorithm.retokenize import CallTokens, call_token_ids
from lightning_sdk.training.algorithm.samples import Sample

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["SFTData", "choose_episodes", "sft_samples"]


@dataclass
class SFTData:
    """The samples of a supervised warm start, and what was left out."""

    samples: list[Sample]
    episodes: int
    """Episodes chosen (at or above `min_reward`)."""
    episodes_left_out: int
    """Episodes below `min_reward`, or without a reward when one is asked for."""
    origins: Counter[str] = field(default_factory=Counter)
    """Samples by where their ids came from: `engine` or `text`."""
    calls_left_out: Counter[str] = field(default_factory=Counter)
    """Calls without a sample, by reason (`failed`, `no_reply`, `template_mismatch`, `too_long`, ...)."""


def choose_episodes(episodes: Iterable[Episode], min_reward: float | None) -> tuple[list[Episode], int]:
    """The episodes whose return is at least `min_reward` (all of them for `None`), and how many were not."""
    chosen, left_out = [], 0
    for episode in episodes:
        if min_reward is None or (episode.reward is not None and episode.reward >= min_reward):
            chosen.append(episode)
        else:
            left_out += 1
    return chosen, left_out


def sft_samples(
    episodes: Iterable[Episode],
    tokenizer: PreTrainedTokenizerBase,
    *,
    min_reward: float | None = None,
    train_agents: Sequence[str] | None = None,
    max_sample_tokens: int | None = None,
) -> SFTData:
    """One sample per usable call of the chosen episodes (see the module docstring)."""
    chosen, left_out = choose_episodes(episodes, min_reward)
    data = SFTData([], len(chosen), left_out)
    agents = frozenset(train_agents) if train_agents is not None else None
    for episode in chosen:
        for call, owner in episode.calls_with_owner():
            agent = call.agent_name or owner.name
            if agents is not None and agent not in agents:
                data.calls_left_out["other_agent"] += 1
                continue
            tokens = call_token_ids(call, tokenizer)
            if isinstance(tokens, str):
                data.calls_left_out[tokens.split(":")[0]] += 1
                continue
            if (
                max_sample_tokens is not None
                and len(tokens.prompt_ids) + len(tokens.completion_ids) > max_sample_tokens
            ):
                data.calls_left_out["too_long"] += 1
                continue
            data.samples.append(_sample(tokens, episode.id, call.id, agent))
            data.origins[tokens.origin] += 1
    return data


def _sample(tokens: CallTokens, episode_id: str, call_id: str, agent: str) -> Sample:
    size = len(tokens.completion_ids)
    return Sample(
        prompt_ids=tokens.prompt_ids,
        completion_ids=tokens.completion_ids,
        loss_mask=[1] * size,
        sampling_logprobs=[None] * size,
        advantages=[1.0] * size,
        episode_id=episode_id,
        call_ids=[call_id],
        agent_name=agent,
        temperature=1.0,  # the plain distribution: the loss is the reply's negative log-likelihood
    )
