"""The training reward's agreement with the true held-out reward, pair by pair."""

import math

import pytest

from lightning_sdk.rollouts.in_process import Rollout
from lightning_sdk.tracing.episode import Episode
from lightning_sdk.training.judge_agreement import judge_agreement, near_chance, pairwise_agreement


def test_pairwise_agreement_counts_pairs_both_order():
    # Pairs (a, b), (a, c), (b, c): truth orders a < b < c; the judge a < c < b: two of three agree.
    assert pairwise_agreement([1.0, 3.0, 2.0], [0.0, 0.5, 1.0]) == (pytest.approx(2 / 3), 3)
    # A tie under either leaves the pair out.
    assert pairwise_agreement([1.0, 1.0, 2.0], [0.0, 1.0, 1.0]) == (1.0, 1)
    agreement, pairs = pairwise_agreement([1.0], [1.0])
    assert math.isnan(agreement) and pairs == 0


def rollouts(true_rewards: list[float], failed_at: int | None = None) -> list[Rollout]:
    result = []
    for index, value in enumerate(true_rewards):
        episode = Episode(task={"n": index}, output=f"answer {index}")
        episode.rewards["val"] = value
        if index == failed_at:
            episode.error = {"type": "RuntimeError", "message": "boom"}
        result.append(Rollout(task_index=index, sample_index=0, episode=episode))
    return result


def test_held_out_episodes_are_scored_by_the_judge_and_a_failing_one_is_left_out():
    def judge(task, output):
        if task["n"] == 3:
            raise ValueError("the judge gave no score")
        return -task["n"]  # the opposite order of the truth

    metrics = judge_agreement(rollouts([0.0, 0.25, 0.5, 0.75, 1.0], failed_at=4), judge)
    assert metrics == {"judge_agreement": 0.0, "judge_pairs": 3.0}  # episodes 0, 1 and 2 remain
    assert judge_agreement(rollouts([1.0, 1.0]), judge) == {"judge_pairs": 0.0}


def test_near_chance_warns_only_with_enough_pairs():
    assert near_chance({"judge_agreement": 0.5, "judge_pairs": 45.0}).startswith(
        "The training reward orders held-out episodes as val_reward does in only 50% of 45 pairs"
    )
    assert near_chance({"judge_agreement": 0.5, "judge_pairs": 3.0}) is None
    assert near_chance({"judge_agreement": 0.9, "judge_pairs": 45.0}) is None
    assert near_chance({"judge_pairs": 0.0}) is None
