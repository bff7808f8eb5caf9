"""`RayRunners`: runner actors on a Ray cluster, for rollouts that need more machines than the trainer's.

Ray does the scheduling: each actor reserves `resources` on some node, runs the same runner loop as
`lightning-sdk runner` (lease, run the agent, upload), and is restarted by Ray when its process dies, with
its loop run again (`max_restarts=-1`, `max_task_retries=-1`). A rollout the dead actor held goes to
another runner once its lease lapses, as with any runner. `ray` is an optional extra:
`pip install 'lightning-sdk[ray]'`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from types import ModuleType

from lightning_sdk.rollouts.runners import RunnerLaunch

__all__ = ["RayRunners", "import_ray", "node_address"]

log = logging.getLogger("lightning_sdk.rollouts")


class _RunnerActor:
    """One runner inside a Ray actor (threaded, so that `pid` answers while `serve` runs).

    The key comes as a constructor argument, never through `runtime_env` environment variables, which Ray's
    dashboard and state API show to whoever can reach the cluster."""

    def __init__(self, api_key: str) -> None:
        self._api_key = api_key

    def __repr__(self) -> str:  # Ray shows an actor's repr in its dashboard and logs
        return "_RunnerActor()"

    def serve(
        self, agent: str, trainer_url: str, concurrency: int, episode_timeout_s: float, name: str
    ) -> int:
        from lightning_sdk.rollouts.runner import load_agent, run_runner

        return run_runner(
            load_agent(agent),
            trainer_url,
            self._api_key,
            concurrency=concurrency,
            name=name,
            episode_timeout_s=episode_timeout_s,
        )

    def pid(self) -> int:
        return os.getpid()


class RayRunners:
    """`count` runner actors on the Ray cluster this process is connected to (connecting or starting one
    when it is not: `address=None` starts a local cluster on the loopback interface).

    Call `ray.init(...)` yourself before training for anything else (a `runtime_env` that ships your
    agent's code to the cluster's nodes, a namespace, ...): an existing connection is used as it is.
    """

    def __init__(
        self,
        count: int,
        launch: RunnerLaunch,
        address: str | None = None,
        resources: Mapping[str, float] | None = None,
    ) -> None:
        ray = import_ray()
        self._ray = ray
        self._started_ray = False
        if not ray.is_initialized():
            # A local cluster listens on the loopback interface only; a real cluster is joined by address.
            local = {"_node_ip_address": "127.0.0.1"} if address is None else {}
            ray.init(address=address, include_dashboard=False, log_to_driver=True, **local)
            self._started_ray = True
        wanted = dict(resources or {"num_cpus": 1})
        cpus, gpus = wanted.pop("num_cpus", 1), wanted.pop("num_gpus", 0)
        actor = ray.remote(_RunnerActor).options(
            max_restarts=-1,
            max_task_retries=-1,
            max_concurrency=2,
            num_cpus=cpus,
            num_gpus=gpus,
            resources=wanted or None,
            runtime_env={"env_vars": launch.environment()},
        )
        self._actors = [actor.remote(launch.api_key) for _ in range(count)]
        self._loops = [
            handle.serve.remote(
                launch.agent, launch.trainer_url, launch.concurrency, launch.episode_timeout_s, f"ray-{index}"
            )
            for index, handle in enumerate(self._actors)
        ]
        log.info("started %d runner actors on Ray (%s each)", count, resources or {"num_cpus": 1})

    @property
    def pids(self) -> list[int]:
        """Process ids of the actors as they are now (a restarted actor has a new one)."""
        return list(self._ray.get([handle.pid.remote() for handle in self._actors], timeout=60))

    def restart_exited(self) -> int:
        """Nothing to do: Ray restarts dead actors itself."""
        return 0

    def stop(self, timeout_s: float = 10.0) -> None:
        """Let the actors' loops end (a closed queue tells their runners training is over), kill those still
        running after `timeout_s` (no restart), and shut down the Ray cluster if this object started it."""
        ray = self._ray
        _, running = ray.wait(self._loops, num_returns=len(self._loops), timeout=timeout_s)
        for handle in self._actors:
            ray.kill(handle, no_restart=True)
        # A killed actor's loop fails; collecting that failure here keeps Ray from printing it at exit as an
        # unhandled error ("Task _RunnerActor.serve failed ... killed by ray.kill") after a clean run.
        for loop in running:
            try:
                ray.get(loop, timeout=timeout_s)
            except (ray.exceptions.RayError, TimeoutError):
                log.debug("runner actor loop ended by ray.kill")
        if self._started_ray:
            ray.shutdown()


def import_ray() -> ModuleType:
    """The `ray` module, or an `ImportError` with the install command."""
    try:
        import ray
    except ImportError as error:
        raise ImportError(
            "Runners(backend='ray') needs Ray: pip install 'lightning-sdk[ray]' (or use the default backend, "
            "runner processes on this machine)."
        ) from error
    return ray


def node_address() -> str:
    """This node's address as the Ray cluster sees it (where remote actors can reach the trainer)."""
    ray = import_ray()
    return str(ray.util.get_node_ip_address())
