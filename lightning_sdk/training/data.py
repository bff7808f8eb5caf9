"""Datasets of tasks: any sequence or iterable of tasks, or a Hugging Face `datasets.Dataset`.

A `TaskCursor` hands out batches of tasks, reshuffling at each pass with a seed, and has a position
(pass, index) that checkpoints store so a resumed run continues with the same next batch.

With a balance key (`TrainerConfig.balance_by`) the cursor draws the groups of tasks that share a key
evenly instead: a "pass" is then one round that takes one task from every group, in a shuffled order,
and each group cycles through its own tasks, reshuffled at each cycle. A dataset where 70% of the tasks
are one easy kind then still spends most of its rollouts on the other kinds.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BalanceKey", "TaskCursor", "group_tasks", "materialize_tasks"]

BalanceKey = str | Callable[[Any], Hashable]
"""A task field name (tasks are dicts) or a function of the task; tasks with equal keys form a group."""


def materialize_tasks(dataset: Any, what: str = "dataset") -> list[Any]:
    """Turn a dataset into a list of tasks, with a clear error for what cannot be one."""
    if dataset is None:
        raise ValueError(f"{what} is None; pass a list of tasks (usually dicts) or a datasets.Dataset.")
    if isinstance(dataset, str | bytes | dict):
        raise TypeError(
            f"{what} must be a sequence or iterable of tasks, got a {type(dataset).__name__}; "
            "wrap a single task in a list: [task]."
        )
    if not isinstance(dataset, Sequence | Iterable) and not hasattr(dataset, "__getitem__"):
        raise TypeError(f"{what} must be a sequence or iterable of tasks, got {type(dataset).__name__}.")
    tasks = [dataset[i] for i in range(len(dataset))] if _is_hf_dataset(dataset) else list(dataset)
    if not tasks:
        raise ValueError(f"{what} is empty; it needs at least one task.")
    return tasks


def _is_hf_dataset(dataset: object) -> bool:
    # Row access by index gives plain dicts; iterating a datasets.Dataset does too, but indexing
    # keeps the order stable and works for every version.
    return type(dataset).__module__.startswith("datasets") and hasattr(dataset, "__len__")


def group_tasks(tasks: Sequence[Any], key: BalanceKey) -> list[list[int]]:
    """The indices of `tasks` grouped by `key`, groups in order of first appearance.

    Raises a `ValueError` naming the first task whose key cannot be read or is not hashable.
    """
    groups: dict[Hashable, list[int]] = {}
    for index, task in enumerate(tasks):
        value = _balance_value(task, index, key)
        try:
            groups.setdefault(value, []).append(index)
        except TypeError:
            raise ValueError(
                f"balance_by gave task {index} the key {value!r}, which is not hashable; "
                "return a string, number or tuple."
            ) from None
    return list(groups.values())


def _balance_value(task: Any, index: int, key: BalanceKey) -> Any:
    if callable(key):
        try:
            return key(task)
        except Exception as error:
            name = getattr(key, "__qualname__", repr(key))
            raise ValueError(f"balance_by={name} raised on task {index}: {error!r}") from error
    try:
        return task[key]
    except (KeyError, IndexError, TypeError):
        kind = type(task).__name__
        raise ValueError(
            f"balance_by={key!r}, but task {index} (a {kind}) has no field {key!r}; give every task that "
            "field, or pass a function of the task: balance_by=lambda task: ..."
        ) from None


@dataclass
class TaskCursor:
    """Hands out batches of tasks forever: each pass over the tasks is shuffled with `(seed, pass)`.

    With `balance_by`, each pass is a round over the groups of tasks sharing a key (see the module
    docstring), so every group is drawn equally often whatever its size.
    """

    tasks: list[Any]
    batch_size: int
    shuffle: bool = True
    seed: int = 0
    epoch: int = 0
    """Passes over the tasks (with `balance_by`: rounds over the groups) completed so far."""
    index: int = 0
    """Position inside the current pass."""
    balance_by: BalanceKey | None = None
    """Draw the groups of tasks with equal keys evenly (`None`: every task once per pass)."""
    returned: list[int] = field(default_factory=list)
    """Tasks handed out but not trained on, given back (`give_back`): drawn again first. Rollouts that
    run on through the update (`TrainerConfig.max_staleness`) give back the tasks still running at a
    checkpoint, so a resumed run trains them."""
    _groups: list[list[int]] = field(init=False, repr=False, default_factory=list)

    def __post_init__(self) -> None:
        if self.balance_by is not None:
            self._groups = group_tasks(self.tasks, self.balance_by)

    def next_batch(self) -> list[Any]:
        """The next `batch_size` tasks, crossing into the next (reshuffled) pass when needed."""
        return [self.tasks[i] for i in self.next_indices(self.batch_size)]

    def next_indices(self, count: int) -> list[int]:
        """The positions in `tasks` of the next `count` tasks: given-back ones first, then the passes'."""
        indices, self.returned = self.returned[:count], self.returned[count:]
        while len(indices) < count:
            order = self._order(self.epoch)
            take = min(count - len(indices), len(order) - self.index)
            indices.extend(order[self.index : self.index + take])
            self.index += take
            if self.index >= len(order):
                self.epoch, self.index = self.epoch + 1, 0
        return indices

    def give_back(self, indices: list[int]) -> None:
        """Tasks handed out and not trained on: the next draws take them first, in this order."""
        self.returned = [*indices, *self.returned]

    def state(self) -> dict[str, Any]:
        """The position (and the tasks given back), for checkpoints."""
        return {"epoch": self.epoch, "index": self.index, "returned": list(self.returned)}

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a position saved by `state()` (a checkpoint from before `returned` has none)."""
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
        self.returned = [int(i) for i in state.get("returned", [])]

    def _order(self, epoch: int) -> list[int]:
        if self._groups:
            return self._round(epoch)
        order = list(range(len(self.tasks)))
        if self.shuffle:
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    def _round(self, round_index: int) -> list[int]:
        """One task of every group: the group's `round_index`-th draw from its own reshuffled cycle."""
        picks = []
        for number, members in enumerate(self._groups):
            cycle, position = divmod(round_index, len(members))
            order = list(members)
            if self.shuffle:
                random.Random(f"{self.seed}:group{number}:{cycle}").shuffle(order)
            picks.append(order[position])
        if self.shuffle:
            random.Random(f"{self.seed}:round{round_index}").shuffle(picks)
        return picks
