"""GRPO group advantages, checked against hand-computed numbers."""

import math

import pytest

from lightning_sdk.training.algorithm.advantages import (
    compute_advantages,
    group_advantages,
    weighted_group_stats,
)


def test_equal_credit_reduces_to_grpo_over_episode_returns():
    # Returns [1, 0, 0, 1]; the first episode made two calls. Episode-weighted mean 0.5, std 0.5.
    group = [[1.0, 1.0], [0.0], [0.0], [1.0]]
    mean, std = weighted_group_stats(group)
    assert (mean, std) == (0.5, 0.5)
    advantages, reason = group_advantages(group, scale=True, eps=0.0)
    assert reason is None
    assert advantages == [[1.0, 1.0], [-1.0], [-1.0], [1.0]]


def test_long_episodes_do_not_dominate_the_baseline():
    # Counting calls, the mean would be 4/6; weighting episodes it stays at 1/3 of the returns [1, 0, 0].
    group = [[1.0, 1.0, 1.0, 1.0], [0.0], [0.0]]
    mean, std = weighted_group_stats(group)
    assert mean == pytest.approx(1 / 3)
    assert std == pytest.approx(math.sqrt(2) / 3)


def test_without_std_scaling_advantages_are_only_centred():
    advantages, _ = group_advantages([[3.0], [1.0], [2.0]], scale=False)
    assert advantages == [[1.0], [-1.0], [0.0]]


def test_eps_is_added_to_the_std():
    advantages, _ = group_advantages([[1.0], [0.0]], scale=True, eps=0.5)
    assert advantages == [[0.5], [-0.5]]  # (1 - 0.5) / (0.5 + 0.5)


def test_untrained_calls_stay_none_and_do_not_count():
    # "last" credit: only the final call carries the return. Stats over [1] and [0] only.
    advantages, _ = group_advantages([[None, 1.0], [None, None, 0.0]], eps=0.0)
    assert advantages == [[None, 1.0], [None, None, -1.0]]


def test_discounted_rewards_mix_positions_with_episode_weights():
    # Episode A: [0.5, 1.0] (weights 1/2 each); episode B: [0.0] (weight 1). Total weight 2.
    # mean = (0.25 + 0.5 + 0) / 2 = 0.375
    # var  = (0.5 * 0.125^2 + 0.5 * 0.625^2 + 1 * 0.375^2) / 2
    #      = (0.0078125 + 0.1953125 + 0.140625) / 2 = 0.171875
    group = [[0.5, 1.0], [0.0]]
    mean, std = weighted_group_stats(group)
    assert mean == pytest.approx(0.375)
    assert std == pytest.approx(math.sqrt(0.171875))
    advantages, _ = group_advantages(group, scale=False)
    assert advantages == [[pytest.approx(0.125), pytest.approx(0.625)], [pytest.approx(-0.375)]]


def test_groups_without_spread_or_with_one_episode_are_skipped_and_counted():
    result = compute_advantages(
        [
            [[1.0], [1.0], [1.0, 1.0]],  # every reward equal
            [[1.0], [None], []],  # only one episode has a credited call
            [[1.0], [0.0]],  # trained
        ],
        eps=0.0,
    )
    assert result.advantages[0] is None
    assert result.advantages[1] is None
    assert result.advantages[2] == [[1.0], [-1.0]]
    assert result.skipped_groups == {"no_spread": 1, "too_few_episodes": 1}
    assert result.trained_groups == 1
    assert result.group_means == [None, None, 0.5]


def test_a_leave_one_out_baseline_compares_each_episode_with_the_others():
    # Episode means 0.5, 0 and 0.5 (each episode weighs 1, its calls share that weight); an untrained call
    # (None) is left out. Baselines: (0 + 0.5) / 2, (0.5 + 0.5) / 2 and (0.5 + 0) / 2.
    group = [[1.0, 0.0], [0.0, None], [0.5]]
    advantages, _ = group_advantages(group, scale=False, baseline="leave_one_out")
    assert advantages == [[0.75, -0.25], [-0.5, None], [0.25]]
    _, std = weighted_group_stats(group)
    scaled, _ = group_advantages(group, eps=0.0, baseline="leave_one_out")  # the whole group's std
    assert scaled == [
        [pytest.approx(0.75 / std), pytest.approx(-0.25 / std)],
        [pytest.approx(-0.5 / std), None],
        [pytest.approx(0.25 / std)],
    ]
    with pytest.raises(ValueError, match="baseline='median' is unknown"):
        group_advantages(group, baseline="median")
