"""Evaluation: run the agent once per validation task and summarise the rewards; with rollouts that run on
through the update, an evaluation that runs beside training on the evaluated step's pinned adapter; and a
run's evaluations (`RunEvaluations`), recorded, the best one's adapter kept."""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from lightning_sdk.rollouts.in_process import Rollout
from lightning_sdk.training.group_rewards import GroupReward, group_reward_metrics
from lightning_sdk.training.judge_agreement import judge_agreement, near_chance
from lightning_sdk.training.run.adapters import copy_adapter
from lightning_sdk.training.run.best_adapter import (
    BEST_ADAPTER_DIR,
    SCORE_KEY,
    BestAdapter,
    is_better,
    write_best,
)

if TYPE_CHECKING:
    from lightning_sdk.training.overlapped import OverlappedRollouts
    from lightning_sdk.training.records.metrics import EvaluationProgress
    from lightning_sdk.training.run.session import TrainingSession
    from lightning_sdk.training.step_rollouts import StepByStepRollouts

log = logging.getLogger("lightning_sdk.training")

__all__ = [
    "EVALUATED_ADAPTER_DIR",
    "PINNED_ADAPTER",
    "EvaluationBeside",
    "RunEvaluations",
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
    without_lane: int = 0
    """The count of calls that named no lane when it began (`SamplingPolicy.calls_without_lane`)."""
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
    if not callable(getattr(engine, "pin_adapter", None)):
        kind = type(engine).__name__
        return f"the engine cannot keep an evaluated step's adapter beside the newer ones ({kind})"
    if getattr(engine, "max_adapters", 0) < 2:
        if getattr(engine, "weight_sync", None) == "merge":
            return (
                "the engine merges each adapter into its weights and has no place to pin the evaluated one "
                "beside them (engine_options={'max_adapters': 2} gives one; on a CPU it made runs no "
                "shorter, see docs/trainer.md)"
            )
        return "the engine has no place for a second adapter (max_adapters=1; the trainer starts it with 2)"
    rank = 2 * session.config.lora_rank  # merged weights: the pin is the difference of two adapters
    if getattr(engine, "weight_sync", None) == "merge" and rank > getattr(engine, "max_lora_rank", 0):
        return (
            f"beside merged weights the evaluated adapter is pinned as a difference of rank {rank}, above "
            f"the engine's max_lora_rank={engine.max_lora_rank} (engine_options: at least {rank})"
        )
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
    from lightning_sdk.rollouts.in_process import UpdatePauses

    engine: Any = session.engine
    folder = session.save_adapter_to(session.run_dir / EVALUATED_ADAPTER_DIR)
    without_lane = session.sampling.calls_without_lane
    engine.pin_adapter(PINNED_ADAPTER, folder, version=step)
    try:  # whatever fails before it runs (Ctrl+C included), nothing stays pinned
        session.sampling.lanes["eval"].answer_with(PINNED_ADAPTER)
        progress = session.evaluation_progress(step, len(tasks), live=False)
        gate = getattr(engine, "gate", None)
        pauses = UpdatePauses(gate.closed_seconds) if gate is not None else None  # updates hold its calls
        rollouts = session.in_process_rollouts(agent, tasks, 1, reward, progress.episode_done, "eval", pauses)
        future = session.loop.submit(rollouts)
    except BaseException:
        _release(session)
        raise
    running = EvaluationBeside(step, future, folder, progress, time.perf_counter(), without_lane)
    future.add_done_callback(lambda _: setattr(running, "ended", time.perf_counter()))
    return running


def end_evaluation_beside(
    session: TrainingSession, running: EvaluationBeside
) -> tuple[dict[str, float], list[Rollout]]:
    """Wait for `running` to end, release its pinned adapter, and return its metrics (with
    `calls_without_lane`, model calls meanwhile that named no lane) and rollouts."""
    try:
        rollouts = running.future.result()
    finally:
        release_evaluation_beside(session, running)
    metrics = summarize_rollouts(rollouts, session.config.success_threshold)
    metrics["calls_without_lane"] = float(session.sampling.calls_without_lane - running.without_lane)
    return metrics, rollouts


def release_evaluation_beside(session: TrainingSession, running: EvaluationBeside) -> None:
    """Cancel `running` if it still runs (an error, Ctrl+C), send evaluation calls to the served adapter
    again and unpin the evaluated one."""
    running.future.cancel()
    _release(session)


def _release(session: TrainingSession) -> None:
    session.sampling.lanes["eval"].answer_with(None)
    with contextlib.suppress(Exception):  # an engine already shut down holds no adapter
        cast(Any, session.engine).unpin_adapter(PINNED_ADAPTER)


# -- a run's evaluations -------------------------------------------------------------------------------------
class RunEvaluations:
    """A run's evaluations on its validation tasks: each run now or beside training, then shown, stored,
    logged, and its adapter kept when it scored best (`keep_best`).

    Args:
        rollouts: where the run's groups come from (`StepByStepRollouts` or `OverlappedRollouts`): an
            evaluation run now runs in their `evaluation_phase`, one beside training while they run.
        judge: the training reward, when a true held-out reward (`val_reward`) is given beside it.
        best: the best evaluation so far (a resumed run's `best.json`).
    """

    def __init__(
        self,
        session: TrainingSession,
        agent: Callable[..., Any] | None,
        tasks: list[Any],
        reward: Callable[[Any, Any], float] | None,
        rollouts: StepByStepRollouts | OverlappedRollouts,
        judge: Callable[[Any, Any], float] | None,
        group_reward: GroupReward | None,
        best: BestAdapter | None,
    ) -> None:
        self.session, self.agent, self.tasks, self.reward = session, agent, tasks, reward
        self.rollouts, self.judge, self.group_reward, self.best = rollouts, judge, group_reward, best
        self.running: EvaluationBeside | None = None
        """The evaluation running beside training, if one is."""
        self.beside_refused = self._why_evaluations_wait()

    def _why_evaluations_wait(self) -> str | None:
        """Why evaluations between steps cannot run beside training (None: they can, or no update waits
        for them: `max_staleness=0`); said once at the start unless the user turned them off."""
        config = self.session.config
        if not config.max_staleness:
            return "max_staleness=0"
        if not config.eval_beside_training:
            return "eval_beside_training=False"
        reason = why_not_beside(self.session, self.judge is not None or self.group_reward is not None)
        if reason is not None:
            log.info("Each evaluation makes the next update wait for it: %s.", reason)
        return reason

    def evaluate(self, step: int, final: bool = False) -> dict[str, float] | None:
        """Evaluate the weights of `step`: beside training when it can (the metrics then come when it ends,
        and this returns None), else now. Evaluations run one at a time, so one still running beside
        training is waited for first; the `final` one always runs now."""
        self.wait()
        session = self.session
        tasks = session.my_share(self.tasks)
        if not final and self.beside_refused is None and getattr(self.rollouts, "running", False):
            assert self.agent is not None  # runners refuse evaluations beside training (`why_not_beside`)
            self.running = start_evaluation_beside(session, step, self.agent, tasks, self.reward)
            return None
        progress = session.evaluation_progress(step, len(tasks))
        started = time.perf_counter()
        with self.rollouts.evaluation_phase() as timing:
            metrics, rollouts = evaluate_agent(
                session, self.agent, self.tasks, self.reward, progress.episode_done
            )
        # The evaluation's own time, less any wait for groups in flight to finish first (with runners).
        timing["time_eval_s"] = time.perf_counter() - started - timing.get("time_eval_wait_s", 0.0)
        return self.record(step, metrics, rollouts, timing, progress)

    def record_if_ended(self) -> None:
        """Record the evaluation that ran beside training if it has ended (between steps)."""
        if self.running is not None and self.running.done:
            self.wait()

    def wait(self) -> None:
        """Wait for the evaluation running beside training, if one is, and record it."""
        running, self.running = self.running, None
        if running is None:
            return
        metrics, rollouts = end_evaluation_beside(self.session, running)
        without_lane = metrics.pop("calls_without_lane")
        ended = running.ended if running.ended is not None else time.perf_counter()
        timing = {"time_eval_s": ended - running.started, "eval_beside_training": 1.0}
        if without_lane:
            timing["eval_calls_without_lane"] = without_lane
            self._stop_evaluating_beside(running.step, int(without_lane))
        self.record(running.step, metrics, rollouts, timing, running.progress, running.adapter)

    def _stop_evaluating_beside(self, step: int, calls: int) -> None:
        """Calls that named no lane came while an evaluation ran beside training: the agent calls the
        endpoint with HTTP code of its own, whose calls cannot be told apart, so they were answered as the
        training rollouts' (newest weights, training temperature). Say so; later evaluations wait."""
        self.beside_refused = "the agent's own HTTP calls name no lane"
        log.warning(
            "While step %d was evaluated beside training, %d model call(s) named no lane (an agent that "
            "calls the endpoint with HTTP code of its own, not the openai or anthropic client): they were "
            "answered by the newest weights at the training temperature, so that evaluation's reward may "
            "not be step %d's alone. Later evaluations make the next update wait for them.",
            step,
            calls,
            step,
        )

    def drop_running(self) -> None:
        """Cancel the evaluation running beside training, if one is (an error, Ctrl+C): it is not recorded."""
        running, self.running = self.running, None
        if running is not None:
            release_evaluation_beside(self.session, running)

    def record(
        self,
        step: int,
        metrics: dict[str, float],
        rollouts: list[Rollout],
        timing: dict[str, float],
        progress: EvaluationProgress,
        evaluated_adapter: Path | None = None,
    ) -> dict[str, float]:
        """Show, store and log an evaluation of `step`'s weights, and keep its adapter when it is the best
        so far: from the policy, or from `evaluated_adapter` (saved when an evaluation beside training
        began; the policy has moved on since)."""
        session = self.session
        progress.finish(metrics)
        session.keep_evaluation(step, rollouts)
        if self.judge is not None:
            metrics = self._with_judge_agreement(step, metrics, rollouts, self.judge)
        record = {**{f"val_{key}": value for key, value in metrics.items()}, **timing}
        if session.config.keep_best and is_better(metrics, self.best):
            self.best = best = BestAdapter(step=step, score=float(metrics[SCORE_KEY]), metrics=dict(metrics))
            folder, keep = session.run_dir / BEST_ADAPTER_DIR, lambda staging: write_best(staging, best)
            if evaluated_adapter is None:
                session.save_adapter_to(folder, beside=keep)
            elif session.distributed.is_main:
                copy_adapter(evaluated_adapter, folder, keep)
            record["best_step"] = step
            log.info(
                "Step %d: best validation reward so far, %.4f; adapter kept in %s", step, best.score, folder
            )
        session.log(step, record)
        return metrics

    def _with_judge_agreement(
        self,
        step: int,
        metrics: dict[str, float],
        rollouts: list[Rollout],
        judge: Callable[[Any, Any], float],
    ) -> dict[str, float]:
        """`metrics` with how often the training reward orders the held-out episodes as `val_reward` does."""
        agreement = judge_agreement(rollouts, judge)
        metrics = {**metrics, **self.session.distributed.mean_metrics(agreement, weight_key="judge_pairs")}
        # What scoring the held-out episodes cost the judge belongs to this evaluation, not to the next
        # step's judge metrics.
        metrics.update(group_reward_metrics(self.group_reward))
        warning = near_chance(metrics)
        if warning is not None:
            log.warning("Step %d: %s", step, warning)
        return metrics
