"""Step-level credit (`credit="step"`): each call is also compared with the calls of its task's group that
faced the same state, so the call that mattered is the one pushed.

The idea is GiGPO's (Feng et al. 2025, arXiv 2505.10978); this is our own statement of it over recorded
calls. One task's group holds episodes `i = 1..N` (those the error policy keeps, with trained calls).
Episode `i` has trained calls `c_i1 .. c_in` (in start order), a step reward `r_ik` on each (`emit_reward`
attached to that call; 0 when absent) and a return `R_i` (`Episode.reward`). With `gamma` and
`scale_advantages` from `TrainerConfig`:

- **return to go** `G_ik = r_ik + gamma * r_i(k+1) + ... + gamma^(n-k) * (r_in + R_i)`, the call's credited
  reward (as `"discounted"`);
- **episode total** `T_i = R_i + r_i1 + ... + r_in` (no discount): the episode judged as a whole;
- **episode advantage** `E_i = (T_i - b_i) / d`, the advantage of `advantages.py` with every call of
  episode `i` carrying `T_i`: `b_i` is the group mean of the totals, or with
  `episode_baseline="leave_one_out"` the mean of the *other* episodes' totals; `d` is the standard
  deviation of the totals plus `advantage_eps` (1 without `scale_advantages`);
- **step group** of a call: the trained calls of the group (any episode, the call itself included) with
  the same role, the same agent and the same state key. The default key is a digest of the call's exact
  prompt token ids; `TrainerConfig(state_key=fn)` replaces it (`fn(call) -> hashable`), but role and
  agent stay in the key, so step groups never mix them;
- **step advantage** `S_ik = (G_ik - mean of G over the other members of its step group) / d`
  (leave-one-out), and `S_ik = 0` for a call alone in its step group;
- **advantage** `A_ik = E_i + w * S_ik` with `w = step_advantage_weight`, then the usual clipped loss.

**`step_estimate="state_value"`.** The rule above compares what each call's own episode went on to
earn, so a right first call whose episode a later call spoiled is pushed down, by its episode part and its
step part alike. With `step_estimate="state_value"` a call in a shared state (a step group of 2 or more,
the root included) is instead valued by the state it led to: `V_g` is the mean return to go `G` of the
calls in step group `g` (what the samples that reached that state went on to earn), and the call's
estimate is `H_ik = r_ik + gamma * V_g(i,k+1)` (`H_in = G_in` for an episode's last call). Its advantage
is `A_ik = w * (H_ik - mean of H over the other members of its step group) / d`, with no episode part;
a call alone in its step group, or in one that only calls of its own episode reached (a retry of the
same error), keeps `A_ik = E_i`. The weight scales every shared-state call's whole advantage here, so it
must be above 0. Luck after a call then reaches it only through the mean of the samples that shared its
next state.

Step rewards are compared where they belong: a call's step reward enters `S` only against the calls that
faced the same state, and `E` only through its episode's total; it is never compared against the whole
group's calls (what `"equal"` does with `R_i + r_ik`).

**The first call.** When every sample of a task starts from the same prompt, the first trained calls of all
episodes form one step group, the *root group*: nothing but the episode group again. With `gamma = 1`,
`G_i1 = T_i`, so its step advantage is the leave-one-out episode advantage, `N / (N - 1) * (T_i - mean
T) / d`: it adds no new comparison, only weight, and the first call gets about `1 + w * N / (N - 1)` times
its episode advantage. It is counted all the same, because that is what keeps every call's push in
proportion: each call gets `w` times the advantage of its own state on top of the episode's, and leaving
the root out would push the first decision (often the one that decides the outcome) less than later ones
as `w` grows. It is not counted in `step_group_share`, which measures states shared *beyond* the root: a
share near 0 means the rule adds nothing beyond a heavier first call, and the run warns.

A group is skipped as under the other rules: `too_few_episodes` (fewer than two episodes with trained
calls) or `no_spread` (every episode total is the same; returns to go could then differ only by where a
step reward fell, and the group's standard deviation is 0, so there is no scale to compare them on).

Where a call comes from does not matter as long as its prompt token ids are known: rollouts in this
process, runner processes and the HTTP gateway record the engine's own ids. A call imported from traces
has text only: give it the ids `retokenize.call_token_ids` renders (as the endpoint would have) before
keying it, e.g. `dataclasses.replace(call, prompt_token_ids=tokens.prompt_ids)`.
"""

