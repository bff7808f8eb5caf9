"""Rollout: run the user's agent on every task `group_size` times, concurrently, and collect episodes.

Async agents run on the event loop; sync agents run in worker threads that carry the context (so
their LLM calls land in their own episode). Each run has a timeout; a failed or timed-out run still
yields an `Episode` with its error, so one bad episode never stops a training step. While rollouts run on
through the update, the time the trainer held model calls for it (`UpdatePauses`) does not count
against that timeout: an agent is not failed for the trainer's update.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import math
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from lightning_sdk.tracing.context import collect_into
from lightning_sdk.tracing.episode import Episode
from lightning_sdk.tracing.routing import Router, routing

__all__ = [
    "EpisodeRunner",
    "Rollout",
    "UpdatePauses",
    "agent_accepts_llm",
    "call_agent",
    "run_episode",
    "run_rollouts",
    "within_time",
]


@dataclass
class Rollout:
    """One run of the agent on one task of the batch."""

    task_index: int
    """Position of the task in the batch (the GRPO group it belongs to)."""
    sample_index: int
    """Which of the `group_size` runs of that task this is."""
    episode: Episode
    """The recorded episode (a synthetic one holding the error when the agent never finished)."""
    timed_out: bool = False
    """True when the run exceeded its timeout."""

    @property
    def failed(self) -> bool:
        """True when the agent raised or timed out."""
        return self.timed_out or self.episode.error is not None


def agent_accepts_llm(agent: Callable[..., Any]) -> bool:
    """True when the agent's signature declares an `llm` parameter (or takes **kwargs)."""
    try:
        parameters = inspect.signature(agent).parameters
    except (TypeError, ValueError):
        return False
    return "llm" in parameters


async def call_agent(
    agent: Callable[..., Any], task: Any, kwargs: dict[str, Any], executor: ThreadPoolExecutor
) -> Any:
    """Call `agent(task, **kwargs)` whatever its kind; return its result (last item for generators)."""
    if inspect.iscoroutinefunction(agent):
        return await agent(task, **kwargs)
    if inspect.isasyncgenfunction(agent):
        last = None
        async for last in agent(task, **kwargs):
            pass
        return last
    context = contextvars.copy_context()
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(executor, context.run, _call_sync_agent, agent, task, kwargs)


def _call_sync_agent(agent: Callable[..., Any], task: Any, kwargs: dict[str, Any]) -> Any:
    result = agent(task, **kwargs)
    if inspect.isgenerator(result):
        last = None
        for last in result:
            pass
        return last
    return result


async def run_rollouts(
    agent: Callable[..., Any],
    tasks: Sequence[Any],
    group_size: int,
    *,
    llm: Any = None,
    max_concurrency: int = 32,
    timeout_s: float = 300.0,
    reward_fn: Callable[[Any, Any], float] | None = None,
    on_finished: Callable[[Rollout], None] | None = None,
    router: Router | None = None,
    pauses: UpdatePauses | None = None,
) -> list[Rollout]:
    """Run `agent` on each task `group_size` times, at most `max_concurrency` at once.

    Returns one `Rollout` per run, ordered by (task_index, sample_index). `reward_fn(task, output)`
    scores episodes that recorded no reward themselves. `on_finished` is called as each run ends
    (e.g. to advance a progress bar). `router` sends the agent's model calls to the policy (see
    `lightning_sdk.tracing.routing`). `pauses`: the trainer's clock of held calls, which the time limit
    does not count (runs that go on through updates).
    """
    parts = (agent, llm, max_concurrency, timeout_s, reward_fn, router, on_finished, pauses)
    with EpisodeRunner(*parts) as runner:
        slots = [(t, s) for t in range(len(tasks)) for s in range(group_size)]
        rollouts = await asyncio.gather(*(runner.run(tasks[t], t, s) for t, s in slots))
    return list(rollouts)


class EpisodeRunner:
    """Runs episodes of one agent with one concurrency limit and one thread pool for all of them: the
    batch of a step (`run_rollouts`), or groups that come and go while training goes on
    (`lightning_sdk.rollouts.pool`)."""

    def __init__(
        self,
        agent: Callable[..., Any],
        llm: Any = None,
        max_concurrency: int = 32,
        timeout_s: float = 300.0,
        reward_fn: Callable[[Any, Any], float] | None = None,
        router: Router | None = None,
        on_finished: Callable[[Rollout], None] | None = None,
        pauses: UpdatePauses | None = None,
    ) -> None:
        self.agent, self.timeout_s, self.reward_fn, self.router = agent, timeout_s, reward_fn, router
        self.on_finished, self.pauses = on_finished, pauses
        self.kwargs = {"llm": llm} if llm is not None and agent_accepts_llm(agent) else {}
        self.semaphore = asyncio.Semaphore(max_concurrency)
        self.executor = ThreadPoolExecutor(max_concurrency, thread_name_prefix="lightning-rollout")

    async def run(self, task: Any, task_index: int, sample_index: int) -> Rollout:
        """One run of the agent on `task`, once a slot is free."""
        async with self.semaphore:
            rollout = await run_episode(
                self.agent,
                task,
                self.kwargs,
                self.executor,
                self.timeout_s,
                self.reward_fn,
                self.router,
                self.pauses,
            )
        rollout.task_index, rollout.sample_index = task_index, sample_index
        if self.on_finished is not None:
            self.on_finished(rollout)
        return rollout

    async def run_group(self, task: Any, group_size: int) -> list[Rollout]:
        """`group_size` runs of the agent on `task`, in `sample_index` order (`task_index` 0)."""
        return list(await asyncio.gather(*(self.run(task, 0, s) for s in range(group_size))))

    def close(self) -> None:
        # Sync agents that timed out still occupy threads; do not wait for them.
        self.executor.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> EpisodeRunner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


