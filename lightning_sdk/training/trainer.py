"""`Trainer.fit`: rollouts on the co-located engine alternate with LoRA GRPO steps on the same machine.

One step (docs/training.md describes each stage): the agent runs every task of the batch `group_size`
times against the embedded endpoint; the engine sleeps; the episodes become samples (credit assignment,
group-relative advantages, masks); the adapter takes a step; the new weights reach the engine before the
next rollout.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_sdk.tracing.episode import Episode
from lightning_sdk.training.algorithm.diagnostics import StepDiagnostics
from lightning_sdk.training.algorithm.prepare import (
    PreparedGroup,
    prepare_group,
    samples_from_groups,
)
from lightning_sdk.training.algorithm.signal import SignalWatch, signal_counts
from lightning_sdk.training.algorithm.staleness import stamp_sample_staleness
from lightning_sdk.training.config import TrainerConfig
from lightning_sdk.training.data import TaskCursor, group_tasks, materialize_tasks
from lightning_sdk.training.evaluation import RunEvaluations
from lightning_sdk.training.fit_result import FitResult
from lightning_sdk.training.group_rewards import (
    GroupReward,
    apply_group_reward,
    group_reward_metrics,
    one_at_a_time,
)
from lightning_sdk.training.overlapped import OverlappedRollouts, check_overlap_possible
from lightning_sdk.training.records.live_view import live_view
from lightning_sdk.training.records.run_dir import make_run_dir, refuse_earlier_run, write_run_info
from lightning_sdk.training.records.run_warnings_file import keep_warnings
from lightning_sdk.training.run.best_adapter import BEST_ADAPTER_DIR, read_best
from lightning_sdk.training.run.group_runs import group_run
from lightning_sdk.training.run.session import TrainingSession
from lightning_sdk.training.run.startup import seed_everything
from lightning_sdk.training.step_rollouts import StepByStepRollouts, groups_to_train, rollout_metrics

if TYPE_CHECKING:
    from lightning_sdk.engine.types import Engine
    from lightning_sdk.tracing.store import EpisodeStore
    from lightning_sdk.training.sft import SFTResult

__all__ = ["FitResult", "Trainer"]

log = logging.getLogger("lightning_sdk.training")


class Trainer:
    """Trains an agent's model with GRPO on its own tasks, on one machine.

    Example::

        trainer = ls.Trainer(config=ls.TrainerConfig(group_size=8, batch_size=4, max_steps=50))
        result = trainer.fit(agent, train_tasks, val_dataset=test_tasks)
        print(result.final_eval, result.adapter_path)

    Args:
        model: `None` for the bundled SmolLM2-135M-Instruct, a local Hugging Face folder or a Hub id.
        config: the training configuration (defaults suit the bundled model on a CPU).
        engine: `"auto"` (vLLM when installed, else transformers), `"vllm"`, `"transformers"`, or an
            `Engine` you built (it is used as is and not shut down; its weights are left as trained).
        engine_options: extra keyword arguments for the engine (e.g. `max_model_len`).
    """

    def __init__(
        self,
        model: str | Path | None = None,
        config: TrainerConfig | None = None,
        *,
        engine: str | Engine = "auto",
        engine_options: dict[str, Any] | None = None,
    ) -> None:
        if config is not None and not isinstance(config, TrainerConfig):
            raise TypeError(f"config must be a TrainerConfig, got {type(config).__name__}.")
        self.model = model
        self.config = config or TrainerConfig()
        self.engine_kind = engine
        self.engine_options = dict(engine_options or {})
        self.session: TrainingSession | None = None

    def fit(
        self,
        agent: Callable[..., Any] | None,
        train_dataset: object,
        val_dataset: object = None,
        reward: Callable[[Any, Any], float] | None = None,
        resume: bool = False,
        group_reward: GroupReward | None = None,
        val_reward: Callable[[Any, Any], float] | None = None,
    ) -> FitResult:
        """Train `agent` on `train_dataset`; see the class docstring.

        Args:
            agent: the user's agent, called as `agent(task)` (plus `llm=LLMEndpoint` when its signature
                declares `llm`). Usually decorated with `@trace_agent`; an undecorated one is traced here.
                With `TrainerConfig(runners=...)` it runs in runner processes (then it may be None when the
                runners know it: `Runners(agent=...)`, or runners you start yourself).
            train_dataset: a sequence or iterable of tasks, or a `datasets.Dataset`.
            val_dataset: tasks evaluated at the start, every `eval_every` steps and at the end.
            reward: `fn(task, output) -> float` for episodes that recorded no reward themselves.
            resume: continue from the newest checkpoint in `config.run_dir` (same step numbering).
            group_reward: `fn(task, outputs) -> rewards` scoring a task's group of episodes together, such
                as `ls.Judge(rubric, model=...)` when there is no reward function
                (`lightning_sdk.training.group_rewards`); held-out episodes are scored one at a time.
            val_reward: `fn(task, output) -> float` for held-out episodes that recorded no reward
                themselves (default: `reward`, else the group reward one attempt at a time). Useful when
                training is judged but a small labelled held-out set can be scored exactly.
        """
        if agent is None and self.config.runners is None:
            raise TypeError("agent must be your @trace_agent function (None only with runners configured).")
        if agent is not None and not callable(agent):
            raise TypeError(
                f"agent must be callable (your @trace_agent function), got {type(agent).__name__}."
            )
        if reward is not None and not callable(reward):
            raise TypeError("reward must be a function fn(task, output) -> float, or None.")
        if group_reward is not None and not callable(group_reward):
            raise TypeError("group_reward must be a function fn(task, outputs) -> rewards, such as ls.Judge.")
        if val_reward is not None and not callable(val_reward):
            raise TypeError("val_reward must be a function fn(task, output) -> float.")
        config = self.config
        tasks = materialize_tasks(train_dataset, "train_dataset")
        val_tasks = materialize_tasks(val_dataset, "val_dataset") if val_dataset is not None else None
        if config.balance_by is not None:
            group_tasks(tasks, config.balance_by)  # a task without the key fails here, before the model loads
        if resume and config.run_dir is None:
            raise ValueError("resume=True needs TrainerConfig(run_dir=...) naming the run to continue.")
        if not resume:
            refuse_earlier_run(config.run_dir)  # before anything loads or writes there
        run_dir = make_run_dir(config.run_dir)
        seed_everything(config.seed)
        # Evaluations that may run beside training (`why_not_beside`): held-out tasks, scored without a judge.
        judged = group_reward is not None or (
            reward is not None and val_reward is not None and val_reward is not reward
        )
        evaluates = bool(val_tasks) and not judged
        # The session owns what its start opened: a start that fails releases it all itself, and a run
        # that ends in any way releases it here.
        with (
            live_view(run_dir, config.explorer),  # its address first: the page follows the run from the start
            keep_warnings(run_dir),  # run_dir/warnings.jsonl: what the run warned about, for later reading
            TrainingSession.start(
                self.model, config, run_dir, self.engine_kind, self.engine_options, evaluates=evaluates
            ) as session,
        ):
            self.session = session
            try:
                loop = _Loop(session, agent, tasks, val_tasks, reward, resume, group_reward, val_reward)
                return loop.run()
            finally:
                self.session = None

    def fit_sft(
        self,
        episodes: Iterable[Episode] | EpisodeStore,
        *,
        min_reward: float | None = None,
        epochs: int = 1,
    ) -> SFTResult:
        """A supervised warm start: train the LoRA adapter on the replies of chosen episodes (those at or
        above `min_reward`, or all), then start GRPO from it with `TrainerConfig(init_adapter=...)` set
        to the returned `adapter_path`. See `lightning_sdk.training.sft`."""
        from lightning_sdk.training.sft import fit_sft

        return fit_sft(self.model, self.config, episodes, min_reward=min_reward, epochs=epochs)

    def export_merged(self, path: str | Path, adapter: str | Path | None = None) -> Path:
        """Write a standalone model folder (base weights with the adapter merged) loadable without peft.

        Args:
            path: the folder to write.
            adapter: the adapter to merge; default: the run's result in `config.run_dir`, which is the kept
                best adapter (`run_dir/best_adapter`, the best held-out score, `keep_best`) where the run
                kept one, else the last adapter (`run_dir/adapter`), else the newest checkpoint's. A log
                line says which one was exported; pass `adapter=run_dir / "adapter"` for the last one. A
                folder that is not whole (a truncated file) is passed over, or refused when named here. A
                folder of role adapters (`TrainerConfig(roles=...)`) gives one merged model per role, in
                `path/<role>`.
        """
        from lightning_sdk.training.update.folders.export import export_merged_model_folder

        return export_merged_model_folder(self.model, self.config, path, adapter)


class _Loop:
    """The body of `fit`: a small object so that each phase is a short method."""

    def __init__(
        self,
        session: TrainingSession,
        agent: Callable[..., Any] | None,
        tasks: list[Any],
        val_tasks: list[Any] | None,
        reward: Callable[[Any, Any], float] | None,
        resume: bool,
        group_reward: GroupReward | None = None,
        val_reward: Callable[[Any, Any], float] | None = None,
    ) -> None:
        self.session, self.agent, self.val_tasks, self.reward = (
            session,
            session.traced(agent),
            val_tasks,
            reward,
        )
        self.group_reward = group_reward
        self.val_reward = val_reward or reward
        if self.val_reward is None and group_reward is not None:
            self.val_reward = one_at_a_time(group_reward)
        # With a true held-out reward beside a different training reward (a judge), how far they agree.
        training_reward = reward or (one_at_a_time(group_reward) if group_reward is not None else None)
        self.judge = training_reward if val_reward is not None and training_reward is not val_reward else None
        session.use_runners(agent)
        config = session.config
        self.config = config
        self.cursor = TaskCursor(
            tasks,
            config.batch_size * session.world_size,
            config.shuffle,
            config.seed,
            balance_by=config.balance_by,
        )
        self.start_step = session.restore(self.cursor) if resume else 0
        if self.start_step == 0 and config.init_adapter is not None:
            session.push_weights(0)  # the engine answers with the starting adapter from the first evaluation
        self.result = FitResult(run_dir=session.run_dir, adapter_path=session.adapter_dir)
        self.diagnostics = StepDiagnostics(session.endpoint.base_url)
        self.signal = SignalWatch()
        if config.dynamic_sampling_rounds and session.world_size > 1:
            raise ValueError(
                "dynamic_sampling_rounds is not supported under torchrun yet (each rank would draw a "
                "different number of extra tasks); set it to 0 or train in one process."
            )
        # Where each step's groups come from; the loop below is the same for both.
        self.overlapped: OverlappedRollouts | None = None
        self.rollouts: OverlappedRollouts | StepByStepRollouts
        if config.max_staleness:  # rollouts that run on through the update
            check_overlap_possible(session)
            run_group = group_run(session, self.agent, self.reward)
            self.rollouts = self.overlapped = OverlappedRollouts(
                session, self.cursor, run_group, self.prepare_task
            )
        else:
            self.rollouts = StepByStepRollouts(
                session, self.cursor, self.agent, self.reward, self.prepare_task
            )
        self.evaluations = (
            RunEvaluations(
                session,
                self.agent,
                val_tasks,
                self.val_reward,
                self.rollouts,
                self.judge,
                group_reward,
                read_best(session.run_dir) if resume and self.start_step > 0 else None,
            )
            if val_tasks
            else None
        )

    def run(self) -> FitResult:
        session, config = self.session, self.config
        write_run_info(session.run_dir, config, self.start_step, session.describe())
        if self.start_step == 0:
            self.result.initial_eval = self.evaluate(step=0)
        progress = session.progress(self.start_step)
        started, last_step = time.perf_counter(), self.start_step
        if self.start_step < config.max_steps:  # (a finished run resumed only evaluates)
            self.rollouts.start()
        try:
            for step in range(self.start_step + 1, config.max_steps + 1):
                record = self.train_step(step)
                progress.update(step, record)
                if self.evaluations is not None:
                    self.evaluations.record_if_ended()  # one that ran beside the step
                last_step = step
                if step == config.max_steps or self.out_of_time(started):
                    break  # the final checkpoint and evaluation below cover this step
                if config.save_every and step % config.save_every == 0:
                    session.save_checkpoint(step, self.rollouts.cursor_with_held_tasks())
                if config.eval_every and step % config.eval_every == 0:
                    self.evaluate(step)
            progress.close()
            if last_step > self.start_step:
                session.save_checkpoint(last_step, self.rollouts.cursor_with_held_tasks())
            # With max_staleness, beside the groups still running: they end meanwhile, untrained.
            self.result.final_eval = self.evaluate(last_step, final=True)
        finally:  # groups still held (max_staleness) are not trained: their tasks go back to the cursor
            if self.evaluations is not None:  # an error or Ctrl+C: one running beside training is dropped
                self.evaluations.drop_running()
            self.rollouts.stop(finish_running=sys.exc_info()[0] is None)
        self.result.last_adapter_path = session.save_final_adapter()
        self.hand_back_best(last_step)
        self.result.history = session.metrics.history if session.metrics is not None else []  # rank 0 only
        return self.result

    def out_of_time(self, started: float) -> bool:
        """Whether the time budget is used up, decided by all ranks together: each rank reads its own
        clock, and under torchrun a rank that stopped a step before the others would leave them waiting in
        the next step's collectives (`Distributed.any_rank`). Every rank has the same config, so without a
        budget none of them takes part in the vote."""
        if self.config.max_time_s is None:
            return False
        return self.session.distributed.any_rank(_out_of_time(started, self.config.max_time_s))

    def train_step(self, step: int) -> dict[str, Any]:
        """Roll out (or, with `max_staleness`, take from the groups in flight) and prepare the step's
        groups, train on the samples of those with a signal, push the new weights, and log the step."""
        session, config = self.session, self.config
        started, gate_before = time.perf_counter(), session.gate_counts()
        rolled = self.rollouts.collect(step)
        rollout_s = time.perf_counter() - started
        for problem in self.diagnostics.new_problems([group.episodes for group in rolled.groups]):
            log.warning("Step %d: %s", step, problem)
        # Dynamic sampling runs in one process only (see `__init__`): the batch is this process's.
        trained = (
            groups_to_train(rolled.groups, config.batch_size)
            if config.dynamic_sampling_rounds
            else rolled.groups
        )
        with self.rollouts.update_window(last=step == config.max_steps):
            prepared = samples_from_groups(trained, config)
            if self.overlapped is not None:  # samples may be older than the weights the step updates
                stamp_sample_staleness(prepared.samples, trained, current_version=step - 1)
            stats = session.train(prepared)
            session.warnings.policy_gap(
                step, stats, getattr(session.engine, "dtype", None), session.policy_dtype
            )
            stats.update(rollout_metrics(rolled))
            stats.update(signal_counts(rolled.groups, config.success_threshold))
            low_signal = self.signal.warning(step, stats)
            if low_signal is not None:
                log.warning("Step %d: %s", step, low_signal)
            stats.update(group_reward_metrics(self.group_reward))
            stats.update(session.push_weights(step))
        if self.overlapped is not None:
            stats["groups_in_flight"] = self.overlapped.running_at_update
        stats["time_rollout_s"] = rollout_s
        stats["time_step_s"] = time.perf_counter() - started
        gate_after = session.gate_counts()
        if gate_before is not None and gate_after is not None:  # how busy the engine was, calls held
            stats["engine_busy_share"] = (gate_after[0] - gate_before[0]) / stats["time_step_s"]
            stats["calls_held"] = gate_after[1] - gate_before[1]
        stats.update(session.keep_episodes(step, rolled.rollouts))
        return session.log(step, stats)

    def prepare_task(self, task: Any, episodes: list[Episode]) -> PreparedGroup:
        """The group reward (when there is one), error policy, call selection, credit and advantages of
        one task's group: once per group and step."""
        if self.group_reward is not None:
            apply_group_reward(self.group_reward, task, episodes)
        return prepare_group(episodes, self.config, endpoint_base_url=self.session.endpoint.base_url)

    def evaluate(self, step: int, final: bool = False) -> dict[str, float] | None:
        """Evaluate the weights of `step` (see `RunEvaluations.evaluate`)."""
        return self.evaluations.evaluate(step, final) if self.evaluations is not None else None

    def hand_back_best(self, last_step: int) -> None:
        """Make the best evaluated adapter the run's result (`keep_best`); say so when it is not the last."""
        best = self.evaluations.best if self.evaluations is not None else None
        if not self.config.keep_best or best is None:
            return
        self.result.adapter_path = self.session.run_dir / BEST_ADAPTER_DIR
        self.result.best_step, self.result.best_eval = best.step, best.metrics
        if best.step == 0 and last_step > 0:
            log.warning(
                "No evaluation beat the starting adapter (validation reward %.4f): the run's result is the "
                "adapter it started from, in %s; the last one is in %s.",
                best.score,
                self.result.adapter_path,
                self.result.last_adapter_path,
            )
        elif best.step != last_step:
            log.warning(
                "The best validation reward, %.4f, was at step %d, not at the last step (%d): the run's "
                "result is that step's adapter, in %s; the last one is in %s (keep_best=False returns it).",
                best.score,
                best.step,
                last_step,
                self.result.adapter_path,
                self.result.last_adapter_path,
            )


def _out_of_time(started: float, budget_s: float | None) -> bool:
    return budget_s is not None and time.perf_counter() - started >= budget_s
