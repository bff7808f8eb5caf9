"""`Runners`: train with rollouts run by runner processes instead of inside the trainer's process.

`TrainerConfig(runners=Runners(processes=2))` starts two runner processes on this machine,
`Runners(processes=8, backend="ray")` eight runner actors on a Ray cluster; with `processes=0` the trainer
waits for runners you start yourself (`lightning-sdk runner ...`, on this machine or others). Either way
the trainer serves the runner protocol on its OpenAI-compatible server, behind the run's key, and prints
the command that starts a runner (on stderr).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

__all__ = ["KEY_VARIABLE", "RunnerLaunch", "RunnerProcesses", "Runners"]

KEY_VARIABLE = "LIGHTNING_SDK_KEY"
"""The environment variable that holds the run's key, on the trainer's side and the runners' alike."""

log = logging.getLogger("lightning_sdk.rollouts")


@dataclass(frozen=True)
class Runners:
    """Where rollouts run when they do not run in the trainer's process."""

    processes: int = 0
    """Runners the trainer starts and restarts when one dies (processes on this machine, or Ray actors
    with `backend="ray"`); 0 starts none and waits for runners started elsewhere."""
    backend: Literal["processes", "ray"] = "processes"
    """Where started runners run: `"processes"` on this machine, or `"ray"`: actors on a Ray cluster."""
    ray_address: str | None = None
    """The Ray cluster to join (`"auto"`, `"ray://head:10001"`, ...); `None` uses the connection this process
    already has (`ray.init(...)` before `fit`), or starts a local cluster."""
    resources: Mapping[str, float] | None = None
    """What each Ray runner actor reserves (`{"num_cpus": 2, "num_gpus": 0, "my_resource": 1}`); default
    one CPU."""
    agent: str | None = None
    """The agent as runners import it (`module:function` or `path/to/agent.py:function`); default: derived
    from the agent passed to `fit` (it must be defined at the top level of a module or script)."""
    concurrency: int = 1
    """Episodes each started runner runs at the same time."""
    host: str = "127.0.0.1"
    """Interface the trainer's server listens on. The default keeps it on this machine; name an interface
    (e.g. `"0.0.0.0"`) for runners on other machines, on a network you trust: the key is the only guard."""
    port: int = 0
    """The server's port; 0 picks a free one (fix it when runners elsewhere must find the trainer)."""
    lease_timeout_s: float = 30.0
    """A runner that does not renew its lease for this long is taken for dead: its rollout is re-issued."""
    max_attempts: int = 3
    """Leases one rollout may get; after that it counts as a failed episode, with the reasons."""
    api_key: str | None = field(default=None, repr=False)
    """The run's key, which runners and gateway agents send; default: `$LIGHTNING_SDK_KEY` when set, else a
    random key. Either way the trainer writes it to `run_dir/runner.key` (mode 0600) and the command it
    prints to start a runner names that file, never the key. Set it when runners started elsewhere must
    know the key before the trainer starts."""

    def key(self) -> str | None:
        """The key the trainer's server requires (`None`: let the server make a random one)."""
        return self.api_key or os.environ.get(KEY_VARIABLE) or None

    def __post_init__(self) -> None:
        for name, minimum in (("processes", 0), ("concurrency", 1), ("max_attempts", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"Runners({name}={value!r}): must be a whole number >= {minimum}.")
        if not self.lease_timeout_s > 0:
            raise ValueError(f"Runners(lease_timeout_s={self.lease_timeout_s!r}): must be > 0 seconds.")
        if self.backend not in ("processes", "ray"):
            raise ValueError(f"Runners(backend={self.backend!r}): use 'processes' or 'ray'.")
        if self.resources is not None and not all(
            isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 for v in self.resources.values()
        ):
            raise ValueError(f"Runners(resources={self.resources!r}): amounts must be numbers >= 0.")
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key.strip()):
            raise ValueError("Runners(api_key=...): must be a non-empty string, or None for the default.")
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ValueError(f"Runners(port={self.port!r}): must be a port number, or 0 for a free one.")


@dataclass(frozen=True)
class RunnerLaunch:
    """What every runner the trainer starts needs, wherever it starts it (a process here, a Ray actor)."""

    agent: str
    """The agent as `load_agent` finds it (`module:function` or `path/to/agent.py:function`)."""
    trainer_url: str
    """The trainer's server as the runner reaches it."""
    api_key: str = field(repr=False)
    concurrency: int = 1
    episode_timeout_s: float = 300.0

    def environment(self) -> dict[str, str]:
        """Variables a started runner process needs: the agent's module as importable as it is here."""
        path = [str(Path.cwd()), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        return {"PYTHONPATH": os.pathsep.join(path)}

    def process_environment(self) -> dict[str, str]:
        """`environment()` and the key, for a runner process on this machine: through the environment, not
        a command line that other users can read in `ps`; the runner removes it from its own environment
        before the agent runs (`arun_runner`)."""
        return {**self.environment(), KEY_VARIABLE: self.api_key}


class RunnerProcesses:
    """Runner processes on this machine: started with the run, restarted if one exits, stopped at its end."""

    def __init__(self, count: int, launch: RunnerLaunch) -> None:
        self._command = [
            sys.executable,
            "-m",
            "lightning_sdk.cli",
            "runner",
            launch.agent,
            "--trainer",
            launch.trainer_url,
            "--concurrency",
            str(launch.concurrency),
            "--episode-timeout",
            str(launch.episode_timeout_s),
        ]
        self._env = {**os.environ, **launch.process_environment()}
        self._processes = [self._start(index) for index in range(count)]

    def _start(self, index: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen([*self._command, "--name", f"local-{index}"], env=self._env)

    @property
    def pids(self) -> list[int]:
        """Process ids of the runners (as they are now)."""
        return [process.pid for process in self._processes]

    def restart_exited(self) -> int:
        """Start a new runner for every one that exited; returns how many."""
        restarted = 0
        for index, process in enumerate(self._processes):
            if process.poll() is not None:
                log.warning(
                    "runner local-%d exited with code %s; starting a new one", index, process.returncode
                )
                self._processes[index] = self._start(index)
                restarted += 1
        return restarted

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask every runner to stop (Ctrl+C), then kill those still running after `timeout_s`."""
        for process in self._processes:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
        for process in self._processes:
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
