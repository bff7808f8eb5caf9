"""The near-tie comparison the greedy tests use must still fail on a real difference."""

from types import SimpleNamespace

import pytest

from tests.fixtures.greedy import assert_greedy_agrees, first_token_penalties_must_change


def test_greedy_answers_may_part_only_at_a_near_tie():
    assert_greedy_agrees([1, 2, 3], [1, 2, 3], [1.0, 1.0, 1.0])
    assert_greedy_agrees([1, 2, 3], [1, 9, 8, 7], [1.0, 0.001, 1.0])  # parted at a near tie
    assert_greedy_agrees([1, 2, 3], [1, 2], [1.0, 1.0, 0.01])  # stopped at a near tie
    with pytest.raises(AssertionError, match="not a near tie"):
        assert_greedy_agrees([1, 2, 3], [1, 9, 3], [1.0, 0.5, 1.0])
    with pytest.raises(AssertionError, match="stops early"):
        assert_greedy_agrees([1, 2, 3], [1, 2], [1.0, 1.0, 1.0])


def _entry(token: str, logprob: float, **others: float) -> SimpleNamespace:
    candidates = [SimpleNamespace(token=token, logprob=logprob)]
    candidates += [SimpleNamespace(token=text, logprob=value) for text, value in others.items()]
    return SimpleNamespace(token=token, logprob=logprob, top_logprobs=candidates)


def test_penalties_must_change_only_a_repeat_that_leads_a_fresh_token_by_less_than_the_penalty():
    answer = [_entry("a", -0.1, b=-3.0), _entry(",", -0.2, a=-2.0), _entry("a", -0.1, b=-3.0)]
    assert first_token_penalties_must_change(answer, frequency_penalty=2.0, presence_penalty=2.0) == 2
    # A lead of 2.9 nats outlasts a penalty of 1.5, and no answer without a repeat proves anything.
    assert first_token_penalties_must_change(answer, frequency_penalty=1.0, presence_penalty=0.5) is None
    assert first_token_penalties_must_change(answer[:2], frequency_penalty=2.0, presence_penalty=2.0) is None
    # The only alternative was generated too, so it is penalised as well: nothing is forced.
    answer = [_entry("a", -0.1, b=-3.0), _entry("b", -0.2), _entry("a", -0.1, b=-3.0)]
    assert first_token_penalties_must_change(answer, frequency_penalty=2.0, presence_penalty=2.0) is None
