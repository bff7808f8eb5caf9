"""prepare_samples: error policy, selection, credit, advantages and samples together, by hand."""

import copy
import statistics
from collections import Counter

import pytest

from lightning_sdk.tracing.episode import Episode, LLMCall
from lightning_sdk.training.algorithm.advantages import compute_advantages
from lightning_sdk.training.algorithm.credit import (
    assign_credit,
    count_untrained_calls,
    select_trainable_calls,
)
from lightning_sdk.training.algorithm.prepare import (
    apply_error_policy,
    group_has_signal,
    prepare_group,
    prepare_samples,
    reward_stats,
    samples_from_groups,
)
from lightning_sdk.training.algorithm.samples import build_samples
from lightning_sdk.training.config import TrainerConfig

ENDPOINT = "http://127.0.0.1:9000/v1"


def call(t, base_url=ENDPOINT, completion=(5, 6)):
    return LLMCall(
        started_at=t,
        base_url=base_url,
        prompt_token_ids=[1, 2],
        completion_token_ids=list(completion),
        logprobs=[-1.0] * len(completion),
    )


def episode(reward, calls, error=None):
    return Episode(calls=calls, rewards={} if reward is None else {"score": reward}, error=error)


def test_failed_episodes_are_dropped_or_zeroed_and_unscored_ones_dropped():
    failed = episode(0.7, [call(1)], error={"type": "RuntimeError", "message": "boom", "traceback": ""})
    timed_out = episode(None, [call(1)])
    timed_out.metadata["timed_out"] = True
    unscored = episode(None, [call(1)])
    good = episode(1.0, [call(1)])
    kept, counts = apply_error_policy([failed, timed_out, unscored, good], "drop")
    assert kept == [good] and counts == {"episodes_failed": 2, "episodes_unscored": 1}
    kept, _ = apply_error_policy([failed, timed_out, unscored, good], "zero")
    assert kept == [failed, timed_out, good]
    assert (failed.reward, timed_out.reward) == (0.0, 0.0)


def test_a_step_from_episodes_to_samples():
    config = TrainerConfig(group_size=2, on_error="zero", temperature=0.8)
    crashed = episode(None, [call(1)], error={"type": "ValueError", "message": "", "traceback": ""})
    groups = [
        # Task 1: returns 1 (two calls, one to another server) and 0 (crashed, zeroed): advantages +-1.
        [episode(1.0, [call(1), call(2, base_url="https://api.openai.com/v1")]), crashed],
        # Task 2: both succeed: no spread, skipped.
        [episode(1.0, [call(1)]), episode(1.0, [call(1)])],
        # Task 3: returns 3 and 1, one call each, but one call has no completion tokens: too few episodes.
        [episode(3.0, [call(1)]), episode(1.0, [call(1, completion=())])],
    ]
    prepared = prepare_samples(groups, config, endpoint_base_url=ENDPOINT + "/")
    advantage = 0.5 / (0.5 + config.advantage_eps)  # (1 - mean 0.5) / (std 0.5 + eps)
    assert [sample.advantages for sample in prepared.samples] == [[advantage] * 2, [-advantage] * 2]
    assert {sample.temperature for sample in prepared.samples} == {0.8}
    metrics = prepared.metrics
    assert metrics["episodes"] == 6 and metrics["episodes_failed"] == 1 and metrics["episodes_unscored"] == 0
    assert metrics["reward_mean"] == pytest.approx(7 / 6)
    assert metrics["groups_skipped_no_spread"] == 1 and metrics["groups_skipped_too_few_episodes"] == 1
    assert metrics["calls_untrained_other_endpoint"] == 1
    assert metrics["calls_untrained_empty_completion"] == 1
    assert metrics["calls_trained"] == 2 and metrics["samples"] == 2
    assert metrics["tokens_sampled"] == 12  # 6 calls with 2 completion tokens each, trained or not


def long_call(t, prompt_length, completion_length=2):
    return LLMCall(
        started_at=t,
        base_url=ENDPOINT,
        prompt_token_ids=list(range(prompt_length)),
        completion_token_ids=[7] * completion_length,
        logprobs=[-1.0] * completion_length,
    )


@pytest.mark.parametrize("mode", ["transition", "trajectory"])
def test_samples_longer_than_the_cap_are_left_out_and_counted(mode):
    config = TrainerConfig(group_size=2, mode=mode, max_sample_tokens=64)
    # A multi-turn episode whose second turn's prompt holds the first turn: in trajectory mode one chain.
    first = long_call(1, 40)
    second = long_call(2, 0)
    second.prompt_token_ids = first.prompt_token_ids + first.completion_token_ids + list(range(100, 130))
    groups = [[episode(1.0, [first, second]), episode(0.0, [long_call(3, 10)])]]
    prepared = prepare_samples(groups, config, endpoint_base_url=ENDPOINT)
    assert all(len(sample) <= 64 for sample in prepared.samples)
    if mode == "transition":  # the second turn (72 + 2 tokens) is left out, the first and the short one train
        assert [len(s) for s in prepared.samples] == [42, 12]
    else:  # the whole chain (74 tokens) is one sample and is left out
        assert [len(s) for s in prepared.samples] == [12]
    assert prepared.metrics["samples_dropped_too_long"] == 1
    assert prepared.metrics["samples"] == len(prepared.samples)

    uncapped = prepare_samples(
        groups, TrainerConfig(group_size=2, mode=mode, max_sample_tokens=None), ENDPOINT
    )
    assert uncapped.metrics["samples_dropped_too_long"] == 0 and max(len(s) for s in uncapped.samples) == 74


