"""The task cursor: passes over the data, balanced draws across kinds of task, and resuming."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from lightning_sdk.training.data import TaskCursor, group_tasks, materialize_tasks

# 14 tasks of three kinds in very different numbers, like a dataset dominated by easy lookups.
TASKS: list[dict[str, Any]] = (
    [{"id": f"lookup{i}", "kind": "lookup"} for i in range(10)]
    + [{"id": f"count{i}", "kind": "count"} for i in range(3)]
    + [{"id": "join0", "kind": "join"}]
)
KIND = {task["id"]: task["kind"] for task in TASKS}


def draw(cursor: TaskCursor, batches: int) -> list[str]:
    return [task["id"] for _ in range(batches) for task in cursor.next_batch()]


def test_every_pass_covers_every_task_once_in_a_new_order() -> None:
    cursor = TaskCursor(TASKS, batch_size=4, seed=3)
    drawn = draw(cursor, 7)  # 28 tasks: exactly two passes
    first, second = drawn[:14], drawn[14:]
    assert sorted(first) == sorted(second) == sorted(task["id"] for task in TASKS)
    assert first != second
    assert (cursor.epoch, cursor.index) == (2, 0)


def test_balanced_draws_take_every_kind_equally_often_whatever_its_size() -> None:
    cursor = TaskCursor(TASKS, batch_size=3, seed=0, balance_by="kind")
    drawn = draw(cursor, 30)  # 90 tasks: 30 rounds of one task of each of the 3 kinds
    for start in range(0, len(drawn), 3):  # with 3 kinds and 3 tasks per step, each step has one of each
        assert sorted(KIND[task] for task in drawn[start : start + 3]) == ["count", "join", "lookup"]
    counts = Counter(drawn)
    assert counts["join0"] == 30
    assert all(counts[f"count{i}"] == 10 for i in range(3))  # each kind cycles through all its tasks
    assert all(counts[f"lookup{i}"] == 3 for i in range(10))


def test_a_kind_cycles_through_its_tasks_before_repeating_one() -> None:
    cursor = TaskCursor(TASKS, batch_size=3, seed=5, balance_by=lambda task: task["kind"])
    lookups = [task for task in draw(cursor, 20) if KIND[task] == "lookup"]
    assert sorted(lookups[:10]) == sorted(lookups[10:]) == [f"lookup{i}" for i in range(10)]
    assert lookups[:10] != lookups[10:]  # each cycle is reshuffled


def test_balanced_order_depends_only_on_seed_and_resumes_from_its_state() -> None:
    cursor = TaskCursor(TASKS, batch_size=4, seed=7, balance_by="kind")
    draw(cursor, 5)
    state = cursor.state()
    expected = draw(cursor, 6)
    resumed = TaskCursor(TASKS, batch_size=4, seed=7, balance_by="kind")
    resumed.restore(state)
    assert draw(resumed, 6) == expected
    other_seed = TaskCursor(TASKS, batch_size=4, seed=8, balance_by="kind")
    other_seed.restore(state)
    assert draw(other_seed, 6) != expected


def test_without_shuffle_balanced_rounds_keep_the_data_order() -> None:
    cursor = TaskCursor(TASKS, batch_size=3, shuffle=False, balance_by="kind")
    assert draw(cursor, 3) == [
        "lookup0", "count0", "join0",
        "lookup1", "count1", "join0",
        "lookup2", "count2", "join0",
    ]  # fmt: skip


def test_groups_follow_first_appearance_and_bad_keys_name_the_task() -> None:
    assert group_tasks(TASKS, "kind") == [list(range(10)), [10, 11, 12], [13]]
    with pytest.raises(ValueError, match=r"balance_by='template', but task 0 \(a dict\) has no field"):
        group_tasks(TASKS, "template")
    with pytest.raises(ValueError, match=r"balance_by='kind', but task 1 \(a str\) has no field 'kind'"):
        group_tasks([{"kind": "a"}, "a bare string"], "kind")
    with pytest.raises(ValueError, match=r"gave task 0 the key \['a'\], which is not hashable"):
        group_tasks([{"kind": ["a"]}], "kind")
    with pytest.raises(ValueError, match=r"balance_by=.*<lambda> raised on task 13: KeyError\('steps'\)"):
        group_tasks(TASKS, lambda task: task["steps"] if task["kind"] == "join" else 0)


def test_datasets_that_cannot_be_tasks_get_a_clear_error() -> None:
    assert materialize_tasks(iter([{"a": 1}])) == [{"a": 1}]
    with pytest.raises(ValueError, match="train_dataset is None"):
        materialize_tasks(None, "train_dataset")
    with pytest.raises(TypeError, match="wrap a single task in a list"):
        materialize_tasks({"question": "q"})
    with pytest.raises(ValueError, match="val_dataset is empty"):
        materialize_tasks([], "val_dataset")


def test_tasks_given_back_are_drawn_first_and_survive_a_checkpoint() -> None:
    tasks = [f"t{i}" for i in range(10)]
    cursor = TaskCursor(tasks, batch_size=4, seed=3)
    first_four = TaskCursor(tasks, batch_size=4, seed=3).next_indices(4)
    held = cursor.next_indices(3)
    assert held == first_four[:3]
    cursor.give_back(held[1:])  # two groups were still running at the checkpoint
    saved = cursor.state()
    resumed = TaskCursor(tasks, batch_size=4, seed=3)
    resumed.restore(saved)
    assert resumed.next_indices(3) == [*held[1:], first_four[3]]
    old_checkpoint = {"epoch": 0, "index": 2}  # written before tasks could be given back
    resumed.restore(old_checkpoint)
    assert resumed.returned == [] and resumed.index == 2
