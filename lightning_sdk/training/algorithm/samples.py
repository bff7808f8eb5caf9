"""Training samples: token sequences with a loss mask, sampling log-probabilities and advantages.

Pure Python over `LLMCall` token ids (the engine's own ids: model output is never re-tokenized).

- **Transition mode**: one sample per trained call: the call's prompt ids, then its completion ids,
  all of them trained.
- **Trajectory mode**: an episode's calls are chained when a call's prompt ids start with the full
  token ids (prompt + completion) of an earlier call of the same chain, as a multi-turn conversation
  does when the chat template reproduces the sampled tokens. A chain becomes one sequence: the first
  call's prompt, then for every call the new prompt tokens (tool results, user turns, template tokens:
  masked out) followed by its completion (trained). A call whose prompt extends no chain, for example
  because the template re-rendered the model's answer differently, starts a new chain: nothing is
  ever trained on tokens the engine did not sample. Untrained calls (credit `None`) still join a chain
  as context, with their completion masked out.

**Structured outputs**: a call made with a JSON `response_format` was sampled from the grammar-constrained
distribution, and its recorded logprobs are those of that distribution. A token the grammar forced (the
only one allowed, logprob 0) is not the policy's choice: under the constrained policy it has probability
1 whatever the weights, so it carries no gradient, and it is masked out of the loss. Tokens the grammar
only narrowed are trained, with the importance ratio against the constrained logprob.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from lightning_sdk.tracing.episode import LLMCall

__all__ = ["FORCED_LOGPROB", "Sample", "build_samples", "chain_calls", "is_constrained"]


@dataclass
class Sample:
    """One training sequence: `prompt_ids + completion_ids`, where only masked-in completion tokens train.

    The per-token lists (`loss_mask`, `sampling_logprobs`, `advantages`) are aligned with
    `completion_ids`.
    """

    prompt_ids: list[int]
    """Context tokens before the first trained token (never trained)."""
    completion_ids: list[int]
    """Tokens after the prompt: sampled tokens and, in trajectory mode, tokens added between calls."""
    loss_mask: list[int]
    """1 for tokens the engine sampled for a trained call, 0 for everything else."""
    sampling_logprobs: list[float | None]
    """The engine's log-probability of each sampled token; `None` where unknown or masked out."""
    advantages: list[float]
    """The advantage of each token (its call's advantage; 0 where masked out)."""
    episode_id: str = ""
    """The episode the tokens come from."""
    call_ids: list[str] = field(default_factory=list)
    """The LLM calls merged into this sample (one in transition mode)."""
    agent_name: str | None = None
    """The agent that made the (first) call."""
    temperature: float = 1.0
    """The sampling temperature of the calls; the loss scales logits by it."""
    adapter: str | None = None
    """The role whose adapter sampled the calls and trains on them (`LLMCall.adapter`; None without roles)."""
    staleness: int = 0
    """Updates between the weights that sampled its oldest trained call and the weights the step updates
    (set with rollouts that run on through the update, `max_staleness >= 1`; 0 otherwise)."""

    def __post_init__(self) -> None:
        size = len(self.completion_ids)
        if not (len(self.loss_mask) == len(self.sampling_logprobs) == len(self.advantages) == size):
            raise ValueError(
                f"Sample {self.call_ids}: loss_mask ({len(self.loss_mask)}), sampling_logprobs "
                f"({len(self.sampling_logprobs)}) and advantages ({len(self.advantages)}) must each have "
                f"one entry per completion token ({size})."
            )
        if not self.prompt_ids:
            raise ValueError(f"Sample {self.call_ids} has no prompt token: the first token has no context.")

    @property
    def input_ids(self) -> list[int]:
        """The whole sequence fed to the model."""
        return self.prompt_ids + self.completion_ids

    @property
    def num_trained_tokens(self) -> int:
        """How many tokens the loss sees."""
        return sum(self.loss_mask)

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)


def _sampled_logprobs(call: LLMCall) -> list[float | None]:
    count = len(call.completion_token_ids or [])
    logprobs = call.logprobs
    if logprobs is None or len(logprobs) != count:
        # Without one logprob per token the importance correction cannot be computed for this call.
        return [None] * count
    return [value if value is not None and math.isfinite(value) else None for value in logprobs]


FORCED_LOGPROB = -1e-6
"""A constrained call's token whose sampling logprob is above this was forced by the grammar."""


def is_constrained(call: LLMCall) -> bool:
    """Whether a grammar constrained the call: a JSON `response_format`, or a `strict` tool."""
    response_format = call.sampling.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") in ("json_object", "json_schema"):
        return True
    return any(
        isinstance(tool, dict) and isinstance(tool.get("function"), dict) and tool["function"].get("strict")
        for tool in call.tools or []
    )


def _trained_mask(call: LLMCall) -> list[int]:
    """1 for each completion token the loss trains; 0 for tokens a grammar forced (module doc)."""
    count = len(call.completion_token_ids or [])
    logprobs = call.logprobs
    if not is_constrained(call) or logprobs is None or len(logprobs) != count:
        return [1] * count
    return [0 if value is not None and value > FORCED_LOGPROB else 1 for value in logprobs]


