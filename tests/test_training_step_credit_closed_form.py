"""The step rule against a decision process whose true advantages are known in closed form.

Three calls per episode, two choices each (completion token 0 or 1); every call's prompt is the history so
far, so samples that chose alike share their next state exactly. The outcome is 1 with probability
`0.1 + 0.5 * a1 + 0.25 * a2 + 0.1 * a3`: the first choice matters most. Under a policy choosing 1 with
probability 1/2, the true advantage of choice `a` in state `h` is `Q(h, a) - V(h)`.

With a 0/1 outcome a rule that compares returns gives a call the sign of its own episode's outcome, so
per-call sign agreement measures little there. What a rule changes is the direction each decision is
pushed on average: the mean advantage each (state, choice) pair receives over many groups, compared with
its true advantage by sign (14 pairs) and by correlation. `step_estimate="state_value"` values a call by
the state it led to instead, so its per-call sign can differ from its episode's: the share of calls
pushed the right way is printed for every arm. Seeded: the groups are the same on every run and every
machine.
"""

import itertools
import math
import random
import statistics

from lightning_sdk.tracing.episode import Episode, LLMCall
from lightning_sdk.training.algorithm.advantages import group_advantages
from lightning_sdk.training.algorithm.step_credit import step_credit

GROUPS = 1500
GROUP_SIZE = 8
DEPTH = 3
WEIGHTS = (1.0, 2.0)
STATE_VALUE = "state_value, weight 1"

History = tuple[int, ...]


def success_probability(choices: History) -> float:
    return 0.1 + 0.5 * choices[0] + 0.25 * choices[1] + 0.1 * choices[2]


def value(history: History) -> float:
    if len(history) == DEPTH:
        return success_probability(history)
    return (value((*history, 0)) + value((*history, 1))) / 2


TRUE = {
    (history, choice): value((*history, choice)) - value(history)
    for depth in range(DEPTH)
    for history in itertools.product((0, 1), repeat=depth)
    for choice in (0, 1)
}


def prompt_ids(history: History) -> list[int]:
    return [1, *(10 + choice for choice in history), 2]


def sample_group(rng: random.Random) -> tuple[list[Episode], list[History]]:
    episodes, choices = [], []
    for _ in range(GROUP_SIZE):
        made = tuple(int(rng.random() < 0.5) for _ in range(DEPTH))
        calls = [
            LLMCall(started_at=k, prompt_token_ids=prompt_ids(made[:k]), completion_token_ids=[made[k]])
            for k in range(DEPTH)
        ]
        outcome = float(rng.random() < success_probability(made))
        episodes.append(Episode(calls=calls, rewards={"outcome": outcome}))
        choices.append(made)
    return episodes, choices


def advantages_per_pair() -> dict[str, dict[tuple[History, int], list[float]]]:
    """Per arm, every advantage each (state, choice) pair received over the groups."""
    rng = random.Random(20251127)
    arms = ["equal", *(f"episode + {w:g} x step" for w in WEIGHTS), "step alone", STATE_VALUE]
    received: dict[str, dict[tuple[History, int], list[float]]] = {
        arm: {pair: [] for pair in TRUE} for arm in arms
    }
    for _ in range(GROUPS):
        episodes, choices = sample_group(rng)
        calls = [episode.calls for episode in episodes]
        equal, _ = group_advantages([[episode.reward] * DEPTH for episode in episodes])
        step = step_credit(episodes, calls, weight=0.0)
        by_state = step_credit(episodes, calls, estimate="state_value").advantages
        if equal is None or step.parts is None or by_state is None:
            continue  # every sample scored alike: no rule has anything to push
        for i, made in enumerate(choices):
            for k in range(DEPTH):
                pair = (made[:k], made[k])
                episode_part, step_part = step.parts.episode_part[i][k], step.parts.step_part[i][k]
                received["equal"][pair].append(float(equal[i][k] or 0.0))
                for w in WEIGHTS:
                    received[f"episode + {w:g} x step"][pair].append(episode_part + w * step_part)
                received["step alone"][pair].append(step_part)
                received[STATE_VALUE][pair].append(float(by_state[i][k] or 0.0))
    return received


def agreement(means: dict[tuple[History, int], float]) -> tuple[int, float]:
    """How many pairs get the sign of their true advantage, and the correlation with it."""
    pairs = list(TRUE)
    signs = sum(math.copysign(1, means[pair]) == math.copysign(1, TRUE[pair]) for pair in pairs)
    return signs, statistics.correlation([means[pair] for pair in pairs], [TRUE[pair] for pair in pairs])


def test_the_step_rule_pushes_each_decision_in_its_true_direction_better_than_equal() -> None:
    received = advantages_per_pair()
    measured = {
        arm: agreement({pair: statistics.fmean(values) for pair, values in pairs.items()})
        for arm, pairs in received.items()
    }
    print(f"\n{GROUPS} groups of {GROUP_SIZE}; mean advantage per (state, choice) pair vs its true advantage")
    print(f"{'arm':<22} {'sign right':>10} {'correlation':>11} {'sd of advantage':>16} {'calls right':>11}")
    spreads, calls_right = {}, {}
    for arm, (signs, correlation) in measured.items():
        spreads[arm] = statistics.pstdev([value for values in received[arm].values() for value in values])
        calls_right[arm] = per_call_sign_agreement(received[arm])
        print(
            f"{arm:<22} {f'{signs}/{len(TRUE)}':>10} {correlation:>11.3f} {spreads[arm]:>16.2f} "
            f"{calls_right[arm]:>11.1%}"
        )
    equal_signs, equal_correlation = measured["equal"]
    for w in WEIGHTS:
        signs, correlation = measured[f"episode + {w:g} x step"]
        assert signs > equal_signs and correlation > equal_correlation, (w, measured)
    assert measured["step alone"][0] == len(TRUE) and measured["step alone"][1] > 0.95
    # Valuing a shared state's calls by where they led: each decision's direction nearly as well as the step
    # part alone, most calls pushed the right way, and advantages no larger than under "equal".
    signs, correlation = measured[STATE_VALUE]
    assert signs > measured["episode + 2 x step"][0] and correlation > 0.95, measured
    assert calls_right[STATE_VALUE] > calls_right["equal"] + 0.1, calls_right
    assert spreads[STATE_VALUE] < spreads["equal"], spreads


def per_call_sign_agreement(received: dict[tuple[History, int], list[float]]) -> float:
    """The share of nonzero call advantages whose sign is their (state, choice) pair's true sign."""
    pushed = [
        math.copysign(1, value) == math.copysign(1, TRUE[pair])
        for pair, values in received.items()
        for value in values
        if value != 0
    ]
    return sum(pushed) / len(pushed)
