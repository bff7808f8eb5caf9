"""`TrainerClient`: a runner's HTTP calls to the trainer's runner protocol, retried while the trainer is away.

A runner may start before the trainer, and the trainer may restart (resume) while runners keep going, so
every call that cannot reach the trainer (connection refused, timeout, 5xx) is retried with exponential
backoff, saying once per outage what the runner is waiting for. Answers that retrying cannot change (401,
404, 409, other 4xx) come back at once as `ProtocolRefusal`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx

__all__ = ["LeasedRollout", "ProtocolRefusal", "TrainerClient"]

log = logging.getLogger("lightning_sdk.rollouts.runner")


class ProtocolRefusal(RuntimeError):
    """The trainer refused a request (a 4xx other than a long-poll timeout)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


@dataclass(frozen=True)
class LeasedRollout:
    """A lease as the trainer sent it (see `lightning_sdk.rollouts.routes`)."""

    rollout_id: str
    lease_id: str
    task: Any
    policy_version: Any
    attempt: int
    renew_within_s: float
    base_url: str


class TrainerClient:
    """The runner protocol over HTTP.

    Args:
        trainer_url: The trainer's server, e.g. `http://10.0.0.5:8123` (a trailing `/v1` is accepted).
        api_key: The run's key (the trainer prints it, and the command that starts a runner).
        max_backoff_s: Longest pause between two attempts to reach the trainer.
    """

    def __init__(self, trainer_url: str, api_key: str, max_backoff_s: float = 10.0) -> None:
        url = trainer_url.rstrip("/")
        self.trainer_url = url.removesuffix("/v1")
        self._headers = {"Authorization": f"Bearer {api_key}"}
        self._max_backoff_s = max_backoff_s
        self._http = httpx.AsyncClient(base_url=self.trainer_url, headers=self._headers, timeout=60.0)

    async def lease(self, runner: str, wait_s: float = 20.0) -> LeasedRollout | None:
        """The next rollout for this runner, or None when none opened within `wait_s` (a long poll)."""
        response = await self._post("/v1/rollouts/lease", {"runner": runner, "wait_s": wait_s}, wait_s + 30)
        if response.status_code == 204:
            return None
        data = response.json()
        return LeasedRollout(**{name: data[name] for name in LeasedRollout.__dataclass_fields__})

    async def renew(self, lease: LeasedRollout) -> None:
        """Keep the lease (`ProtocolRefusal` 409 when it is lost)."""
        await self._post(f"/v1/rollouts/{lease.rollout_id}/renew", {"lease_id": lease.lease_id}, 30)

    async def upload(self, lease: LeasedRollout, episode: dict[str, Any]) -> bool:
        """Send the episode; True when stored now, False when an earlier try of this upload had stored it."""
        body = {"lease_id": lease.lease_id, "episode": episode}
        response = await self._post(f"/v1/rollouts/{lease.rollout_id}/episode", body, 120)
        return bool(response.json().get("stored"))

    async def close(self) -> None:
        await self._http.aclose()

    async def _post(self, path: str, body: dict[str, Any], timeout_s: float) -> httpx.Response:
        backoff, waiting_since = 0.5, None
        while True:
            try:
                response = await self._http.post(path, json=body, timeout=timeout_s)
            except (httpx.TransportError, httpx.TimeoutException) as error:
                problem = f"cannot reach the trainer at {self.trainer_url} ({type(error).__name__})"
            else:
                if response.status_code < 500:
                    if waiting_since is not None:
                        log.info("the trainer at %s answers again", self.trainer_url)
                    if response.status_code >= 400:
                        raise ProtocolRefusal(response.status_code, _error_message(response))
                    return response
                problem = f"the trainer at {self.trainer_url} answered {response.status_code}"
            if waiting_since is None:
                waiting_since = time.monotonic()
                log.warning("%s; retrying with backoff until it is back", problem)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self._max_backoff_s)


def _error_message(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:500]
