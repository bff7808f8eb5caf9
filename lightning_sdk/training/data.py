"""Datasets of tasks: any sequence or iterable of tasks, or a Hugging Face `datasets.Dataset`.

A `TaskCursor` hands out batches of tasks, reshuffling at each pass with a seed, and has a position
(pass, index) that checkpoints store so a resumed run continues with the same next batch.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["TaskCursor", "materialize_tasks"]


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


def _is_hf_dataset(dataset: Any) -> bool:
    # Row access by index gives plain dicts; iterating a datasets.Dataset does too, but indexing
    # keeps the order stable and works for every version.
    return type(dataset).__module__.startswith("datasets") and hasattr(dataset, "__len__")


@dataclass
class TaskCursor:
    """Hands out batches of tasks forever: each pass over the tasks is shuffled with `(seed, pass)`."""

    tasks: list[Any]
    batch_size: int
    shuffle: bool = True
    seed: int = 0
    epoch: int = 0
    """Passes over the tasks completed so far."""
    index: int = 0
    """Position inside the current pass."""

    def next_batch(self) -> list[Any]:
        """The next `batch_size` tasks, crossing into the next (reshuffled) pass when needed."""
        batch: list[Any] = []
        while len(batch) < self.batch_size:
            order = self._order(self.epoch)
            take = min(self.batch_size - len(batch), len(order) - self.index)
            batch.extend(self.tasks[i] for i in order[self.index : self.index + take])
            self.index += take
            if self.index >= len(order):
                self.epoch, self.index = self.epoch + 1, 0
        return batch

    def state(self) -> dict[str, int]:
        """The position, for checkpoints."""
        return {"epoch": self.epoch, "index": self.index}

    def restore(self, state: dict[str, int]) -> None:
        """Continue from a position saved by `state()`."""
        self.epoch, self.index = int(state["epoch"]), int(state["index"])

    def _order(self, epoch: int) -> list[int]:
        order = list(range(len(self.tasks)))
        if self.shuffle:
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order
