"""`TrainerClient`: a runner's HTTP calls to the trainer's runner protocol, retried while the trainer is away.

A runner may start before the trainer, and the trainer may restart (resume) while runners keep going, so
every call that cannot reach the trainer (connection refused, timeout, 5xx) is retried with exponential
backoff, saying once per outage what the runner is waiting for. Answers that retrying cannot change (401,
404, 409, other 4xx) come back at once as `ProtocolRefusal`; 410, the trainer's word that training is over,
as its subclass `TrainingOver`, on which the runner stops.

The bodies are the wire's models (`lightning_sdk.rollouts.schemas`), the ones the trainer's routes use.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import httpx
from pydantic import BaseModel

from lightning_sdk.rollouts.schemas import (
    EpisodeStored,
    GrantedLease,
    LeaseRequest,
    RenewReply,
    RenewRequest,
)

__all__ = ["LeasedRollout", "ProtocolRefusal", "TrainerClient", "TrainingOver"]

log = logging.getLogger("lightning_sdk.rollouts.runner")


class ProtocolRefusal(RuntimeError):
    """The trainer refused a request (a 4xx other than a long-poll timeout)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


class TrainingOver(ProtocolRefusal):
    """The trainer answered 410: training is over, there is nothing more to run or to upload."""


LeasedRollout = GrantedLease
"""A lease as the trainer sent it: the wire's `GrantedLease` (the name runners used before it existed)."""


class TrainerClient:
    """The runner protocol over HTTP.

    Args:
        trainer_url: The trainer's server, e.g. `http://10.0.0.5:8123` (a trailing `/v1` is accepted).
        api_key: The run's key (in `run_dir/runner.key`; the trainer's start line names the file).
        max_backoff_s: Longest pause between two attempts to reach the trainer.
    """

    def __init__(self, trainer_url: str, api_key: str, max_backoff_s: float = 10.0) -> None:
        url = trainer_url.rstrip("/")
        self.trainer_url = url.removesuffix("/v1")
        self._headers = {"Authorization": f"Bearer {api_key}"}
        self._max_backoff_s = max_backoff_s
        self._http = httpx.AsyncClient(base_url=self.trainer_url, headers=self._headers, timeout=60.0)

    async def lease(self, runner: str, wait_s: float = 20.0) -> GrantedLease | None:
        """The next rollout for this runner, or None when none opened within `wait_s` (a long poll);
        `TrainingOver` when the trainer has no more."""
        asked = LeaseRequest(runner=runner, wait_s=wait_s)
        response = await self._post("/v1/rollouts/lease", asked, wait_s + 30)
        if response.status_code == 204:
            return None
        return GrantedLease.model_validate_json(response.content)

    async def renew(self, lease: GrantedLease) -> RenewReply:
        """Keep the lease (`ProtocolRefusal` 409 when it is lost)."""
        asked = RenewRequest(lease_id=lease.lease_id)
        response = await self._post(f"/v1/rollouts/{lease.rollout_id}/renew", asked, 30)
        return RenewReply.model_validate_json(response.content)

    async def upload(self, lease: GrantedLease, episode: dict[str, Any]) -> bool:
        """Send the episode; True when stored now, False when an earlier try of this upload had stored it."""
        # Not validated here: the trainer checks the episode (`EpisodeUpload`), and a refusal is answered
        # with a failed episode in its place (`worker._upload`). The body's fields are EpisodeUpload's.
        body = {"lease_id": lease.lease_id, "episode": episode}
        response = await self._post(f"/v1/rollouts/{lease.rollout_id}/episode", body, 120)
        return EpisodeStored.model_validate_json(response.content).stored

    async def close(self) -> None:
        await self._http.aclose()

    async def _post(self, path: str, body: BaseModel | dict[str, Any], timeout_s: float) -> httpx.Response:
        backoff, waiting_since = 0.5, None
        # Plain values; httpx writes the JSON as `json.dumps` does.
        payload = body.model_dump() if isinstance(body, BaseModel) else body
        while True:
            try:
                response = await self._http.post(path, json=payload, timeout=timeout_s)
            except (httpx.TransportError, httpx.TimeoutException) as error:
                problem = f"cannot reach the trainer at {self.trainer_url} ({type(error).__name__})"
            else:
                if response.status_code < 500:
                    if waiting_since is not None:
                        log.info("the trainer at %s answers again", self.trainer_url)
                    if response.status_code == 410:
                        raise TrainingOver(410, _error_message(response))
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