from __future__ import annotations

import hashlib
import math
from array import array
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import get_args

from lightning_sdk.tracing.episode import Episode, LLMCall
from lightning_sdk.training.algorithm.advantages import group_advantages, weighted_group_stats
from lightning_sdk.training.algorithm.credit import assign_credit, call_agent_name
from lightning_sdk.training.config import EpisodeBaseline, StepEstimate

__all__ = [
    "STEP_ESTIMATES",
    "StateKey",
    "StepCredit",
    "StepParts",
    "episode_total",
    "prompt_state",
    "state_values",
    "step_advantages",
    "step_credit",
    "step_groups",
]

STEP_ESTIMATES: tuple[str, ...] = get_args(StepEstimate)
"""How `credit="step"` values a call against its state's other samples: by the return its own episode went
on to earn (`"return"`, GiGPO's), or by the mean return of the samples that reached the state it led to
(`"state_value"`); the module docstring states both."""

StateKey = Callable[[LLMCall], Hashable]
"""`fn(call) -> hashable`: calls of a task's group with equal keys (and the same role and agent) faced the
same state."""


def prompt_state(call: LLMCall) -> str:
    """The default state key: a digest of the call's exact prompt token ids (equal ids, equal key)."""
    ids = call.prompt_token_ids
    if not ids:
        raise ValueError(
            f"call {call.id} has no prompt token ids, so its state cannot be keyed. A call imported from "
            "traces needs the ids retokenize.call_token_ids gives it first; or pass "
            "TrainerConfig(state_key=fn) keyed on what the call holds."
        )
    return hashlib.blake2b(array("q", ids).tobytes(), digest_size=12).hexdigest()


def episode_total(episode: Episode, calls: Sequence[LLMCall]) -> float:
    """`T_i`: the episode's return plus the step rewards of its trained calls."""
    steps = [float(call.reward) for call in calls if call.reward is not None]
    return math.fsum([*steps, _return(episode)])


def _return(episode: Episode) -> float:
    value = episode.reward
    if value is None or not math.isfinite(value):
        raise ValueError(f"Episode {episode.id} has no finite return; score it before credit assignment.")
    return value


def step_groups(
    episodes: Sequence[Episode],
    calls: Sequence[Sequence[LLMCall]],
    state_key: StateKey | None = None,
) -> list[list[int]]:
    """Per episode, per trained call, the index of its step group (numbered from 0 in order of first
    appearance). Calls share an index when their role (`adapter`), agent and state key are equal.

    Args:
        episodes: the group's kept episodes.
        calls: per episode, its trained calls (`select_trainable_calls`).
        state_key: `fn(call) -> hashable`; `None` keys by the exact prompt token ids (`prompt_state`).
    """
    key_of = state_key or prompt_state
    numbers: dict[tuple[str | None, str, Hashable], int] = {}
    indices: list[list[int]] = []
    for episode, episode_calls in zip(episodes, calls, strict=True):
        owners = {id(call): owner for call, owner in episode.calls_with_owner()}
        row = []
        for call in episode_calls:
            agent = call_agent_name(call, owners.get(id(call), episode))
            key = (call.adapter, agent, _checked_key(key_of, call))
            row.append(numbers.setdefault(key, len(numbers)))
        indices.append(row)
    return indices


def _checked_key(key_of: StateKey, call: LLMCall) -> Hashable:
    name = getattr(key_of, "__qualname__", repr(key_of))
    try:
        key = key_of(call)
    except Exception as error:
        if key_of is prompt_state:
            raise
        # The user's function met a call it did not expect (no tool result yet, say): name the call.
        raise ValueError(
            f"state_key {name} raised {type(error).__name__} on call {call.id} of agent "
            f"{call.agent_name!r}: {error}. It is called on every trained call, the first ones included."
        ) from error
    try:
        hash(key)
    except TypeError:
        raise TypeError(
            f"state_key {name} returned {type(key).__name__} for call {call.id}, which is not hashable; "
            "return a string, a number or a tuple of them (e.g. tuple(...) of a list)."
        ) from None
    return key