def test_a_group_carries_a_signal_only_when_its_trained_returns_differ():
    config = TrainerConfig(group_size=2)
    crashed = episode(None, [call(1)], error={"type": "ValueError", "message": "", "traceback": ""})
    assert group_has_signal([episode(1.0, [call(1)]), episode(0.0, [call(1)])], config, ENDPOINT)
    assert not group_has_signal([episode(1.0, [call(1)]), episode(1.0, [call(1)])], config, ENDPOINT)
    # Dropped on error, a crash leaves one episode: nothing to compare. Scored 0, it is the contrast.
    assert not group_has_signal([episode(1.0, [call(1)]), crashed], config, ENDPOINT)
    assert group_has_signal([episode(1.0, [call(1)]), crashed], TrainerConfig(on_error="zero"), ENDPOINT)
    # Returns differ, but the better episode's only call went to another server: it is not trained.
    other = episode(1.0, [call(1, base_url="https://api.openai.com/v1")])
    assert not group_has_signal([other, episode(0.0, [call(1)])], config, ENDPOINT)


def by_hand(groups, config, wanted):
    """The trainer's step composed from the documented stages over the whole batch, as it was computed
    before groups were prepared once: advantages over every group, the first `wanted` groups with a spread
    trained, the reward over every rollout."""
    kept, counts = zip(*(apply_error_policy(group, config.on_error) for group in groups), strict=True)
    calls = [[select_trainable_calls(e, config.train_agents, ENDPOINT) for e in group] for group in kept]
    rewards = [
        [assign_credit(e, c, config.credit, config.gamma) for e, c in zip(group, group_calls, strict=True)]
        for group, group_calls in zip(kept, calls, strict=True)
    ]
    advantages = compute_advantages(rewards, config.scale_advantages, config.advantage_eps).advantages
    chosen = [index for index, group in enumerate(advantages) if group is not None][:wanted]
    samples = [
        sample
        for i in chosen
        for e, c, a in zip(kept[i], calls[i], advantages[i], strict=True)
        for sample in build_samples(c, a, e.id, config.mode, None, config.temperature)
    ]
    untrained = count_untrained_calls([e for i in chosen for e in kept[i]], config.train_agents, ENDPOINT)
    returns = [e.reward for group in kept for e in group]
    metrics = {
        "episodes": sum(len(groups[i]) for i in chosen),
        "episodes_failed": sum(counts[i]["episodes_failed"] for i in chosen),
        "episodes_unscored": sum(counts[i]["episodes_unscored"] for i in chosen),
        "reward_mean": statistics.fmean(returns),
        "reward_std": statistics.pstdev(returns),
        **{f"calls_untrained_{reason}": count for reason, count in untrained.items()},
        "groups": len(chosen),
        "groups_skipped_no_spread": 0,
        "groups_skipped_too_few_episodes": 0,
        "calls_trained": sum(a is not None for i in chosen for e in advantages[i] for a in e),
        "samples_dropped_too_long": 0,
        "samples": len(samples),
        "tokens_sampled": sum(
            len(c.completion_token_ids) for i in chosen for e in groups[i] for c in e.all_calls()
        ),
    }
    return samples, metrics


def test_each_stage_runs_once_per_group_and_the_step_matches_the_stages_composed_by_hand():
    credited = Counter()

    def counted_equal_credit(episode, calls):  # "equal" credit that counts how often it runs
        credited[episode.id] += 1
        return [episode.reward] * len(calls)

    config = TrainerConfig(group_size=2, on_error="zero", credit=counted_equal_credit)
    crashed = episode(None, [call(1)], error={"type": "ValueError", "message": "", "traceback": ""})
    groups = [
        [episode(1.0, [call(1)]), episode(1.0, [call(1)])],  # no spread
        [episode(1.0, [call(1), call(2, base_url="https://api.openai.com/v1")]), crashed],  # 1 against 0
        [episode(None, [call(1)]), episode(2.0, [call(1)])],  # one unscored: too few episodes
        [episode(2.0, [call(1), call(2)]), episode(0.0, [call(1)]), episode(0.5, [call(1)])],
        [episode(3.0, [call(1)]), episode(0.0, [call(1)])],  # a spread, but two groups are enough
    ]
    expected_samples, expected_metrics = by_hand(copy.deepcopy(groups), config, wanted=2)
    credited.clear()

    # The trainer's step: prepare every group once, pick two with a signal, read samples and metrics.
    prepared = [prepare_group(group, config, ENDPOINT) for group in groups]
    assert [group.has_signal for group in prepared] == [False, True, False, True, True]
    trained = [group for group in prepared if group.has_signal][:2]
    batch = samples_from_groups(trained, config)
    metrics = {**batch.metrics, **reward_stats([group.kept for group in prepared])}

    scored = [e for group in groups for e in group if e.reward is not None]  # the crash is scored 0
    assert sorted(credited.values()) == [1] * len(scored) and set(credited) == {e.id for e in scored}
    assert batch.samples == expected_samples and len(batch.samples) == 6  # 2 + (2 + 1 + 1) calls
    assert metrics == pytest.approx(expected_metrics) and list(metrics) == list(expected_metrics)
    assert prepare_samples(copy.deepcopy([groups[1], groups[3]]), config, ENDPOINT).metrics == batch.metrics
