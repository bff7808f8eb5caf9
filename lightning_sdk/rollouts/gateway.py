"""The gateway: episodes recorded by the trainer's server, for agents that cannot record themselves.

An agent in any language leases a rollout like a runner does, then sends its OpenAI requests to the lease's
`gateway_base_url` (`<server>/rollouts/<rollout id>/<lease id>/v1`) instead of `/v1`. The server answers
them exactly as on `/v1` and records each call into the lease's episode, with the token ids it served;
each call also renews the lease. When the agent is done it posts its reward (and optional step rewards,
one per recorded call) to `/v1/rollouts/<rollout id>/reward`, which completes the rollout.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from lightning_sdk.rollouts.queue import RolloutQueue
from lightning_sdk.tracing.episode import Episode, LLMCall
from lightning_sdk.tracing.openai_calls import StreamAssembler, calls_from_response, request_record
from lightning_sdk.tracing.openai_responses import (
    ResponsesStreamAssembler,
    calls_from_responses_api,
    responses_request_record,
)

__all__ = ["GatewayRecorder", "RewardReport", "parse_reward_report"]


@dataclass(frozen=True)
class RewardReport:
    """What an agent posts when it is done (validated by `parse_reward_report`)."""

    reward: float
    step_rewards: list[float | None]
    output: Any
    error: str | None
    name: str


def parse_reward_report(body: dict[str, Any]) -> RewardReport:
    """The reward body, or a `ValueError` that names the bad field."""
    reward = body.get("reward")
    if not _finite(reward):
        raise ValueError("reward must be a finite number (the episode's return).")
    assert isinstance(reward, int | float)  # for the type checker: _finite said so
    steps = body.get("step_rewards", [])
    if not isinstance(steps, list) or not all(step is None or _finite(step) for step in steps):
        raise ValueError("step_rewards must be a list of numbers or nulls, one per recorded call, in order.")
    error = body.get("error")
    if error is not None and not isinstance(error, str):
        raise ValueError("error must be a string (why the agent failed) or absent.")
    name = body.get("name", "gateway")
    if not isinstance(name, str) or not name:
        raise ValueError("name must be a non-empty string (the agent's name).")
    return RewardReport(
        float(reward), [None if s is None else float(s) for s in steps], body.get("output"), error, name
    )


class GatewayRecorder:
    """The episodes being recorded for gateway leases, keyed by (rollout id, lease id)."""

    def __init__(self, queue: RolloutQueue) -> None:
        self._queue = queue
        self._episodes: dict[tuple[str, str], Episode] = {}
        self._lock = threading.Lock()

    def check(self, rollout_id: str, lease_id: str) -> None:
        """Raise `UnknownRollout` / `LeaseLost` unless the lease holds the rollout; renews it."""
        self._queue.renew(rollout_id, lease_id)

    def template(self, api: str, body: dict[str, Any], base_url: str) -> LLMCall:
        """The request half of a call's record; `api` is "chat", "completion" or "responses"."""
        if api == "responses":
            return responses_request_record(body, base_url, time.time())
        return request_record(api, body, base_url, time.time())

    def record_response(
        self, rollout_id: str, lease_id: str, api: str, template: LLMCall, response: dict[str, Any]
    ) -> None:
        """Record a whole response (a chat or text completion, or a Response, as the app returned it)."""
        whole = _openai_object(api, response)
        if api == "responses":
            self._add(rollout_id, lease_id, calls_from_responses_api(template, whole))
        else:
            self._add(rollout_id, lease_id, calls_from_response(template, whole))

    async def record_stream(
        self, rollout_id: str, lease_id: str, api: str, template: LLMCall, events: AsyncIterator[Any]
    ) -> AsyncIterator[Any]:
        """Pass a stream's server-sent events through, recording what was sent once it ends."""
        assembler: Any = (
            ResponsesStreamAssembler(template) if api == "responses" else StreamAssembler(template)
        )
        closed_early = True
        try:
            async for event in events:
                yield event
                text = event.decode() if isinstance(event, bytes) else str(event)
                for line in text.splitlines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        assembler.add(_openai_object(api, line[len("data: ") :], chunk=True))
            closed_early = False
        finally:
            self._add(rollout_id, lease_id, assembler.calls(closed_early=closed_early))

    def finish(
        self, rollout_id: str, lease_id: str, task: Any, report: RewardReport, base_url: str
    ) -> dict[str, Any]:
        """The finished episode of a lease, as the JSON the queue stores."""
        with self._lock:
            episode = self._episodes.pop((rollout_id, lease_id), None) or Episode()
        calls = episode.calls
        if len(report.step_rewards) > len(calls):
            raise ValueError(
                f"step_rewards has {len(report.step_rewards)} entries for {len(calls)} recorded calls."
            )
        for call, step in zip(calls, report.step_rewards):
            if step is not None:
                call.add_reward(step)
        episode.name, episode.task, episode.output, episode.ended_at = (
            report.name,
            task,
            report.output,
            time.time(),
        )
        for call in calls:
            call.agent_name = report.name
        episode.rewards["reward"] = report.reward
        if report.error is not None:
            episode.error = {"type": "AgentError", "message": report.error, "traceback": ""}
        episode.metadata.update(gateway=True, base_url=base_url)
        return episode.to_dict()

    def _add(self, rollout_id: str, lease_id: str, calls: list[LLMCall]) -> None:
        with self._lock:
            episode = self._episodes.setdefault((rollout_id, lease_id), Episode(name="gateway"))
            episode.calls.extend(calls)


def _openai_object(api: str, data: Any, chunk: bool = False) -> Any:
    """The app's JSON as the openai client's objects, which the capture's record builders read.

    Built without validation, as the openai client builds what it receives: recording must never turn a
    call that was served into an error because a newer openai release requires a field the app omits.
    """
    from openai.types import Completion
    from openai.types.chat import ChatCompletion, ChatCompletionChunk
    from openai.types.responses import Response

    payload = json.loads(data) if isinstance(data, str) else data
    if api != "responses":
        cls: Any = (ChatCompletionChunk if chunk else ChatCompletion) if api == "chat" else Completion
        return cls.construct(**payload)
    if not chunk:
        return Response.construct(**payload)
    # A stream event: the recorder reads its type, its text delta and the whole response of the last one.
    event = dict(payload)
    if isinstance(event.get("response"), dict):
        event["response"] = Response.construct(**event["response"])
    return SimpleNamespace(**event)


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
