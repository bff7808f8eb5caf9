"""RunLoop: every rollout of a run on one event loop, from plain code and from inside a running loop."""

from __future__ import annotations

import asyncio

import pytest

from lightning_sdk.training.run.event_loop import RunLoop


async def current_loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()


def test_every_run_uses_the_same_loop_so_clients_bound_to_it_keep_working() -> None:
    loop = RunLoop()
    first = loop.run(current_loop())
    # What an agent's long-lived async client does: it keeps a future made on the first step's loop.
    queue: asyncio.Queue[int] = loop.run(_make_queue())
    loop.run(queue.put(1))
    assert loop.run(current_loop()) is first and loop.run(queue.get()) == 1
    loop.close()
    assert first.is_closed()


async def _make_queue() -> asyncio.Queue[int]:
    return asyncio.Queue()


async def test_inside_a_running_loop_it_runs_on_its_own_loop_in_a_helper_thread() -> None:
    loop = RunLoop()
    mine = asyncio.get_running_loop()
    theirs = loop.run(current_loop())
    assert theirs is not mine and loop.run(current_loop()) is theirs
    with pytest.raises(ValueError, match="boom"):
        loop.run(_fail())
    loop.close()


async def _fail() -> None:
    raise ValueError("boom")
