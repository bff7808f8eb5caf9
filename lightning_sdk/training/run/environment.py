"""`environment`: environment variables set for a block (the trainer's endpoint, for the agent's default
clients during rollouts and evaluations), restored afterwards."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

__all__ = ["environment"]


@contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """Set `values` in `os.environ` for the block and restore the previous values (or absence) after."""
    previous = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
