"""`run_runner`: lease rollouts from a trainer, run the agent on each, upload the recorded episodes.

The agent runs exactly as in in-process training: the same `@trace_agent` and `@reward` decorators and
framework integrations record it, its default openai clients point at the trainer's endpoint (through
`OPENAI_BASE_URL`/`OPENAI_API_KEY`, and `llm=` when its signature asks for it), and a run that raises or
times out still yields an episode that says so. While an episode runs, its lease is renewed in the
background; if the runner dies, the lease lapses and the trainer gives the rollout to another runner.
When the trainer answers that training is over (410), the runner stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from lightning_sdk.rollouts.in_process import UpdatePauses, agent_accepts_llm, run_episode
from lightning_sdk.rollouts.runner.client import ProtocolRefusal, TrainerClient, TrainingOver
from lightning_sdk.rollouts.runners import KEY_VARIABLE
from lightning_sdk.rollouts.schemas import GrantedLease
from lightning_sdk.serving.endpoint import LLMEndpoint
from lightning_sdk.serving.keys import model_key
from lightning_sdk.tracing.routing import Router, compile_routes

__all__ = ["arun_runner", "run_runner"]

log = logging.getLogger("lightning_sdk.rollouts.runner")


def run_runner(
    agent: Callable[..., Any],
    trainer_url: str,
    api_key: str,
    *,
    concurrency: int = 1,
    name: str | None = None,
    episode_timeout_s: float = 300.0,
    max_rollouts: int | None = None,
) -> int:
    """Serve rollouts to the trainer at `trainer_url` until the trainer says training is over, the runner is
    stopped (Ctrl+C) or `max_rollouts` episodes were uploaded; returns how many were.

    Args:
        agent: The agent function (usually `@trace_agent`-decorated), called as `agent(task)`.
        trainer_url: The trainer's server, e.g. `http://10.0.0.5:8123`.
        api_key: The run's key (`RUN_DIR/runner.key`). The agent is handed the model key derived from it,
            which opens model calls only (`lightning_sdk.serving.keys`).
        concurrency: Episodes this runner runs at the same time.
        name: How the trainer's records name this runner (default: host name and process id).
        episode_timeout_s: Seconds one episode may run before it is recorded as timed out.
        max_rollouts: Stop after this many uploads (None: run until stopped).
    """
    return asyncio.run(
        arun_runner(
            agent,
            trainer_url,
            api_key,
            concurrency=concurrency,
            name=name,
            episode_timeout_s=episode_timeout_s,
            max_rollouts=max_rollouts,
        )
    )


async def arun_runner(
    agent: Callable[..., Any],
    trainer_url: str,
    api_key: str,
    *,
    concurrency: int = 1,
    name: str | None = None,
    episode_timeout_s: float = 300.0,
    max_rollouts: int | None = None,
) -> int:
    """`run_runner` inside a running event loop."""
    if not callable(agent):
        raise TypeError(f"agent must be callable (your @trace_agent function), got {type(agent).__name__}.")
    if concurrency < 1:
        raise ValueError(f"concurrency={concurrency} must be at least 1.")
    from lightning_sdk.tracing.decorators import trace_agent

    if getattr(agent, "__lightning_sdk_agent__", None) is None:
        agent = trace_agent(agent)
    runner = name or f"{socket.gethostname()}-{os.getpid()}"
    # The runner holds the key from here on. The agent's tools (subprocesses it starts inherit this
    # environment) have no use for the runner protocol's variable; the agent's model clients get the
    # endpoint's URL and key through OPENAI_* / ANTHROPIC_* (and `llm=`), set for each lease below.
    os.environ.pop(KEY_VARIABLE, None)
    client = TrainerClient(trainer_url, api_key)
    uploaded = _Counter(max_rollouts)
    log.info("runner %s: serving rollouts for %s (concurrency %d)", runner, client.trainer_url, concurrency)
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="lightning-runner") as executor:
        slots = [
            _serve_slot(
                agent,
                client,
                api_key,
                f"{runner}/{slot}" if concurrency > 1 else runner,
                executor,
                episode_timeout_s,
                uploaded,
            )
            for slot in range(concurrency)
        ]
        try:
            await asyncio.gather(*slots)
        finally:
            await client.close()
            executor.shutdown(wait=False, cancel_futures=True)
    return uploaded.count


class _Counter:
    def __init__(self, limit: int | None) -> None:
        self.count, self.limit = 0, limit

    @property
    def done(self) -> bool:
        return self.limit is not None and self.count >= self.limit


async def _serve_slot(
    agent: Callable[..., Any],
    client: TrainerClient,
    api_key: str,
    runner: str,
    executor: ThreadPoolExecutor,
    episode_timeout_s: float,
    uploaded: _Counter,
) -> None:
    try:
        while not uploaded.done:
            await _serve_one(agent, client, api_key, runner, executor, episode_timeout_s, uploaded)
    except TrainingOver as over:
        log.info("runner %s: the trainer says training is over (%s); stopping", runner, over)


async def _serve_one(
    agent: Callable[..., Any],
    client: TrainerClient,
    api_key: str,
    runner: str,
    executor: ThreadPoolExecutor,
    episode_timeout_s: float,
    uploaded: _Counter,
) -> None:
    """Lease one rollout, run it, upload its episode (`TrainingOver` when the trainer has no more)."""
    wants_llm = agent_accepts_llm(agent)
    lease = await client.lease(runner)
    if lease is None:  # nothing to run (a trainer between steps): ask again soon
        await asyncio.sleep(1.0)
        return
    # Default openai and anthropic clients built inside the agent read these (the same base URL for every
    # lease of a trainer; updated per lease, since a restarted trainer may listen elsewhere).
    # The agent gets the key for model calls only: its tools may read OPENAI_API_KEY, and the run's key
    # would let them lease and upload (`serving/keys.py`).
    endpoint = LLMEndpoint(lease.base_url, model_key(api_key), "default")
    os.environ.update({name: value for name, value in endpoint.env.items() if name != "OPENAI_MODEL"})
    kwargs = {"llm": endpoint} if wants_llm else {}
    paused = [lease.paused_s]  # the trainer's clock of time held for updates, as the last renewal said

    async def ask_again() -> None:  # before the limit is taken as passed: an update may have begun since
        paused[0] = (await client.renew(lease)).paused_s

    keep_alive = asyncio.create_task(_renew_until_cancelled(client, lease, paused))
    try:
        rollout = await run_episode(
            agent,
            lease.task,
            kwargs,
            executor,
            episode_timeout_s,
            None,
            _router(lease, api_key),
            pauses=UpdatePauses(lambda: paused[0], ask_again),
        )
    finally:
        keep_alive.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keep_alive
    episode = rollout.episode
    episode.metadata.update(
        rollout_id=lease.rollout_id,
        attempt=lease.attempt,
        runner=runner,
        policy_version=lease.policy_version,
        base_url=lease.base_url,
    )
    if await _upload(client, lease, episode.to_dict()):
        uploaded.count += 1


def _router(lease: GrantedLease, api_key: str) -> Router | None:
    """Sends the agent's model calls to the trainer's endpoint, as in the trainer's own process: a client
    the agent built at import time, pointed elsewhere, trains too."""
    try:
        roles = lease.roles.roles() if lease.roles is not None else None
        return Router(lease.base_url, model_key(api_key), compile_routes(lease.routes, roles), roles)
    except ValueError as error:  # the trainer checked the map; a newer trainer's may not parse here
        log.error(
            "rollout %s: the trainer's routes cannot be used (%s); calls are not redirected",
            lease.rollout_id,
            error,
        )
        return None


async def _renew_until_cancelled(client: TrainerClient, lease: GrantedLease, paused: list[float]) -> None:
    """Renew the lease until cancelled; `paused[0]` follows the trainer's clock of time held for updates,
    which the episode's own time limit leaves out (as the trainer's limit on the lease does)."""
    while True:
        await asyncio.sleep(lease.renew_within_s / 3)
        try:
            paused[0] = (await client.renew(lease)).paused_s
        except ProtocolRefusal as refusal:
            log.warning("rollout %s: %s; the episode will not be kept", lease.rollout_id, refusal)
            return


async def _upload(client: TrainerClient, lease: GrantedLease, episode: dict[str, Any]) -> bool:
    try:
        await client.upload(lease, episode)
        return True
    except TrainingOver:
        raise  # nothing more is stored: the slot stops
    except ProtocolRefusal as refusal:
        if refusal.status in (404, 409):  # the step is over, or another runner has the rollout now
            log.warning("rollout %s: the trainer did not keep this episode (%s)", lease.rollout_id, refusal)
            return False
        if refusal.status == 400:  # not valid: the trainer ended the lease and gives the rollout to another
            log.error(
                "rollout %s: episode refused (%s); the trainer runs it again", lease.rollout_id, refusal
            )
            return False
        # A refused episode that left the lease held (too large, 413): report the failure instead, so the
        # rollout ends now rather than being re-run after its lease expires.
        log.error("rollout %s: episode refused (%s); reporting it as failed", lease.rollout_id, refusal)
        failed = {key: episode[key] for key in ("id", "name", "metadata", "started_at", "ended_at")}
        failed["error"] = {"type": "EpisodeRefused", "message": str(refusal), "traceback": ""}
        with contextlib.suppress(ProtocolRefusal):
            await client.upload(lease, failed)
        return False
