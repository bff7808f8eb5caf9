"""RolloutPool: groups run in the background on the run's loop and come back whole, as they complete."""

from __future__ import annotations

import time
from typing import Any

import pytest

from lightning_sdk.rollouts.in_process import EpisodeRunner, UpdatePauses
from lightning_sdk.rollouts.pool import RolloutPool
from lightning_sdk.tracing.decorators import trace_agent
from lightning_sdk.training.run.event_loop import RunLoop


@trace_agent
def waits_on_a_tool(task: dict[str, Any]) -> str:
    time.sleep(task["seconds"])  # a tool call: the agent's own time, not the model's
    return task["name"]


def test_groups_run_in_the_background_and_return_whole_in_completion_order() -> None:
    loop = RunLoop()
    with EpisodeRunner(waits_on_a_tool, max_concurrency=8) as runner:

        async def run_group(task: Any) -> list[Any]:
            return await runner.run_group(task, 2)

        pool = RolloutPool(run_group, loop.submit)
        started = time.perf_counter()
        pool.start(7, {"name": "slow", "seconds": 0.6})
        pool.start(3, {"name": "fast", "seconds": 0.1})
        assert time.perf_counter() - started < 0.3  # `start` does not wait for the agents
        assert pool.held == 2 and sorted(pool.task_ids()) == [3, 7]
        first = pool.next_complete()
        assert first.task_id == 3 and [r.episode.output for r in first.rollouts] == ["fast", "fast"]
        assert [r.sample_index for r in first.rollouts] == [0, 1]
        assert pool.task_ids() == [7]
        pool.wait_idle()  # the slow one completes and is kept
        assert pool.in_flight == 0 and pool.held == 1 and pool.task_ids() == [7]
        assert pool.next_complete().task_id == 7 and pool.held == 0
        with pytest.raises(RuntimeError, match="none is running"):
            pool.next_complete()
    loop.close()


def test_a_group_whose_run_raises_raises_in_the_trainer_and_close_cancels_the_rest() -> None:
    loop = RunLoop()

    async def broken(task: Any) -> list[Any]:
        raise ValueError(f"no runner for {task}")

    pool = RolloutPool(broken, loop.submit)
    pool.start(0, "t0")
    with pytest.raises(ValueError, match="no runner for t0"):
        pool.next_complete()
    assert pool.held == 0

    async def forever(task: Any) -> list[Any]:
        import asyncio

        await asyncio.sleep(3600)
        return []

    pool = RolloutPool(forever, loop.submit)
    pool.start(5, "t5")
    assert pool.task_ids() == [5]
    pool.close()
    assert pool.held == 0 and pool.task_ids() == []
    loop.close()


def test_the_time_an_update_holds_calls_is_not_counted_against_an_episodes_time_limit() -> None:
    """With rollouts running on through the update, the trainer closes the engine's gate for it; an episode
    that ran 2 s, 1.5 s of them while the gate was closed, is within a 1 s limit, and one that ran 4 s is
    not (the limit moved by the 1.5 s, no more)."""
    import asyncio
    import threading

    from lightning_sdk.engine.gate import RequestGate

    gate = RequestGate()

    def update() -> None:  # the trainer's side: the gate is closed for an update of 1.5 s
        time.sleep(0.1)
        gate.close()
        time.sleep(1.5)
        gate.open()

    async def episodes() -> list[Any]:
        with (
            EpisodeRunner(waits_on_a_tool, timeout_s=1.0, pauses=UpdatePauses(gate.closed_seconds)) as paused,
            EpisodeRunner(waits_on_a_tool, timeout_s=1.0) as unpaused,
        ):
            threading.Thread(target=update, daemon=True).start()
            return await asyncio.gather(
                paused.run({"name": "through the update", "seconds": 2.0}, 0, 0),
                paused.run({"name": "hangs", "seconds": 4.0}, 0, 1),
                unpaused.run({"name": "no pause clock", "seconds": 2.0}, 0, 2),
            )

    started = time.perf_counter()
    through, hangs, unpaused = asyncio.run(episodes())
    assert not through.timed_out and through.episode.output == "through the update"
    assert hangs.timed_out and unpaused.timed_out
    assert time.perf_counter() - started < 3.9  # `hangs` was stopped at 1 s plus the pause, not at its end
    assert 1.4 < gate.closed_seconds() < 2.5
