"""`TrainingSession`: everything one training run holds (engine, endpoint, policy model, optimizer,
metrics) and the phase switches between rollout, training and weight sync.

The loop in `trainer.py` reads as a list of stages because the stateful parts live here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self, TypeVar

from lightning_sdk.rollouts.in_process import Rollout, UpdatePauses
from lightning_sdk.serving.options import SamplingPolicy
from lightning_sdk.tracing.decorators import trace_agent
from lightning_sdk.tracing.routing import Lane, Roles, Router
from lightning_sdk.training.config import TrainerConfig
from lightning_sdk.training.data import TaskCursor
from lightning_sdk.training.records.run_episodes import RunEpisodes
from lightning_sdk.training.run.adapters import load_into_engine, write_adapter
from lightning_sdk.training.run.checkpoints import load_run_checkpoint, save_run_checkpoint
from lightning_sdk.training.run.environment import environment
from lightning_sdk.training.run.event_loop import RunLoop
from lightning_sdk.training.run.run_warnings import RunWarnings
from lightning_sdk.training.run.startup import open_metrics, open_parts
from lightning_sdk.training.update.distributed import Distributed
from lightning_sdk.training.update.memory_report import say_step_memory_used

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from lightning_sdk.engine.placement import Placement
    from lightning_sdk.engine.types import Engine
    from lightning_sdk.rollouts.queue import RolloutQueue
    from lightning_sdk.rollouts.remote import RemoteRollouts
    from lightning_sdk.serving.endpoint import LLMEndpoint
    from lightning_sdk.serving.server import ServerHandle
    from lightning_sdk.training.algorithm.prepare import PreparedBatch
    from lightning_sdk.training.records.metrics import EvaluationProgress, MetricsWriter, ProgressBar
    from lightning_sdk.training.update.distributed import PolicyModel

__all__ = ["TrainingSession"]

log = logging.getLogger("lightning_sdk.training")
T = TypeVar("T")


@dataclass
class TrainingSession:
    """The live parts of a run. Build with `TrainingSession.start(...)`; `close()` releases them."""

    config: TrainerConfig
    run_dir: Path
    server: ServerHandle
    policy_model: PolicyModel
    """The LoRA model (a `peft.PeftModel`; under torchrun wrapped in `DistributedDataParallel`)."""
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    tokenizer: PreTrainedTokenizerBase
    """The engine's Hugging Face tokenizer (slow or fast: transformers gives them no common type)."""
    metrics: MetricsWriter | None
    episodes: RunEpisodes | None
    """The run's training and validation episode files (rank 0; None on other ranks)."""
    sampling: SamplingPolicy
    distributed: Distributed
    owns_engine: bool = True
    """False for an engine the caller passed in: `close()` leaves it awake and running."""
    queue: RolloutQueue | None = None
    """The runner protocol's queue, when `config.runners` is set."""
    router: Router | None = None
    """Sends the agent's model calls to the endpoint during rollouts (`config.routes`); set by `start`."""
    remote: RemoteRollouts | None = None
    """Rollouts on runners (set by `use_runners`); None: rollouts in this process."""
    loop: RunLoop = field(default_factory=RunLoop)
    """The event loop every rollout and evaluation of the run runs on."""
    warnings: RunWarnings = field(default_factory=RunWarnings)
    """What the run has warned about already (each warning is given once)."""
    roles: Roles | None = None
    """The roles with adapters of their own (`config.roles`); None: one adapter."""
    changed_roles: list[str] | None = None
    """The role adapters the last update changed (None: all of them, as after a resume)."""
    placement: Placement | None = None
    """This rank's device, dtype and executor (`plan_placement`), as the run started."""
    _said_memory_used: bool = False
    """Whether the first trained step's memory line was logged (`say_step_memory_used`)."""
    _opened: ExitStack = field(default_factory=ExitStack, repr=False)
    """What the run opened (process group, engine, server, loop, files, runners), closed in reverse order by
    `close`."""

    @classmethod
    def start(
        cls,
        model: str | Path | None,
        config: TrainerConfig,
        run_dir: Path,
        engine_kind: str | Engine,
        engine_options: dict[str, Any],
        evaluates: bool = True,
    ) -> TrainingSession:
        """Start the engine and its endpoint, and build the LoRA policy, optimizer and metrics writer
        (`evaluates`: the run has held-out tasks)."""
        # Whoever opens, closes: each part goes to `opened` as it comes up, so a start that fails part-way
        # (a bad init_adapter, a model that does not load) releases what it had started, in reverse order;
        # on success the session owns all of it (`close`).
        with ExitStack() as opened:
            parts = open_parts(model, config, run_dir, engine_kind, engine_options, opened, evaluates)
            session = cls(**parts)
            session._opened = opened.pop_all()
        return session

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- identity -------------------------------------------------------------------------------------
    @property
    def engine(self) -> Engine:
        return self.server.engine

    @property
    def endpoint(self) -> LLMEndpoint:
        """The `LLMEndpoint` agents call during rollouts."""
        return self.server.endpoint

    @property
    def world_size(self) -> int:
        return self.distributed.world_size

    @property
    def vocabulary_size(self) -> int:
        """Rows of the policy's embedding table: the token ids it can train on."""
        return int(self.distributed.unwrap(self.policy_model).get_input_embeddings().num_embeddings)

    @property
    def adapter_dir(self) -> Path:
        """Where the newest adapter is written after every step (and the final adapter at the end)."""
        return self.run_dir / "adapter"

    @property
    def policy_dtype(self) -> str:
        """The dtype the policy's base weights compute in (e.g. `"float32"`)."""
        return str(next(self.policy_model.parameters()).dtype).removeprefix("torch.")

    def describe(self) -> dict[str, Any]:
        """Facts about the run for `run.json`."""
        engine = self.engine
        return {
            "model": engine.model.name,
            "model_path": str(engine.model.path),
            "engine": type(engine).__name__,
            "engine_dtype": getattr(engine, "dtype", None),
            "policy_dtype": self.policy_dtype,
            "weight_sync": getattr(engine, "weight_sync", None),
            "world_size": self.world_size,
            "endpoint": self.endpoint.base_url,
        }

    def traced(self, agent: Callable[..., Any] | None) -> Callable[..., Any] | None:
        """The agent itself when it is a `@trace_agent` function, else the agent wrapped in one."""
        if agent is None or getattr(agent, "__lightning_sdk_agent__", None) is not None:
            return agent
        log.info("the agent is not decorated with @trace_agent; tracing it for training")
        return trace_agent(agent)

    def my_share(self, tasks: list[Any]) -> list[Any]:
        """This process's tasks of the step's batch (all of them without torchrun)."""
        return self.distributed.shard(tasks)

    def use_runners(self, agent: Callable[..., Any] | None) -> None:
        """Send rollouts to runners (when `config.runners` is set): write the key file, start the configured
        runner processes and say how to start more."""
        if self.config.runners is None or self.queue is None:
            return
        from lightning_sdk.rollouts.remote import start_runners

        runners, timeout_s = self.config.runners, self.config.episode_timeout_s
        self.remote = start_runners(runners, timeout_s, self.endpoint, self.queue, agent, self.run_dir)
        self._opened.callback(self.remote.close)

    def rollouts(
        self,
        agent: Callable[..., Any] | None,
        tasks: list[Any],
        group_size: int,
        reward: Callable[[Any, Any], float] | None,
        on_finished: Callable[[Rollout], None] | None = None,
        lane: Lane = "train",
    ) -> list[Rollout]:
        """Run the agent `group_size` times on each task, here or on runners; one `Rollout` per run. Calls
        of in-process agents name `lane`, whose sampling the endpoint applies (`sampling_lanes`)."""
        if self.remote is not None:
            from lightning_sdk.training.run.runner_episodes import fail_unknown_tokens

            rolled = self.remote.run(tasks, group_size, self.engine.weight_version, reward, on_finished)
            fail_unknown_tokens(rolled, self.vocabulary_size)  # ids the forward pass would fail on
            return rolled
        if agent is None:
            raise ValueError("fit(agent=None) needs TrainerConfig(runners=Runners(...)): it runs the agent.")
        rollouts = self.run_async(
            self.in_process_rollouts(agent, tasks, group_size, reward, on_finished, lane)
        )
        self.warnings.unused_routes(self.config.routes, self.router)
        return rollouts

    def in_process_rollouts(
        self,
        agent: Callable[..., Any],
        tasks: list[Any],
        group_size: int,
        reward: Callable[[Any, Any], float] | None,
        on_finished: Callable[[Rollout], None] | None,
        lane: Lane,
        pauses: UpdatePauses | None = None,
    ) -> Coroutine[Any, Any, list[Rollout]]:
        """The coroutine that runs `agent` here, `group_size` times per task, its calls in `lane`; for the
        run's loop (`run_async`, or `loop.submit` for one that runs beside training). `pauses`: the time
        updates held its calls, which episode limits do not count."""
        from lightning_sdk.rollouts.in_process import run_rollouts

        config, router = self.config, self.router
        return run_rollouts(
            agent,
            tasks,
            group_size,
            llm=self.endpoint,
            max_concurrency=config.max_concurrency,
            timeout_s=config.episode_timeout_s,
            reward_fn=reward,
            on_finished=on_finished,
            router=router.in_lane(lane) if router is not None else None,
            pauses=pauses,
        )

    # --- phases ---------------------------------------------------------------------------------------
    @contextmanager
    def rollout_phase(self) -> Iterator[None]:
        """Engine awake, sampling at the training temperature, default openai clients pointed at it."""
        with self._phase("train"):
            yield

    @contextmanager
    def eval_phase(self) -> Iterator[None]:
        """Engine awake, greedy decoding when `eval_greedy` (else the training temperature)."""
        with self._phase("eval"):
            yield

    def sample_as(self, lane: Lane) -> None:
        """Sample the calls that name no lane (agents calling the endpoint without the openai or anthropic
        client, runners) as `lane`'s; calls that name one keep their lane's sampling."""
        self.sampling.use_lane(lane)

    @contextmanager
    def _phase(self, lane: Lane) -> Iterator[None]:
        """The engine awake, sampling as `lane`, default openai clients pointed at it; asleep again after."""
        self.sample_as(lane)
        self.engine.wake()
        try:
            with environment(self.endpoint.env):
                yield
        finally:
            self.engine.sleep()

    def run_async(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine to completion on the run's one event loop (see `RunLoop`)."""
        return self.loop.run(coroutine)

    def on_close(self, release: Callable[[], object]) -> None:
        """Release something the run opened when the session closes (newest first)."""
        self._opened.callback(release)

    def gate_counts(self) -> tuple[float, int] | None:
        """Seconds so far the engine had model calls in flight, and calls held at its gate during updates
        (`RequestGate`); None for an engine without a gate."""
        gate = getattr(self.engine, "gate", None)
        return (gate.busy_seconds(), gate.held_total) if gate is not None else None

    # --- training -------------------------------------------------------------------------------------
    def train(self, prepared: PreparedBatch) -> dict[str, Any]:
        """One GRPO update of the adapter on the step's samples; returns their metrics and the update's."""
        from lightning_sdk.training.update.step import train_on_samples

        started = time.perf_counter()
        self.warnings.samples_too_long(
            int(prepared.metrics["samples_dropped_too_long"]), self.config.max_sample_tokens
        )
        self.warnings.few_step_groups(prepared.metrics)
        samples = self.distributed.balance(prepared.samples, self.config.mini_batches_per_step)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        if self.roles is not None:
            stats = self._train_each_role(samples, pad, prepared.metrics)
        else:
            stats = train_on_samples(
                self.policy_model, self.optimizer, self.scheduler, samples, self.config, pad
            )
        if not self._said_memory_used and stats.get("micro_batch_tokens_max") and self.placement is not None:
            self._said_memory_used = True  # once: the start-up line is a bound, this is what a step used
            tokens = int(stats["micro_batch_tokens_max"])
            say_step_memory_used(self.config, self.engine.model.path, self.placement, tokens)
        return {**prepared.metrics, **stats, "time_train_s": time.perf_counter() - started}

    def _train_each_role(
        self, samples: list[Any], pad: int, step_metrics: dict[str, Any]
    ) -> dict[str, float]:
        from lightning_sdk.training.update.roles import train_each_role

        assert self.roles is not None
        model = self.distributed.unwrap(self.policy_model)
        update = train_each_role(
            model, self.optimizer, self.scheduler, samples, self.config, self.roles.adapters, pad
        )
        self.changed_roles = update.changed
        self.warnings.idle_roles(update.idle, step_metrics)
        return update.metrics

    def push_weights(self, step: int) -> dict[str, float]:
        """Save the adapter and load it into the engine (merged or hot-loaded, per the engine's mode).

        The engine sleeps here (between rollouts); it wakes its weights for the write itself and keeps its
        KV cache asleep until the next rollout or evaluation wakes it."""
        started = time.perf_counter()
        distributed = self.distributed
        folder = self.adapter_dir if distributed.is_main else self.run_dir / f"adapter-rank{distributed.rank}"
        write_adapter(distributed.unwrap(self.policy_model), folder)
        changed = None
        if self.roles is not None:  # the role adapters this step changed (all after a resume)
            changed = self.roles.adapters if self.changed_roles is None else self.changed_roles
        load_into_engine(self.engine, folder, step, changed)
        return {"time_weight_sync_s": time.perf_counter() - started}

    def save_final_adapter(self) -> Path:
        """The final adapter in `run_dir/adapter` (rank 0)."""
        return self.save_adapter_to(self.adapter_dir)

    def save_adapter_to(self, folder: Path, beside: Callable[[Path], None] | None = None) -> Path:
        """The policy's adapter (every role's, in subfolders, with roles) in `folder` (rank 0), written
        under a staging name and renamed into place whole; `beside(staging)` writes more files into the
        folder before it is renamed (`best.json`), so they come and go with the adapter."""
        if self.distributed.is_main:
            write_adapter(self.distributed.unwrap(self.policy_model), folder, beside)
        return folder

    # --- checkpoints and logs -------------------------------------------------------------------------
    def save_checkpoint(self, step: int, cursor: TaskCursor) -> None:
        """A checkpoint of the run at `step` (rank 0 writes; every rank waits for it)."""
        parts = (self.distributed.unwrap(self.policy_model), self.optimizer, self.scheduler, cursor)
        save_run_checkpoint(self.run_dir, step, *parts, self.config.keep_checkpoints, self.distributed)

    def restore(self, cursor: TaskCursor) -> int:
        """Load the newest checkpoint of the run (if any) into the policy and `cursor`, drop the episodes
        and metrics a killed run wrote after it, push its weights to the engine and return its step; 0
        when there is none."""
        model = self.distributed.unwrap(self.policy_model)
        step = load_run_checkpoint(self.run_dir, model, self.optimizer, self.scheduler, cursor)
        if not step:
            return 0
        self.changed_roles = None  # every role's adapter is pushed below
        if self.episodes is not None:  # what the killed run stored for the steps it redoes
            self.episodes.discard_steps_after(step)
        self.reopen_metrics(step)  # drop records written after the checkpoint by the killed run
        self.push_weights(step)
        return step

    def reopen_metrics(self, resume_step: int) -> None:
        """Reopen the metrics writer at `resume_step`, dropping what a killed run wrote after it."""
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = open_metrics(self.run_dir, self.config, resume_step)
            self._opened.callback(self.metrics.close)

    def log(self, step: int, record: dict[str, Any]) -> dict[str, Any]:
        """Write a metrics record (rank 0) and return it."""
        return self.metrics.log(step, record) if self.metrics is not None else dict(record)

    def keep_episodes(self, step: int, rollouts: list[Rollout]) -> dict[str, int]:
        """Store the step's episodes in `run_dir/episodes.sqlite` (rank 0); returns
        `{"episodes_not_stored": n}`, nonzero once the file reached its size limit (see `RunEpisodes`)."""
        return self.episodes.keep_training(step, rollouts) if self.episodes is not None else {}

    def keep_evaluation(self, step: int, rollouts: list[Rollout]) -> None:
        """Store the validation episodes of the evaluation after `step` in `run_dir/evaluations.sqlite`."""
        if self.episodes is not None:
            self.episodes.keep_evaluation(step, rollouts)

    def progress(self, start_step: int) -> ProgressBar:
        from lightning_sdk.training.records.metrics import ProgressBar

        enabled = self.config.progress_bar and self.distributed.is_main
        return ProgressBar(total=self.config.max_steps, initial=start_step, enabled=enabled)

    def evaluation_progress(self, step: int, total: int, live: bool = True) -> EvaluationProgress:
        """What an evaluation shows: a count of its episodes (`live`) and its result's line at the end."""
        from lightning_sdk.training.records.metrics import EvaluationProgress

        enabled = self.config.progress_bar and self.distributed.is_main
        return EvaluationProgress(step, total, enabled=enabled, live=live)

    def close(self) -> None:
        """Release what the run opened, newest first: runners, files, the loop, the server, the engine (or
        wake the caller's), the process group. Each is released even when one before it fails."""
        self._opened.close()
