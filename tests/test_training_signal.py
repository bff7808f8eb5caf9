"""Groups without a learning signal, told apart by why, and the warning when almost none trains."""

from lightning_sdk.tracing.episode import Episode
from lightning_sdk.training.algorithm.prepare import PreparedGroup
from lightning_sdk.training.algorithm.signal import SignalWatch, signal_counts


def group(rewards, skipped):
    kept = []
    for value in rewards:
        episode = Episode()
        episode.rewards["score"] = value
        kept.append(episode)
    advantages = None if skipped else [[0.5] for _ in kept]
    return PreparedGroup(kept, kept, {}, {}, [[] for _ in kept], [[v] for v in rewards], advantages, skipped)


def test_groups_without_spread_are_counted_as_solved_or_alike():
    groups = [
        group([1.0, 1.0], "no_spread"),
        group([1.0, 1.0], "no_spread"),
        group([0.0, 0.0], "no_spread"),
        group([0.0, 1.0], None),
        group([1.0], "too_few_episodes"),
    ]
    assert signal_counts(groups, success_threshold=1.0) == {
        "groups_all_solved": 2.0,
        "groups_all_alike_unsolved": 1.0,
    }


def test_a_step_that_trains_almost_nothing_is_said_with_its_cause_at_most_every_ten_steps():
    watch = SignalWatch()
    solved = {
        "groups_rolled_out": 8,
        "groups_with_signal": 1,
        "groups_all_solved": 6,
        "groups_all_alike_unsolved": 1,
    }
    said = watch.warning(3, solved)
    assert said is not None and said.startswith("only 1 of 8 groups had a reward spread and trained (6 with")
    assert "already solves most tasks" in said
    assert watch.warning(4, solved) is None  # not again before ten steps
    unsolved = {**solved, "groups_all_solved": 0, "groups_all_alike_unsolved": 7}
    said = watch.warning(13, unsolved)
    assert said is not None and "too hard or the reward too coarse" in said
    assert watch.warning(30, {"groups_rolled_out": 8, "groups_with_signal": 4}) is None
