"""Rollouts through runners: the step's rollouts go into the queue, runners lease and run them, and their
episodes come back as the same `Rollout`s in-process rollouts give.

`runner_protocol(...)` opens the queue and the routes the trainer's server adds for it; `start_runners(...)`
writes the run's key to a file only its owner can read (`KEY_FILE` in the run folder), starts the configured
runner processes (or Ray actors), prints the command that starts more (which names the key file, never the
key: the line is logged again while the trainer waits, and consoles are captured), and returns the
`RemoteRollouts` the trainer sends each step's rollouts through.

Runners record their calls against the endpoint as they reach it (`http://<trainer host>:<port>/v1`
from another machine); those calls are the trainer's own, so they are filed under the trainer's
endpoint URL, which is what credit assignment keeps for training.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import socket
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_sdk.rollouts.in_process import Rollout, score_with_reward_fn
from lightning_sdk.rollouts.queue import Outcome, RolloutQueue, RolloutSpec
from lightning_sdk.rollouts.runners import KEY_VARIABLE, RunnerLaunch, RunnerProcesses, Runners
from lightning_sdk.serving.endpoint import write_secret_file
from lightning_sdk.tracing.episode import Episode
from lightning_sdk.tracing.routing import Roles
from lightning_sdk.tracing.urls import same_endpoint

if TYPE_CHECKING:
    from lightning_sdk.rollouts.ray_runners import RayRunners
    from lightning_sdk.serving.endpoint import LLMEndpoint
    from lightning_sdk.serving.routes.installer import Authorize, RouteInstaller

__all__ = ["KEY_FILE", "RemoteRollouts", "runner_protocol", "start_runners", "write_key_file"]

log = logging.getLogger("lightning_sdk.rollouts")

_LOOPBACK = ("127.0.0.1", "localhost")

KEY_FILE = "runner.key"
"""The file in the run folder that holds the run's key while the run lasts (mode 0600: its owner only)."""


def runner_protocol(
    runners: Runners,
    episode_timeout_s: float,
    routes: Mapping[str, str] | None = None,
    roles: Roles | None = None,
    paused_s: Callable[[], float] | None = None,
) -> tuple[RolloutQueue, RouteInstaller]:
    """The queue runners lease from, and the installer of its routes on the trainer's server (which hand
    the run's routing map and roles to runners with every lease). `paused_s`: the engine's clock of time
    held for updates, which episode time limits leave out (`RolloutQueue`)."""
    from lightning_sdk.rollouts.routes import install_rollout_routes

    queue = RolloutQueue(runners.lease_timeout_s, episode_timeout_s, runners.max_attempts, paused_s=paused_s)

    def install(app: Any, authorize: Authorize) -> None:
        install_rollout_routes(app, authorize, queue, routes=routes, roles=roles)

    return queue, install


def write_key_file(run_dir: Path, key: str) -> Path:
    """`run_dir/KEY_FILE` holding `key`, readable and writable by its owner only (mode 0600, set before a
    byte is written, whatever the umask or an older file's mode)."""
    return write_secret_file(run_dir / KEY_FILE, key)


def start_runners(
    runners: Runners,
    episode_timeout_s: float,
    endpoint: LLMEndpoint,
    queue: RolloutQueue,
    agent: Callable[..., Any] | None,
    run_dir: Path,
) -> RemoteRollouts:
    """Write the key file in `run_dir`, start the runner processes (or Ray actors) `runners` asks for, print
    the command that starts more by hand (on stderr, so that it shows whatever the logging setup), and
    return the rollouts through them."""
    from lightning_sdk.rollouts.runner.agents import agent_reference

    reference = runners.agent or (agent_reference(agent) if agent is not None else None)
    local_url = endpoint.base_url.removesuffix("/v1").replace("//0.0.0.0:", "//127.0.0.1:")
    shown_url = (
        local_url if runners.host in _LOOPBACK else local_url.replace("127.0.0.1", socket.gethostname())
    )
    key_file = write_key_file(run_dir, endpoint.api_key)
    command = (
        f"lightning-sdk runner {reference or 'module:agent'} --trainer {shown_url} --key-file {key_file}"
    )
    processes: RunnerProcesses | RayRunners | None = None
    if runners.processes:
        if reference is None:
            raise ValueError("Runners(processes=...) needs the agent: pass it to fit or to Runners.")
        launch = RunnerLaunch(reference, local_url, endpoint.api_key, runners.concurrency, episode_timeout_s)
        if runners.backend == "ray":
            from lightning_sdk.rollouts.ray_runners import RayRunners, node_address

            # Actors on other nodes reach the trainer at this node's cluster address (when it listens
            # beyond the loopback interface).
            if runners.host not in _LOOPBACK:
                launch = dataclasses.replace(
                    launch, trainer_url=local_url.replace("127.0.0.1", node_address())
                )
            processes = RayRunners(runners.processes, launch, runners.ray_address, runners.resources)
        else:
            processes = RunnerProcesses(runners.processes, launch)
    print(
        f"lightning-sdk: rollouts run on runners; start one with:\n  {command}\n"
        f"(the key is in that file, readable by you only: on another machine, copy it there or set "
        f"{KEY_VARIABLE} to its contents)",
        file=sys.stderr,
        flush=True,
    )
    return RemoteRollouts(queue, endpoint.base_url, command, processes, key_file=key_file)