def step_advantages(
    returns: Sequence[Sequence[float]], groups: Sequence[Sequence[int]], scale: float = 1.0
) -> list[list[float]]:
    """`S_ik`: each call's return to go minus the mean of the other members of its step group, divided by
    `scale`; 0 for a call alone in its step group. `returns` and `groups` are per episode, per call."""
    members = _members(returns, groups)
    totals = {group: math.fsum(values) for group, values in members.items()}
    advantages = []
    for row_returns, row_groups in zip(returns, groups, strict=True):
        row = []
        for value, group in zip(row_returns, row_groups, strict=True):
            size = len(members[group])
            others = (totals[group] - value) / (size - 1) if size > 1 else value
            row.append((value - others) / scale)
        advantages.append(row)
    return advantages


def _members(values: Sequence[Sequence[float]], groups: Sequence[Sequence[int]]) -> dict[int, list[float]]:
    """Each step group's values (`values` and `groups` per episode, per call), in order."""
    members: dict[int, list[float]] = {}
    for row_values, row_groups in zip(values, groups, strict=True):
        for value, group in zip(row_values, row_groups, strict=True):
            members.setdefault(group, []).append(value)
    return members


def state_values(
    returns: Sequence[Sequence[float]],
    step_rewards: Sequence[Sequence[float]],
    groups: Sequence[Sequence[int]],
    gamma: float = 1.0,
) -> list[list[float]]:
    """`H_ik = r_ik + gamma * V_g(i,k+1)`: each call's step reward plus the discounted value of the state
    its episode's next call faced (`V_g`: the mean return to go `G` over the calls of step group `g`);
    an episode's last call keeps its return to go. All arguments are per episode, per call."""
    value_of = {group: math.fsum(values) / len(values) for group, values in _members(returns, groups).items()}
    estimates = []
    for row_returns, row_rewards, row_groups in zip(returns, step_rewards, groups, strict=True):
        last = len(row_returns) - 1
        estimates.append(
            [
                row_returns[k] if k == last else row_rewards[k] + gamma * value_of[row_groups[k + 1]]
                for k in range(len(row_returns))
            ]
        )
    return estimates


@dataclass(frozen=True)
class StepParts:
    """What the step rule made of a group with a signal; every per-call list is per kept episode, per
    trained call."""

    advantages: list[list[float]]
    """`A_ik = E_i + w * S_ik` (under `"state_value"`, see `episode_part` and `step_part`)."""
    episode_advantages: list[float]
    """`E_i`, the episode advantage of each kept episode."""
    episode_part: list[list[float]]
    """The episode part of each call's advantage as it enters the loss: `E_i` (under `"state_value"`, 0
    for a call whose state another sample shared)."""
    step_part: list[list[float]]
    """The step advantage before the weight: `S_ik` (under `"state_value"`, the leave-one-out advantage of
    `H_ik` for a call in a shared state, 0 for one alone)."""
    group_sizes: list[list[int]]
    """How many calls are in each call's step group (itself included)."""
    shared: list[list[bool]]
    """Whether the call's step group has 2 or more members and is not the root group."""
    estimate: StepEstimate
    """The `step_estimate` the advantages were made with."""


@dataclass(frozen=True)
class StepCredit:
    """One group's step credit: the credited rewards always, the parts of the advantages unless the group
    is skipped."""

    rewards: list[list[float | None]]
    """`G_ik`, the return to go (the credited reward), per kept episode, per trained call."""
    skipped: str | None
    """`too_few_episodes` or `no_spread` (see the module docstring), or None."""
    parts: StepParts | None = None
    """The advantages and their parts; None exactly when `skipped` is set."""

    @property
    def advantages(self) -> list[list[float | None]] | None:
        """`parts.advantages`, or None when the group is skipped."""
        return None if self.parts is None else [list(row) for row in self.parts.advantages]


