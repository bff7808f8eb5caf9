"""Rollouts through runners: the step's rollouts go into the queue, runners lease and run them, and their
episodes come back as the same `Rollout`s in-process rollouts give.

Runners record their calls against the endpoint as they reach it (`http://<trainer host>:<port>/v1`
from another machine); those calls are the trainer's own, so they are filed under the trainer's
endpoint URL, which is what credit assignment keeps for training.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from lightning_sdk.rollouts.queue import Outcome, RolloutQueue, RolloutSpec
from lightning_sdk.rollouts.runners import RunnerProcesses
from lightning_sdk.tracing.episode import Episode
from lightning_sdk.training.rollout import Rollout, score_with_reward_fn

__all__ = ["RemoteRollouts"]

log = logging.getLogger("lightning_sdk.training")


class RemoteRollouts:
    """Runs a step's rollouts on runners and waits for them.

    Args:
        queue: The queue the server's runner routes serve.
        endpoint_base_url: The trainer's OpenAI endpoint (what calls are filed under).
        start_command: The command that starts a runner, shown while the trainer waits for one.
        processes: Runner processes this trainer started (restarted when one exits), if any.
        report_every_s: How often to say what the trainer waits for.
    """

    def __init__(
        self,
        queue: RolloutQueue,
        endpoint_base_url: str,
        start_command: str,
        processes: RunnerProcesses | None = None,
        report_every_s: float = 30.0,
    ) -> None:
        self.queue = queue
        self.endpoint_base_url = endpoint_base_url
        self.start_command = start_command
        self.processes = processes
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
        """Fail what is still open and stop the runner processes this trainer started."""
        self.queue.close("the training run ended")
        if self.processes is not None:
            self.processes.stop()

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
            episode = Episode(name="runner", task=task, ended_at=time.time())
            episode.error = {"type": "RolloutFailed", "message": str(outcome.failure), "traceback": ""}
            episode.metadata.update(rollout_id=outcome.rollout_id, attempts=outcome.attempts)
            return episode
        episode = Episode.from_dict(outcome.episode)
        reached = episode.metadata.get("base_url")
        for call in episode.all_calls():
            if reached is not None and call.base_url is not None and _same(call.base_url, reached):
                call.base_url = self.endpoint_base_url
        return episode


def _as_json(task: Any, index: int) -> Any:
    try:
        return json.loads(json.dumps(task))
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"Task {index} cannot go to runners: tasks travel as JSON, and this one is not ({error}). "
            "Use dicts, lists, strings and numbers."
        ) from None


def _same(url: str, other: str) -> bool:
    return url.rstrip("/") == other.rstrip("/")
