"""How rollouts that run on through the update (`max_staleness >= 1`) run one task's group: in this process,
or on runners (processes, Ray actors, gateway agents), the same way a step's batch runs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from lightning_sdk.rollouts.in_process import EpisodeRunner, Rollout, UpdatePauses
from lightning_sdk.rollouts.pool import GroupRun

if TYPE_CHECKING:
    from lightning_sdk.training.run.session import TrainingSession

__all__ = ["group_run"]


def group_run(
    session: TrainingSession,
    agent: Callable[..., Any] | None,
    reward: Callable[[Any, Any], float] | None,
) -> GroupRun:
    """A coroutine function that runs one task `group_size` times; what it opens closes with the session."""
    config = session.config
    if session.remote is not None:
        return _on_runners(session, reward)
    if agent is None:
        raise ValueError("fit(agent=None) needs TrainerConfig(runners=Runners(...)): it runs the agent.")
    gate = getattr(session.engine, "gate", None)  # `EngineBase`'s: it holds the calls during an update
    runner = EpisodeRunner(
        agent,
        session.endpoint,
        config.max_concurrency,
        config.episode_timeout_s,
        reward,
        session.router,
        pauses=UpdatePauses(gate.closed_seconds) if gate is not None else None,  # not the agent's time
    )
    session.on_close(runner.close)

    async def run_here(task: Any) -> list[Rollout]:
        return await runner.run_group(task, config.group_size)

    return run_here


def _on_runners(session: TrainingSession, reward: Callable[[Any, Any], float] | None) -> GroupRun:
    from lightning_sdk.training.run.runner_episodes import fail_unknown_tokens

    config, remote = session.config, session.remote
    assert remote is not None
    # `RemoteRollouts.run` blocks until the runners uploaded the group: one thread per group held.
    executor = ThreadPoolExecutor(
        max_workers=(config.max_staleness + 1) * config.batch_size, thread_name_prefix="lightning-groups"
    )
    session.on_close(lambda: executor.shutdown(wait=False, cancel_futures=True))
    vocabulary = session.vocabulary_size

    def run_blocking(task: Any) -> list[Rollout]:
        rolled = remote.run([task], config.group_size, session.engine.weight_version, reward)
        fail_unknown_tokens(rolled, vocabulary)  # ids the forward pass would fail on
        return rolled

    async def run_there(task: Any) -> list[Rollout]:
        return await asyncio.get_running_loop().run_in_executor(executor, run_blocking, task)

    return run_there