def step_credit(
    episodes: Sequence[Episode],
    calls: Sequence[Sequence[LLMCall]],
    *,
    gamma: float = 1.0,
    weight: float = 1.0,
    state_key: StateKey | None = None,
    scale: bool = True,
    eps: float = 1e-4,
    baseline: EpisodeBaseline = "group_mean",
    estimate: StepEstimate = "return",
) -> StepCredit:
    """The step rule on one task's group (the module docstring states it).

    Args:
        episodes: the kept episodes; `calls`: per episode, its trained calls.
        gamma: discount per call of the return to go.
        weight: `w`, the weight of the step advantage.
        state_key: `fn(call) -> hashable`, or None for the exact prompt token ids.
        scale: divide by the totals' standard deviation plus `eps` (`scale_advantages`).
        eps: added to that standard deviation.
        baseline: the episode advantage's baseline.
        estimate: `"return"` (`A = E + w * S`) or `"state_value"` (`w` times the step advantage of the
            state each call led to where its state is shared, `E` where it is not).
    """
    if estimate not in STEP_ESTIMATES:
        raise ValueError(f"step_estimate={estimate!r}; use one of {STEP_ESTIMATES}.")
    rewards = [
        assign_credit(episode, row, "discounted", gamma) for episode, row in zip(episodes, calls, strict=True)
    ]
    totals = [[episode_total(episode, row)] * len(row) for episode, row in zip(episodes, calls, strict=True)]
    episode_advantage, skipped = group_advantages(totals, scale=scale, eps=eps, baseline=baseline)
    if episode_advantage is None:
        return StepCredit(rewards, skipped)
    indices = step_groups(episodes, calls, state_key)
    denominator = weighted_group_stats(totals)[1] + eps if scale else 1.0
    returns = [[float(value or 0.0) for value in row] for row in rewards]  # "discounted" never gives None
    sizes = {group: len(values) for group, values in _members(returns, indices).items()}
    episode_values = [[0.0 if value is None else value for value in row] for row in episode_advantage]
    if estimate == "state_value":
        episode_part, step_part = _state_value_parts(
            returns, calls, indices, episode_values, gamma, denominator
        )
    else:
        episode_part, step_part = episode_values, step_advantages(returns, indices, denominator)
    root = _root_group(indices)
    return StepCredit(
        rewards,
        None,
        StepParts(
            advantages=[
                [e + weight * s for e, s in zip(e_row, s_row, strict=True)]
                for e_row, s_row in zip(episode_part, step_part, strict=True)
            ],
            episode_advantages=[float(row[0]) if row else 0.0 for row in episode_values],
            episode_part=episode_part,
            step_part=step_part,
            group_sizes=[[sizes[group] for group in row] for row in indices],
            shared=[[sizes[group] > 1 and group != root for group in row] for row in indices],
            estimate=estimate,
        ),
    )


def _state_value_parts(
    returns: list[list[float]],
    calls: Sequence[Sequence[LLMCall]],
    indices: list[list[int]],
    episode_values: list[list[float]],
    gamma: float,
    denominator: float,
) -> tuple[list[list[float]], list[list[float]]]:
    """Under `step_estimate="state_value"`: the episode and step parts. Where a call's state is shared with
    another sample, its state's comparison replaces the episode's; alone (or met only by its own episode, a
    retry of the same error), it keeps the episode's."""
    step_rewards = [[float(call.reward or 0.0) for call in row] for row in calls]
    step_part = step_advantages(state_values(returns, step_rewards, indices, gamma), indices, denominator)
    episodes_in: dict[int, set[int]] = {}
    for episode_index, row in enumerate(indices):
        for group in row:
            episodes_in.setdefault(group, set()).add(episode_index)
    alone = [[len(episodes_in[group]) < 2 for group in row] for row in indices]
    return (
        [
            [e if a else 0.0 for e, a in zip(e_row, a_row, strict=True)]
            for e_row, a_row in zip(episode_values, alone, strict=True)
        ],
        [
            [0.0 if a else value for value, a in zip(s_row, a_row, strict=True)]
            for s_row, a_row in zip(step_part, alone, strict=True)
        ],
    )


def _root_group(indices: Sequence[Sequence[int]]) -> int | None:
    """The step group made of exactly the first call of every episode with calls, if there is one."""
    rows = [row for row in indices if row]
    if not rows:
        return None
    first = rows[0][0]
    if all(row[0] == first for row in rows) and sum(row.count(first) for row in rows) == len(rows):
        return first
    return None