class RemoteRollouts:
    """Runs a step's rollouts on runners and waits for them.

    Args:
        queue: The queue the server's runner routes serve.
        endpoint_base_url: The trainer's OpenAI endpoint (what calls are filed under).
        start_command: The command that starts a runner, shown while the trainer waits for one.
        processes: Runner processes this trainer started (restarted when one exits), if any.
        report_every_s: How often to say what the trainer waits for.
        key_file: The file that holds the run's key (`write_key_file`), removed by `close()`.
    """

    def __init__(
        self,
        queue: RolloutQueue,
        endpoint_base_url: str,
        start_command: str,
        processes: RunnerProcesses | RayRunners | None = None,
        report_every_s: float = 30.0,
        key_file: Path | None = None,
    ) -> None:
        self.queue = queue
        self.endpoint_base_url = endpoint_base_url
        self.start_command = start_command
        self.processes = processes
        self.key_file = key_file
        self._report_every_s = report_every_s
        self._last_report = time.monotonic()

    def run(
        self,
        tasks: list[Any],
        group_size: int,
        policy_version: Any,
        reward_fn: Callable[[Any, Any], float] | None = None,
        on_finished: Callable[[Rollout], None] | None = None,
    ) -> list[Rollout]:
        """Every task `group_size` times on the runners; one `Rollout` per run, ordered as in-process."""
        payloads = [_as_json(task, index) for index, task in enumerate(tasks)]
        slots = [(t, s) for t in range(len(tasks)) for s in range(group_size)]
        specs = [RolloutSpec(self.queue.new_id(), payloads[t], policy_version) for t, _ in slots]
        ids = self.queue.submit(specs)
        self._last_report = time.monotonic()
        outcomes = self.queue.wait(ids, on_poll=self._while_waiting)
        rollouts = []
        for (task_index, sample_index), outcome in zip(slots, outcomes, strict=True):
            episode = self._episode(outcome, payloads[task_index])
            if reward_fn is not None and episode.error is None and episode.reward is None:
                score_with_reward_fn(episode, reward_fn, tasks[task_index], episode.output)
            rollout = Rollout(
                task_index, sample_index, episode, timed_out=bool(episode.metadata.get("timed_out"))
            )
            if on_finished is not None:
                on_finished(rollout)
            rollouts.append(rollout)
        return rollouts

    def close(self) -> None:
        """Fail what is still open, stop the runner processes this trainer started, and remove the key file
        (the key opens nothing once the run's server stops; a resumed run writes it again)."""
        self.queue.close("the training run ended")
        try:
            if self.processes is not None:
                self.processes.stop()
        finally:
            if self.key_file is not None:
                with contextlib.suppress(FileNotFoundError):
                    self.key_file.unlink()

    def _while_waiting(self) -> None:
        if self.processes is not None:
            self.processes.restart_exited()
        if time.monotonic() - self._last_report >= self._report_every_s:
            self._last_report = time.monotonic()
            stats = self.queue.stats()
            log.info(
                "waiting for runners: %d rollouts pending, %d running, %d done. Start a runner with: %s",
                stats["pending"],
                stats["leased"],
                stats["done"],
                self.start_command,
            )

    def _episode(self, outcome: Outcome, task: Any) -> Episode:
        if outcome.episode is None:
            return _failed(outcome, task, str(outcome.failure))
        try:
            episode = Episode.from_dict(outcome.episode)
            reached = episode.metadata.get("base_url")
            for call in episode.all_calls():
                if reached is not None and same_endpoint(call.base_url, reached):
                    call.base_url = self.endpoint_base_url
        except (TypeError, ValueError, AttributeError, KeyError) as error:
            # The routes checked the upload (`EpisodeUpload`); should an episode still not read, it is one
            # failed rollout, not the end of the run.
            log.warning(
                "rollout %s: its episode cannot be read (%s); counted as failed", outcome.rollout_id, error
            )
            return _failed(outcome, task, f"the uploaded episode cannot be read ({error})")
        return episode


def _failed(outcome: Outcome, task: Any, reason: str) -> Episode:
    """The episode of a rollout that brought none back, saying why."""
    episode = Episode(name="runner", task=task, ended_at=time.time())
    episode.error = {"type": "RolloutFailed", "message": reason, "traceback": ""}
    # The same keys a runner's episode carries (docs/scaling.md, "What an episode carries").
    episode.metadata.update(rollout_id=outcome.rollout_id, attempt=outcome.attempts, runner=outcome.runner)
    return episode


def _as_json(task: Any, index: int) -> Any:
    try:
        return json.loads(json.dumps(task))
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"Task {index} cannot go to runners: tasks travel as JSON, and this one is not ({error}). "
            "Use dicts, lists, strings and numbers."
        ) from None