def _full_ids(call: LLMCall) -> list[int]:
    return list(call.prompt_token_ids or []) + list(call.completion_token_ids or [])


def chain_calls(calls: Sequence[LLMCall]) -> list[list[int]]:
    """Group call indices into chains whose token ids extend each other (see the module docstring).

    A call joins the chain whose current full ids (last call's prompt + completion) are the longest
    prefix of its prompt ids; so interleaved agents (A, B, A, B) form two chains. Calls answered by
    different role adapters never share a chain: each adapter trains on its own samples.
    """
    chains: list[list[int]] = []
    chain_ids: list[list[int]] = []
    for index, call in enumerate(calls):
        prompt = list(call.prompt_token_ids or [])
        best, best_length = None, -1
        for chain_index, ids in enumerate(chain_ids):
            if calls[chains[chain_index][0]].adapter != call.adapter:
                continue
            if len(ids) <= len(prompt) and prompt[: len(ids)] == ids and len(ids) > best_length:
                best, best_length = chain_index, len(ids)
        if best is None:
            chains.append([index])
            chain_ids.append(_full_ids(call))
        else:
            chains[best].append(index)
            chain_ids[best] = _full_ids(call)
    return chains


def _transition_sample(
    call: LLMCall, advantage: float, episode_id: str, agent_name: str | None, temperature: float
) -> Sample:
    completion = list(call.completion_token_ids or [])
    return Sample(
        prompt_ids=list(call.prompt_token_ids or []),
        completion_ids=completion,
        loss_mask=_trained_mask(call),
        sampling_logprobs=_sampled_logprobs(call),
        advantages=[advantage] * len(completion),
        episode_id=episode_id,
        call_ids=[call.id],
        agent_name=agent_name,
        temperature=temperature,
        adapter=call.adapter,
    )


def _trajectory_sample(
    calls: list[LLMCall],
    advantages: list[float | None],
    episode_id: str,
    agent_name: str | None,
    temperature: float,
) -> Sample:
    first = calls[0]
    sample = Sample(
        prompt_ids=list(first.prompt_token_ids or []),
        completion_ids=[],
        loss_mask=[],
        sampling_logprobs=[],
        advantages=[],
        episode_id=episode_id,
        call_ids=[call.id for call in calls],
        agent_name=agent_name,
        temperature=temperature,
        adapter=first.adapter,
    )
    seen = len(sample.prompt_ids)
    for call, advantage in zip(calls, advantages, strict=True):
        # Tokens the chain has not seen yet: tool output, new user turns, template glue. Not sampled.
        new_context = list(call.prompt_token_ids or [])[seen:]
        sample.completion_ids += new_context
        sample.loss_mask += [0] * len(new_context)
        sample.sampling_logprobs += [None] * len(new_context)
        sample.advantages += [0.0] * len(new_context)
        completion = list(call.completion_token_ids or [])
        trained = advantage is not None
        sample.completion_ids += completion
        sample.loss_mask += _trained_mask(call) if trained else [0] * len(completion)
        sample.sampling_logprobs += _sampled_logprobs(call) if trained else [None] * len(completion)
        sample.advantages += [advantage if advantage is not None else 0.0] * len(completion)
        seen = len(sample.prompt_ids) + len(sample.completion_ids)
    return sample


def build_samples(
    calls: Sequence[LLMCall],
    advantages: Sequence[float | None],
    episode_id: str,
    mode: str = "transition",
    agent_names: Sequence[str | None] | None = None,
    temperature: float = 1.0,
) -> list[Sample]:
    """The samples of one episode.

    Args:
        calls: the episode's selected calls in order (`select_trainable_calls`).
        advantages: one per call (`None`: the call is not trained).
        episode_id: recorded on every sample.
        mode: `"transition"` or `"trajectory"` (see the module docstring).
        agent_names: the agent of each call (for metrics); defaults to `call.agent_name`.
        temperature: the sampling temperature the engine used for these calls.

    Samples without any trained token are not returned.
    """
    if len(advantages) != len(calls):
        raise ValueError(f"{len(advantages)} advantages for {len(calls)} calls; pass one per call (or None).")
    if not temperature > 0:
        raise ValueError(
            f"temperature={temperature}: training needs the positive temperature the rollouts were sampled "
            "with (greedy calls cannot be trained with a policy gradient)."
        )
    names = list(agent_names) if agent_names is not None else [call.agent_name for call in calls]
    if mode == "transition":
        samples = [
            _transition_sample(call, advantage, episode_id, name, temperature)
            for call, advantage, name in zip(calls, advantages, names, strict=True)
            if advantage is not None
        ]
    elif mode == "trajectory":
        samples = [
            _trajectory_sample(
                [calls[i] for i in chain],
                [advantages[i] for i in chain],
                episode_id,
                names[chain[0]],
                temperature,
            )
            for chain in chain_calls(calls)
        ]
    else:
        raise ValueError(f"mode={mode!r} is unknown; use 'transition' or 'trajectory'.")
    return [sample for sample in samples if sample.num_trained_tokens > 0]
