"""The near-tie comparison the greedy tests use must still fail on a real difference."""

import pytest

from tests.fixtures.greedy import assert_greedy_agrees


def test_greedy_answers_may_part_only_at_a_near_tie():
    assert_greedy_agrees([1, 2, 3], [1, 2, 3], [1.0, 1.0, 1.0])
    assert_greedy_agrees([1, 2, 3], [1, 9, 8, 7], [1.0, 0.001, 1.0])  # parted at a near tie
    assert_greedy_agrees([1, 2, 3], [1, 2], [1.0, 1.0, 0.01])  # stopped at a near tie
    with pytest.raises(AssertionError, match="not a near tie"):
        assert_greedy_agrees([1, 2, 3], [1, 9, 3], [1.0, 0.5, 1.0])
    with pytest.raises(AssertionError, match="stops early"):
        assert_greedy_agrees([1, 2, 3], [1, 2], [1.0, 1.0, 1.0])