async def run_episode(
    agent: Callable[..., Any],
    task: Any,
    kwargs: dict[str, Any],
    executor: ThreadPoolExecutor,
    timeout_s: float,
    reward_fn: Callable[[Any, Any], float] | None,
    router: Router | None = None,
    pauses: UpdatePauses | None = None,
) -> Rollout:
    """Run `agent(task, **kwargs)` once with a timeout and return its recorded episode (a synthetic one
    holding the error when it produced none). Used by in-process rollouts and by runners alike; the
    agent's model calls go where `router` sends them (and its tasks and threads carry it). `pauses`: the
    trainer's clock of the time it held model calls for its updates; what it advances during the episode
    is added to `timeout_s`."""
    sink: list[Episode] = []
    started = time.time()
    output: Any = None
    error: Exception | None = None
    timed_out = False
    with collect_into(sink), routing(router):
        try:
            output = await within_time(call_agent(agent, task, kwargs, executor), timeout_s, pauses)
        except TimeoutError as exc:
            timed_out, error = True, exc
        except Exception as exc:  # noqa: BLE001 - recorded on the episode by @trace_agent; kept for untraced agents
            error = exc
    episode = sink[0] if sink else _episode_without_record(agent, task, started, error)
    if timed_out:
        episode.metadata["timed_out"] = True
        if episode.error is None:
            episode.error = _error_dict(TimeoutError(f"agent did not finish within {timeout_s:g} s"))
    if reward_fn is not None and episode.error is None and episode.reward is None:
        score_with_reward_fn(episode, reward_fn, task, output)
    return Rollout(task_index=-1, sample_index=-1, episode=episode, timed_out=timed_out)


@dataclass
class UpdatePauses:
    """The trainer's clock of the seconds it has held model calls for its updates (`RequestGate.
    closed_seconds` in its own process), as an episode's time limit reads it."""

    read: Callable[[], float]
    """The clock now, as far as this process knows it."""
    refresh: Callable[[], Awaitable[None]] | None = None
    """Asks the trainer again, before a limit is taken as passed: a runner hears the clock only with its
    lease and its renewals, and an update may have begun since the last one."""


async def within_time(awaitable: Awaitable[Any], timeout_s: float, pauses: UpdatePauses | None = None) -> Any:
    """`awaitable`'s result, or `TimeoutError` (it is cancelled) once it ran `timeout_s` seconds, not
    counting what the `pauses` clock advanced meanwhile."""
    if pauses is None:
        return await asyncio.wait_for(awaitable, timeout_s)
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(awaitable)
    started, paused_before, asked = loop.time(), pauses.read(), False
    try:
        while True:  # the limit moves on while the trainer holds calls: look again when it would pass
            left = timeout_s + (pauses.read() - paused_before) - (loop.time() - started)
            if left <= 0 and pauses.refresh is not None and not asked:
                asked = True  # once per time the limit seems passed; it moves on if an update held calls
                with contextlib.suppress(Exception):  # a trainer out of reach: the limit stands
                    await pauses.refresh()
                continue
            if left <= 0:
                raise TimeoutError
            asked = False
            # At least a moment: while the gate is closed `left` stands still, and could be tiny.
            done, _ = await asyncio.wait({task}, timeout=max(left, 0.25))
            if done:
                return task.result()
    finally:
        if not task.done():  # timed out, or this episode was cancelled: the agent's work stops too
            task.cancel()
            await _cancelled(task)


async def _cancelled(task: asyncio.Future[Any]) -> None:
    """Wait for `task` to end after `cancel()`; a cancellation of the waiting task itself goes on up."""
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
    except Exception:  # noqa: BLE001 - the episode already ended (timed out or cancelled)
        pass


def _episode_without_record(
    agent: Callable[..., Any], task: Any, started: float, error: Exception | None
) -> Episode:
    """The episode for a run that produced none: a timeout, or an agent without `@trace_agent`."""
    name = getattr(agent, "__qualname__", None) or type(agent).__name__
    episode = Episode(name=name, task=task, started_at=started, ended_at=time.time())
    if error is not None:
        episode.error = _error_dict(error)
    else:
        episode.metadata["untraced"] = True
    return episode


def score_with_reward_fn(
    episode: Episode, reward_fn: Callable[[Any, Any], float], task: Any, output: Any
) -> None:
    """Record `reward_fn(task, output)` as the episode's reward; a bad value becomes a reward error."""
    try:
        value = reward_fn(task, output)
        if not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"reward must be a finite number, got {value!r}")
    except Exception as exc:  # noqa: BLE001 - a bad reward function scores nothing; training goes on
        episode.reward_errors.append({**_error_dict(exc), "reward": "reward_fn"})
        return
    episode.rewards["reward"] = float(value)


def _error_dict(exc: BaseException) -> dict[str, str]:
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc)),
    }
