"""How often the training reward (a judge) orders held-out episodes as the true held-out reward does.

A run trained on a judge's scores (`group_reward=ls.Judge(...)`, or a `reward` that is itself a model's
opinion) learns what the judge prefers. When the true reward is known on held-out tasks (`val_reward`),
the two can be compared on the same episodes: each held-out episode is scored by the training reward
too, and over every pair of episodes whose scores differ under both, the agreement is the share of pairs
the two order the same way. 1.0: the judge ranks as the truth does; 0.5: chance, the judge's signal is
noise to the task; below 0.5: it rewards the opposite. (The bundled 135M model as a judge measured 0.45-0.53
against the true reward: a run on it cannot improve the true score.)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from itertools import combinations
from typing import Any

from lightning_sdk.rollouts.in_process import Rollout

__all__ = ["MIN_PAIRS", "NEAR_CHANCE", "judge_agreement", "near_chance", "pairwise_agreement"]

log = logging.getLogger("lightning_sdk.training")

MIN_PAIRS = 10
"""Fewest comparable pairs for an agreement worth reporting."""
NEAR_CHANCE = 0.6
"""An agreement below this is reported as near chance (with at least `MIN_PAIRS` pairs)."""


def pairwise_agreement(judged: Sequence[float], truth: Sequence[float]) -> tuple[float, int]:
    """The share of pairs ordered alike by `judged` and `truth`, over the pairs both score differently
    (ties under either say nothing about order); and how many pairs that was (`nan` when none)."""
    agree = pairs = 0
    for (judge_a, true_a), (judge_b, true_b) in combinations(zip(judged, truth, strict=True), 2):
        if judge_a == judge_b or true_a == true_b:
            continue
        pairs += 1
        agree += (judge_a > judge_b) == (true_a > true_b)
    return (agree / pairs if pairs else math.nan), pairs


def judge_agreement(rollouts: Sequence[Rollout], judge: Callable[[Any, Any], float]) -> dict[str, float]:
    """`judge_agreement` and `judge_pairs` of held-out rollouts (already scored by the true reward) under
    `judge` (no agreement without a comparable pair); episodes that failed, are unscored, or that the judge
    cannot score are left out."""
    judged, truth = [], []
    for rollout in rollouts:
        true_reward = rollout.episode.reward
        if rollout.failed or true_reward is None or not math.isfinite(true_reward):
            continue
        try:
            score = float(judge(rollout.episode.task, rollout.episode.output))
        except Exception as error:  # noqa: BLE001  # a judge that fails on one episode leaves it out
            log.debug("judge agreement: episode %s left out (%s)", rollout.episode.id, error)
            continue
        if math.isfinite(score):
            judged.append(score)
            truth.append(true_reward)
    agreement, pairs = pairwise_agreement(judged, truth)
    return {"judge_agreement": agreement, "judge_pairs": float(pairs)} if pairs else {"judge_pairs": 0.0}


def near_chance(metrics: dict[str, float]) -> str | None:
    """A warning when an agreement over enough pairs is near chance, else None."""
    agreement, pairs = metrics.get("judge_agreement", math.nan), int(metrics.get("judge_pairs", 0))
    if pairs < MIN_PAIRS or not agreement < NEAR_CHANCE:
        return None
    return (
        f"The training reward orders held-out episodes as val_reward does in only {agreement:.0%} of {pairs} "
        "pairs (50% is chance): the run learns what the judge prefers, not the task. Use a stronger judge "
        "model, a sharper rubric, or a reward computed from the answer."
    )
