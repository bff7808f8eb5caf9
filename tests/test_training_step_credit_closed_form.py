"""The step rule against a decision process whose true advantages are known in closed form.

Three calls per episode, two choices each (completion token 0 or 1); every call's prompt is the history so
far, so samples that chose alike share their next state exactly. The outcome is 1 with probability
`0.1 + 0.5 * a1 + 0.25 * a2 + 0.1 * a3`: the first choice matters most. Under a policy choosing 1 with
probability 1/2, the true advantage of choice `a` in state `h` is `Q(h, a) - V(h)`.

With a 0/1 outcome every rule gives a call the sign of its own episode's outcome, so per-call sign
agreement measures nothing. What a rule changes is the direction each decision is pushed on average: the
mean advantage each (state, choice) pair receives over many groups, compared with its true advantage by
sign (14 pairs) and by correlation. Seeded: the groups are the same on every run and every machine.
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
    arms = ["equal", *(f"episode + {w:g} x step" for w in WEIGHTS), "step alone"]
    received: dict[str, dict[tuple[History, int], list[float]]] = {
        arm: {pair: [] for pair in TRUE} for arm in arms
    }
    for _ in range(GROUPS):
        episodes, choices = sample_group(rng)
        calls = [episode.calls for episode in episodes]
        equal, _ = group_advantages([[episode.reward] * DEPTH for episode in episodes])
        step = step_credit(episodes, calls, weight=0.0)
        if equal is None or step.episode_part is None or step.step_part is None:
            continue  # every sample scored alike: no rule has anything to push
        for i, made in enumerate(choices):
            for k in range(DEPTH):
                pair = (made[:k], made[k])
                episode_part, step_part = step.episode_part[i][k], step.step_part[i][k]
                received["equal"][pair].append(float(equal[i][k] or 0.0))
                for w in WEIGHTS:
                    received[f"episode + {w:g} x step"][pair].append(episode_part + w * step_part)
                received["step alone"][pair].append(step_part)
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
    print(f"{'arm':<22} {'sign right':>10} {'correlation':>11} {'sd of a call advantage':>23}")
    for arm, (signs, correlation) in measured.items():
        spread = statistics.pstdev([value for values in received[arm].values() for value in values])
        print(f"{arm:<22} {f'{signs}/{len(TRUE)}':>10} {correlation:>11.3f} {spread:>23.2f}")
    equal_signs, equal_correlation = measured["equal"]
    for w in WEIGHTS:
        signs, correlation = measured[f"episode + {w:g} x step"]
        assert signs > equal_signs and correlation > equal_correlation, (w, measured)
    assert measured["step alone"][0] == len(TRUE) and measured["step alone"][1] > 0.95
