"""Credit assignment and call selection, checked against hand-computed numbers."""

import pytest

from lightning_sdk.tracing.episode import Episode, LLMCall
from lightning_sdk.training.algorithm.credit import (
    assign_credit,
    count_untrained_calls,
    episode_return,
    select_trainable_calls,
)

ENDPOINT = "http://127.0.0.1:8011/v1"


def make_call(t, reward=None, agent="planner", base_url=ENDPOINT + "/", model="policy", **kwargs):
    values = {"prompt_token_ids": [1, 2], "completion_token_ids": [3], "logprobs": [-0.5]}
    values.update(kwargs)
    return LLMCall(started_at=t, reward=reward, agent_name=agent, base_url=base_url, model=model, **values)


def episode_with(calls, final=1.0):
    return Episode(calls=calls, rewards={"score": final} if final is not None else {})


def test_equal_gives_every_call_the_return_plus_its_own_step_reward():
    episode = episode_with([make_call(1, reward=0.5), make_call(2), make_call(3, reward=-0.25)], final=2.0)
    assert assign_credit(episode, episode.calls, "equal") == [2.5, 2.0, 1.75]


def test_last_trains_only_the_final_call():
    episode = episode_with([make_call(1, reward=0.5), make_call(2, reward=0.1)], final=1.0)
    assert assign_credit(episode, episode.calls, "last") == [None, 1.1]


def test_discounted_is_the_reward_to_go():
    # steps r = [0.5, 0, 0.2], R = 1, gamma = 0.5:
    # G3 = 0.2 + 1 = 1.2; G2 = 0 + 0.5 * 1.2 = 0.6; G1 = 0.5 + 0.5 * 0.6 = 0.8
    episode = episode_with([make_call(1, reward=0.5), make_call(2), make_call(3, reward=0.2)], final=1.0)
    assert assign_credit(episode, episode.calls, "discounted", gamma=0.5) == pytest.approx([0.8, 0.6, 1.2])


def test_discounted_with_gamma_one_and_no_step_rewards_equals_equal():
    episode = episode_with([make_call(1), make_call(2), make_call(3)], final=0.7)
    assert assign_credit(episode, episode.calls, "discounted", gamma=1.0) == [0.7, 0.7, 0.7]
    assert assign_credit(episode, episode.calls, "equal") == [0.7, 0.7, 0.7]


def test_callable_credit_is_validated():
    episode = episode_with([make_call(1), make_call(2)], final=1.0)
    assert assign_credit(episode, episode.calls, lambda ep, calls: [0, None]) == [0.0, None]
    with pytest.raises(ValueError, match="returned 1 rewards for 2 calls"):
        assign_credit(episode, episode.calls, lambda ep, calls: [1.0])
    with pytest.raises(ValueError, match="must be finite numbers or None"):
        assign_credit(episode, episode.calls, lambda ep, calls: [1.0, float("nan")])
    with pytest.raises(TypeError, match="return a list"):
        assign_credit(episode, episode.calls, lambda ep, calls: 1.0)


def test_an_unscored_episode_cannot_be_credited():
    episode = episode_with([make_call(1)], final=None)
    with pytest.raises(ValueError, match="has no reward"):
        assign_credit(episode, episode.calls, "equal")
    assert assign_credit(episode, [], "equal") == []
    assert episode_return(episode_with([], final=0.25)) == 0.25


def test_selection_keeps_only_our_endpoint_the_chosen_agents_and_known_tokens():
    kept = make_call(1)
    sub_agent_call = make_call(4, agent=None)  # named after its sub-episode
    calls = [
        kept,
        make_call(2, agent="critic"),
        make_call(3, base_url="https://api.openai.com/v1"),
        make_call(5, base_url=None),
        make_call(6, prompt_token_ids=None),
        make_call(7, completion_token_ids=[], logprobs=[]),
        make_call(8, error="timeout"),
        make_call(9, model="gpt-4o"),
    ]
    episode = Episode(name="root", calls=calls, children=[Episode(name="planner", calls=[sub_agent_call])])
    selected = select_trainable_calls(
        episode, train_agents=["planner"], endpoint_base_url=ENDPOINT, model="policy"
    )
    assert selected == [kept, sub_agent_call]
    reasons = count_untrained_calls([episode], ["planner"], ENDPOINT, "policy")
    assert reasons == {
        "other_agent": 1,
        "other_endpoint": 2,
        "no_token_ids": 1,
        "empty_completion": 1,
        "failed": 1,
        "other_model": 1,
    }


def test_train_agents_regex_matches_the_whole_name_and_localhost_equals_loopback():
    calls = [make_call(1, agent="writer"), make_call(2, agent="writer-2"), make_call(3, agent="rewriter")]
    episode = episode_with(calls)
    selected = select_trainable_calls(episode, "writer(-\\d+)?", "http://LOCALHOST:8011/v1")
    assert [call.agent_name for call in selected] == ["writer", "writer-2"]
    assert select_trainable_calls(episode) == calls  # no filters: every call with token ids
