"""What the trainer's endpoint connects to besides its engine: runners and the agent's upstream API.

- The runner protocol (`config.runners`): the rollout queue, its routes on the endpoint, the address the
  endpoint listens on, and the runner processes the trainer starts itself.
- The upstream: where requests for OpenAI routes the policy does not serve (a retriever's embeddings)
  pass through to.

`TrainingSession` calls these once at start; they hold no state of their own.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lightning_sdk.serving.upstream import Upstream
from lightning_sdk.training.config import TrainerConfig
from lightning_sdk.training.distributed import Distributed

if TYPE_CHECKING:
    from lightning_sdk.rollouts.queue import RolloutQueue
    from lightning_sdk.serving.endpoint import LLMEndpoint
    from lightning_sdk.training.remote import RemoteRollouts

__all__ = ["TRAINER_UPSTREAM_SETTING", "remote_rollouts", "runner_protocol", "trainer_upstream"]

log = logging.getLogger("lightning_sdk.training")

TRAINER_UPSTREAM_SETTING = (
    "Set TrainerConfig(upstream_base_url=...) (its key is read from OPENAI_API_KEY), or start training where "
    "OPENAI_BASE_URL or OPENAI_API_KEY names the API the agent uses without the trainer."
)
"""What the endpoint's 404 for an unserved route tells the user to set."""


def trainer_upstream(config: TrainerConfig) -> Upstream | None:
    """The API that receives the agent's requests the policy does not serve (see `upstream_base_url`)."""
    if config.upstream_base_url is not None:
        return Upstream(config.upstream_base_url.rstrip("/"), os.environ.get(config.upstream_api_key_env))
    upstream = Upstream.from_environment(key_variable=config.upstream_api_key_env)
    if upstream is not None:
        log.info("the agent's requests for other OpenAI routes pass through to %s", upstream.base_url)
    return upstream


def runner_protocol(config: TrainerConfig, distributed: Distributed) -> tuple[Any, list[Any], str, int]:
    """The runner protocol's queue and routes when `config.runners` asks for them, and where to listen."""
    runners = config.runners
    if runners is None:
        return None, [], "127.0.0.1", 0
    if distributed.world_size > 1:
        raise ValueError("Runners are not supported under torchrun yet: use one process, or no runners.")
    from lightning_sdk.rollouts.queue import RolloutQueue
    from lightning_sdk.rollouts.routes import install_rollout_routes

    queue = RolloutQueue(runners.lease_timeout_s, config.episode_timeout_s, runners.max_attempts)
    routes = [lambda app, authorize: install_rollout_routes(app, authorize, queue)]
    return queue, routes, runners.host, runners.port


def remote_rollouts(
    config: TrainerConfig,
    endpoint: LLMEndpoint,
    queue: RolloutQueue,
    agent: Callable[..., Any] | None,
) -> RemoteRollouts:
    """Rollouts on runners: start the configured runner processes (local or Ray actors) and log the
    command that starts more by hand."""
    from lightning_sdk.rollouts.runners import RunnerLaunch, RunnerProcesses
    from lightning_sdk.runner.agents import agent_reference
    from lightning_sdk.training.remote import RemoteRollouts

    runners = config.runners
    assert runners is not None  # the caller checked
    reference = runners.agent or (agent_reference(agent) if agent is not None else None)
    local_url = endpoint.base_url.removesuffix("/v1").replace("//0.0.0.0:", "//127.0.0.1:")
    shown_url = (
        local_url
        if runners.host in ("127.0.0.1", "localhost")
        else local_url.replace("127.0.0.1", socket.gethostname())
    )
    command = (
        f"LIGHTNING_SDK_KEY={endpoint.api_key} lightning-sdk runner "
        f"{reference or 'module:agent'} --trainer {shown_url}"
    )
    processes: Any = None
    if runners.processes:
        if reference is None:
            raise ValueError("Runners(processes=...) needs the agent: pass it to fit or to Runners.")
        launch = RunnerLaunch(
            reference, local_url, endpoint.api_key, runners.concurrency, config.episode_timeout_s
        )
        if runners.backend == "ray":
            from lightning_sdk.rollouts.ray_runners import RayRunners, node_address

            # Actors on other nodes reach the trainer at this node's cluster address (when it listens
            # beyond the loopback interface).
            if runners.host not in ("127.0.0.1", "localhost"):
                reachable = local_url.replace("127.0.0.1", node_address())
                launch = dataclasses.replace(launch, trainer_url=reachable)
            processes = RayRunners(runners.processes, launch, runners.ray_address, runners.resources)
        else:
            processes = RunnerProcesses(runners.processes, launch)
    log.info("rollouts run on runners; start one with: %s", command)
    return RemoteRollouts(queue, endpoint.base_url, command, processes)
