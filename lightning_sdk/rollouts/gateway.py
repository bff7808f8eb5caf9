"""The gateway: episodes recorded by the trainer's server, for agents that cannot record themselves.

An agent in any language leases a rollout like a runner does, then sends its OpenAI requests to the lease's
`gateway_base_url` (`<server>/rollouts/<rollout id>/<lease id>/v1`) instead of `/v1`. The server answers
them exactly as on `/v1` and records each call into the lease's episode, with the token ids it served;
each call also renews the lease. When the agent is done it posts its reward (and optional step rewards,
one per recorded call) to `/v1/rollouts/<rollout id>/reward`, which completes the rollout.

The record of a call is made from what the serving layer served (`ServedCall`: plain data, the token ids
included), never by reading the response back. Only the request half differs between APIs: a Responses
request is recorded in chat terms (`responses_request_record`), and so is an Anthropic Messages request
(`messages_request_record`), so credit assignment and training treat them like a chat call.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from lightning_sdk.rollouts.queue import RolloutQueue
from lightning_sdk.rollouts.schemas import Lease, RewardReport
from lightning_sdk.serving.served import ApiKind, ServedCall, ServedChoice, ServedObserver
from lightning_sdk.tracing.capture.anthropic_calls import messages_request_record
from lightning_sdk.tracing.capture.openai_calls import request_record
from lightning_sdk.tracing.capture.openai_responses import responses_request_record
from lightning_sdk.tracing.episode import Episode, LLMCall, new_id
from lightning_sdk.tracing.errors import never_break_the_agent

__all__ = ["REQUEST_RECORDS", "GatewayRecorder", "RequestRecord", "RewardReport", "calls_from_served"]

RequestRecord = Callable[[Mapping[str, Any], str | None, float], LLMCall]
"""The request half of a call's record: `(body, base_url, started_at) -> LLMCall`."""


REQUEST_RECORDS: Mapping[ApiKind, RequestRecord] = {
    "chat": lambda body, base_url, started_at: request_record("chat", body, base_url, started_at),
    "completion": lambda body, base_url, started_at: request_record("completion", body, base_url, started_at),
    "responses": responses_request_record,
    "messages": messages_request_record,
}
"""How each API's request is recorded."""


class GatewayRecorder:
    """The episodes being recorded for gateway leases, keyed by (rollout id, lease id)."""

    def __init__(self, queue: RolloutQueue) -> None:
        self._queue = queue
        self._episodes: dict[tuple[str, str], Episode] = {}
        self._lock = threading.Lock()

    def check(self, rollout_id: str, lease_id: str) -> None:
        """Raise `UnknownRollout` / `LeaseLost` unless the lease holds the rollout; renews it."""
        self._queue.renew(rollout_id, lease_id)

    def recording(
        self, rollout_id: str, lease_id: str, api: ApiKind, body: Mapping[str, Any], base_url: str
    ) -> ServedObserver:
        """An observer for `OpenAIAPI.serve` that records the served call into the lease's episode."""
        template = REQUEST_RECORDS[api](body, base_url, time.time())

        def record(served: ServedCall) -> None:
            with never_break_the_agent("recording a gateway call"):
                calls = calls_from_served(template, served)
                with self._lock:
                    episode = self._episodes.setdefault((rollout_id, lease_id), Episode(name="gateway"))
                    episode.calls.extend(calls)

        return record

    def finish(self, lease: Lease, report: RewardReport, base_url: str) -> dict[str, Any]:
        """The finished episode of a lease, as the JSON the queue stores (a `ValueError` when the report
        does not fit the recorded calls; the calls stay recorded for a corrected report)."""
        key = (lease.rollout_id, lease.lease_id)
        with self._lock:
            calls = self._episodes[key].calls if key in self._episodes else []
            if len(report.step_rewards) > len(calls):
                raise ValueError(
                    f"step_rewards has {len(report.step_rewards)} entries for {len(calls)} recorded calls."
                )
            episode = self._episodes.pop(key, None) or Episode()
        for call, step in zip(episode.calls, report.step_rewards):
            if step is not None:
                call.add_reward(step)
        for call in episode.calls:
            call.agent_name = report.name
        episode.name, episode.task, episode.output = report.name, lease.task, report.output
        episode.ended_at = time.time()
        episode.rewards["reward"] = report.reward
        if report.error is not None:
            episode.error = {"type": "AgentError", "message": report.error, "traceback": ""}
        # The keys a runner's episode carries too (docs/scaling.md, "What an episode carries").
        episode.metadata.update(
            gateway=True,
            rollout_id=lease.rollout_id,
            attempt=lease.attempt,
            policy_version=lease.policy_version,
            base_url=base_url,
        )
        return episode.to_dict()


def calls_from_served(template: LLMCall, served: ServedCall) -> list[LLMCall]:
    """One record per choice of a served call; `template` is the request half (`REQUEST_RECORDS`)."""
    choices = served.choices or [ServedChoice(0, [])]  # a stream closed before its first token
    calls = []
    for choice in choices:
        call = _for_choice(template, choice.index, len(choices))
        content = choice.content if choice.content is not None or choice.tool_calls else ""
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if choice.tool_calls:
            message["tool_calls"] = [dict(tool_call) for tool_call in choice.tool_calls]
        call.request_id, call.response_message, call.text = served.request_id, message, content
        call.finish_reason = choice.finish_reason
        call.usage = dict(served.usage) if served.usage is not None else None
        call.prompt_token_ids = list(choice.prompt_token_ids)
        call.completion_token_ids = list(choice.token_ids)
        call.logprobs = list(choice.logprobs) or None
        call.latency_s = time.time() - template.started_at
        call.error = served.error
        call.adapter = served.adapter
        call.policy_version = served.weight_version
        if not served.complete:
            call.metadata["stream_closed_early"] = True
        calls.append(call)
    return calls


def _for_choice(template: LLMCall, index: int, count: int) -> LLMCall:
    """The record of choice `index` of `count`: the template itself when it is the only one, else a copy."""
    if count == 1:
        template.choice_index = index
        return template
    return dataclasses.replace(
        template,
        id=new_id(),
        choice_index=index,
        sampling=dict(template.sampling),
        metadata=dict(template.metadata),
    )
