"""Evaluation: run the agent once per validation task and summarise the rewards; with rollouts that run on
through the update, an evaluation that runs beside training on the evaluated step's pinned adapter."""

from __future__ import annotations

import concurrent.futures
import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from lightning_sdk.rollouts.in_process import Rollout

if TYPE_CHECKING:
    from lightning_sdk.training.records.metrics import EvaluationProgress
    from lightning_sdk.training.run.session import TrainingSession

__all__ = [
    "EVALUATED_ADAPTER_DIR",
    "PINNED_ADAPTER",
    "EvaluationBeside",
    "end_evaluation_beside",
    "evaluate_agent",
    "release_evaluation_beside",
    "start_evaluation_beside",
    "summarize_rollouts",
    "why_not_beside",
]


def summarize_rollouts(rollouts: list[Rollout], success_threshold: float) -> dict[str, float]:
    """Mean reward (failed or unscored episodes count as 0), success rate and failure count."""
    rewards = []
    failed = 0
    for rollout in rollouts:
        value = rollout.episode.reward
        if rollout.failed or value is None or not math.isfinite(value):
            failed += rollout.failed
            value = 0.0
        rewards.append(value)
    count = len(rewards)
    return {
        "reward": math.fsum(rewards) / count if count else math.nan,
        "success_rate": sum(value >= success_threshold for value in rewards) / count if count else math.nan,
        "episodes": float(count),
        "episodes_failed": float(failed),
    }


def evaluate_agent(
    session: TrainingSession,
    agent: Callable[..., Any] | None,
    tasks: list[Any],
    reward: Callable[[Any, Any], float] | None,
    on_finished: Callable[[Rollout], None] | None = None,
) -> tuple[dict[str, float], list[Rollout]]:
    """Run `agent` once on each task against the session's endpoint, in the evaluation's sampling lane;
    return the metrics (averaged over ranks) and this rank's rollouts.

    `on_finished` is called as each of this rank's episodes ends (e.g. to count them on screen).
    """
    rollouts = session.rollouts(agent, session.my_share(tasks), 1, reward, on_finished, lane="eval")
    metrics: dict[str, float] = session.distributed.mean_metrics(
        summarize_rollouts(rollouts, session.config.success_threshold)
    )
    return metrics, rollouts


# -- an evaluation beside training (`TrainerConfig.eval_beside_training`) ------------------------------------
PINNED_ADAPTER = "lightning-evaluated-step"
"""The name the evaluated step's adapter is pinned under in the engine while its evaluation runs."""
EVALUATED_ADAPTER_DIR = "evaluated_adapter"
"""Its copy inside the run folder: the engine reads it again after a wake, and `keep_best` keeps it."""


@dataclass
class EvaluationBeside:
    """An evaluation of one step's weights that runs while the next steps train."""

    step: int
    future: concurrent.futures.Future[list[Rollout]]
    adapter: Path
    """The evaluated adapter's folder (`EVALUATED_ADAPTER_DIR`), pinned in the engine until the end."""
    progress: EvaluationProgress
    started: float
    ended: float | None = None

    @property
    def done(self) -> bool:
        return self.future.done()


def why_not_beside(session: TrainingSession, judged: bool) -> str | None:
    """Why an evaluation cannot run beside training in this run (None: it can): the evaluated adapter must
    be pinned in the engine, and every evaluation call must say it is one (the `eval` lane's header)."""
    engine: Any = session.engine
    if session.remote is not None:
        return "the agents run on runners, whose calls do not say they are an evaluation's"
    if session.roles is not None:
        return "roles have an adapter each (pinning every role's is not supported yet)"
    if judged:
        return "a judge scores the episodes (its costs would mix with the training steps')"
    if not callable(getattr(engine, "pin_adapter", None)) or getattr(engine, "weight_sync", None) != "lora":
        kind, sync = type(engine).__name__, getattr(engine, "weight_sync", None)
        return (
            f"the engine cannot keep an evaluated step's adapter beside the newer ones ({kind} with "
            f"weight_sync={sync!r}; it takes a VLLMEngine with weight_sync='lora', the GPU's default)"
        )
    if getattr(engine, "max_adapters", 0) < 2:
        return "the engine has no place for a second adapter (max_adapters=1; the trainer starts it with 2)"
    return None


def start_evaluation_beside(
    session: TrainingSession,
    step: int,
    agent: Callable[..., Any],
    tasks: list[Any],
    reward: Callable[[Any, Any], float] | None,
) -> EvaluationBeside:
    """Pin step `step`'s adapter in the engine under `PINNED_ADAPTER`, send the evaluation's calls to it,
    and start the evaluation on the run's loop; returns at once. The engine must be awake (between
    updates), with the step's adapter pushed."""
    from lightning_sdk.rollouts.in_process import UpdatePauses, run_rollouts

    config, engine, router = session.config, cast(Any, session.engine), session.router
    folder = session.save_adapter_to(session.run_dir / EVALUATED_ADAPTER_DIR)
    engine.pin_adapter(PINNED_ADAPTER, folder, version=step)
    session.sampling.lanes["eval"].answer_with(PINNED_ADAPTER)
    progress = session.evaluation_progress(step, len(tasks), live=False)
    gate = getattr(engine, "gate", None)
    rollouts = run_rollouts(
        agent,
        tasks,
        1,
        llm=session.endpoint,
        max_concurrency=config.max_concurrency,
        timeout_s=config.episode_timeout_s,
        reward_fn=reward,
        on_finished=progress.episode_done,
        router=router.in_lane("eval") if router is not None else None,
        pauses=UpdatePauses(gate.closed_seconds) if gate is not None else None,  # updates hold its calls
    )
    running = EvaluationBeside(step, session.loop.submit(rollouts), folder, progress, time.perf_counter())
    running.future.add_done_callback(lambda _: setattr(running, "ended", time.perf_counter()))
    return running


def end_evaluation_beside(
    session: TrainingSession, running: EvaluationBeside
) -> tuple[dict[str, float], list[Rollout]]:
    """Wait for `running` to end, release its pinned adapter, and return its metrics and rollouts."""
    try:
        rollouts = running.future.result()
    finally:
        release_evaluation_beside(session, running)
    return summarize_rollouts(rollouts, session.config.success_threshold), rollouts


def release_evaluation_beside(session: TrainingSession, running: EvaluationBeside) -> None:
    """Cancel `running` if it still runs (an error, Ctrl+C), send evaluation calls to the served adapter
    again and unpin the evaluated one."""
    running.future.cancel()
    session.sampling.lanes["eval"].answer_with(None)
    with contextlib.suppress(Exception):  # an engine already shut down holds no adapter
        cast(Any, session.engine).unpin_adapter(PINNED_ADAPTER)
