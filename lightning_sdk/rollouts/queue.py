"""`RolloutQueue`: the trainer's rollouts waiting for runners, the leases runners hold, and what came back.

The trainer submits one rollout per (task, sample) of a step and waits for all of them. Runners, in other
processes or on other machines, lease a rollout, run the agent and upload the recorded episode. The rules:

- a rollout belongs to one lease at a time; a lease carries the policy version the rollout was issued under;
- a lease expires when its runner stops renewing it (it died or lost the network) or when the episode ran
  past the episode time limit (it hangs); the rollout is then issued again, up to `max_attempts` times,
  after which it counts as a failed episode with the reason;
- while the server answers a request made under a lease (the gateway's, `begin_serving`), it does not
  lapse for want of renewal: the runner is waiting on us, and a slow engine is no sign that it died. The
  episode time limit still holds, and the renewal clock restarts when the answer is done;
- an upload is accepted once: the same upload again (same lease) is answered as already stored, an upload
  under a lease the rollout no longer has is refused (`LeaseLost`), never mixed in;
- a body the trainer refuses (an episode or reward that does not validate) under the lease that holds the
  rollout ends that lease at once (`refuse`): the rollout goes to the next runner, as after an expired
  lease, and counts against `max_attempts`. A rollout that used its attempts is dropped with a warning and
  comes back as a failed episode: one bad runner costs the run some rollouts, never the run.

Plain data and a lock: no HTTP here (see `lightning_sdk.rollouts.routes`), no torch. A lease is the wire's
`Lease` (`lightning_sdk.rollouts.schemas`): what the queue grants is what the lease route sends.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from lightning_sdk.rollouts.schemas import Lease

__all__ = ["Lease", "LeaseLost", "Outcome", "RolloutQueue", "RolloutSpec", "UnknownRollout"]

log = logging.getLogger("lightning_sdk.rollouts")


class UnknownRollout(KeyError):
    """No rollout with this id is open (never issued, or its step is over)."""


class LeaseLost(RuntimeError):
    """The rollout is not (or no longer) leased under this lease: it expired and went to another runner,
    or the rollout already has its episode."""


@dataclass(frozen=True)
class RolloutSpec:
    """One run of the agent that the trainer asks for."""

    rollout_id: str
    task: Any
    """The task, as JSON-ready data."""
    policy_version: Any = None
    """The version of the weights the engine serves while this rollout is open."""


@dataclass
class Outcome:
    """What became of a rollout: its uploaded episode (a JSON dict), or why there is none."""

    rollout_id: str
    episode: dict[str, Any] | None
    failure: str | None
    attempts: int
    runner: str | None


@dataclass
class _Entry:
    spec: RolloutSpec
    attempts: int = 0
    lease: Lease | None = None
    """The lease that holds the rollout now, if one does."""
    runner: str | None = None
    renew_by: float = 0.0
    finish_by: float = 0.0
    serving: int = 0
    """Requests under the current lease the server is answering now (`RolloutQueue.begin_serving`)."""
    paused_at_grant: float = 0.0
    """The queue's `paused_s` clock when the current lease was granted."""
    outcome: Outcome | None = None
    finished_lease: str | None = None
    history: list[str] = field(default_factory=list)

    @property
    def lease_id(self) -> str | None:
        return None if self.lease is None else self.lease.lease_id


class RolloutQueue:
    """Thread-safe queue of rollouts with expiring leases (see the module docstring).

    Args:
        lease_timeout_s: A lease not renewed for this long expires.
        episode_timeout_s: A lease older than this (plus `lease_timeout_s`) expires even while renewed: the
            agent hangs.
        max_attempts: Leases a rollout may get before it counts as failed.
        clock: Monotonic seconds (tests pass their own).
        paused_s: Seconds the trainer has held model calls for its updates (the engine's gate), on the
            same scale as `clock`: the episode time limit of a lease leaves them out, and leases and
            renewals tell runners, whose own limit does the same. None: never paused.
    """

    def __init__(
        self,
        lease_timeout_s: float = 30.0,
        episode_timeout_s: float = 300.0,
        max_attempts: int = 3,
        clock: Callable[[], float] = time.monotonic,
        paused_s: Callable[[], float] | None = None,
    ) -> None:
        if lease_timeout_s <= 0 or episode_timeout_s <= 0 or max_attempts < 1:
            raise ValueError("lease_timeout_s and episode_timeout_s must be > 0 and max_attempts >= 1.")
        self.lease_timeout_s = lease_timeout_s
        self.episode_timeout_s = episode_timeout_s
        self.max_attempts = max_attempts
        self._clock = clock
        self.paused_s: Callable[[], float] = paused_s if paused_s is not None else _never_paused
        self._entries: dict[str, _Entry] = {}
        self._pending: deque[str] = deque()
        self._changed = threading.Condition()
        self._counter = itertools.count()
        self._closed_because: str | None = None

    # -- the trainer's side ------------------------------------------------------------------------------
    def submit(self, specs: Iterable[RolloutSpec]) -> list[str]:
        """Open rollouts for runners to lease; returns their ids."""
        with self._changed:
            ids = []
            for spec in specs:
                if spec.rollout_id in self._entries:
                    raise ValueError(f"rollout {spec.rollout_id!r} is already open")
                self._entries[spec.rollout_id] = _Entry(spec)
                self._pending.append(spec.rollout_id)
                ids.append(spec.rollout_id)
            self._changed.notify_all()
            return ids

    def new_id(self) -> str:
        """A fresh rollout id (unguessable, so that a runner cannot upload for rollouts it never saw)."""
        return f"ro-{next(self._counter)}-{secrets.token_hex(6)}"

    def wait(
        self,
        rollout_ids: Iterable[str],
        timeout_s: float | None = None,
        poll_s: float = 0.5,
        on_poll: Callable[[], None] | None = None,
    ) -> list[Outcome]:
        """Block until every rollout has an outcome (episode or failure), expiring leases meanwhile, then
        close them and return the outcomes in the given order. On `timeout_s`, the rollouts still open
        fail with that reason. `on_poll()` runs every `poll_s` while waiting (progress, restarts)."""
        ids = list(rollout_ids)
        deadline = None if timeout_s is None else self._clock() + timeout_s
        with self._changed:
            while True:
                self._expire_leases()
                if all(self._entries[i].outcome is not None for i in ids):
                    break
                if deadline is not None and self._clock() >= deadline:
                    for i in ids:
                        self._finish_failed(self._entries[i], f"no episode within {timeout_s:g} s")
                    break
                self._changed.wait(poll_s)
                if on_poll is not None:
                    on_poll()
            outcomes = [self._entries[i].outcome for i in ids]
            for i in ids:  # closed: a late upload for these is refused as unknown
                del self._entries[i]
            self._pending = deque(i for i in self._pending if i in self._entries)
            return outcomes  # type: ignore[return-value]

    def close(self, reason: str) -> None:
        """The run is ending: fail every open rollout, and answer waiting and later lease requests with none
        at once (so that the server can stop without cutting long polls off); `closed_because` says why, so
        that the routes can tell runners that training is over."""
        with self._changed:
            self._closed_because = reason
            for entry in self._entries.values():
                self._finish_failed(entry, reason)
            self._changed.notify_all()

    @property
    def closed_because(self) -> str | None:
        """Why the queue was closed (`close(reason)`), or None while the run goes on."""
        return self._closed_because

    # -- the runners' side --------------------------------------------------------------------------------
    def lease(self, runner: str, wait_s: float = 0.0) -> Lease | None:
        """The next open rollout for `runner`, waiting up to `wait_s` for one; None when there is none."""
        deadline = self._clock() + wait_s
        with self._changed:
            while self._closed_because is None:
                self._expire_leases()
                while self._pending:
                    entry = self._entries.get(self._pending.popleft())
                    if entry is not None and entry.outcome is None and entry.lease_id is None:
                        return self._grant(entry, runner)
                remaining = deadline - self._clock()
                if remaining <= 0:
                    return None
                self._changed.wait(min(remaining, 0.5))
            return None

    def renew(self, rollout_id: str, lease_id: str) -> float:
        """Keep a lease alive; returns the seconds until it must be renewed again."""
        with self._changed:
            entry = self._leased(rollout_id, lease_id)
            entry.renew_by = self._clock() + self.lease_timeout_s
            return self.lease_timeout_s

    def begin_serving(self, rollout_id: str, lease_id: str) -> None:
        """A request under this lease is being answered: the lease holds (for want of renewal) until the
        matching `end_serving`. Raises `LeaseLost` or `UnknownRollout` as `renew` does."""
        with self._changed:
            entry = self._leased(rollout_id, lease_id)
            entry.serving += 1
            entry.renew_by = self._clock() + self.lease_timeout_s

    def end_serving(self, rollout_id: str, lease_id: str) -> None:
        """The answer begun with `begin_serving` is done: the renewal clock restarts now. Nothing happens
        when the lease was lost meanwhile (the episode time limit ran out)."""
        with self._changed:
            entry = self._entries.get(rollout_id)
            if entry is None or entry.lease_id != lease_id or entry.serving == 0:
                return
            entry.serving -= 1
            entry.renew_by = self._clock() + self.lease_timeout_s

    def leased(self, rollout_id: str, lease_id: str) -> Lease:
        """The lease that holds the rollout, when it is `lease_id` (else `LeaseLost` or `UnknownRollout`)."""
        with self._changed:
            lease = self._leased(rollout_id, lease_id).lease
            assert lease is not None  # for the type checker: _leased checked that this lease holds it
            return lease

    def complete(self, rollout_id: str, lease_id: str, episode: dict[str, Any]) -> bool:
        """Store the episode of a leased rollout. True when stored now, False when this lease had already
        stored it (a retried upload). Raises `LeaseLost` or `UnknownRollout` otherwise."""
        with self._changed:
            entry = self._entries.get(rollout_id)
            if entry is None:
                raise UnknownRollout(rollout_id)
            if entry.outcome is not None and entry.finished_lease == lease_id and entry.outcome.episode:
                return False
            entry = self._leased(rollout_id, lease_id)
            entry.outcome = Outcome(rollout_id, episode, None, entry.attempts, entry.runner)
            entry.finished_lease, entry.lease = lease_id, None
            self._changed.notify_all()
            return True

    def refuse(self, rollout_id: str, lease_id: str, reason: str) -> bool:
        """The runner holding the rollout under `lease_id` sent a body the trainer refused (`reason`): end
        the lease now and issue the rollout again (or drop it, when it used its `max_attempts`). Returns
        False, changing nothing, when this lease does not hold the rollout (a stranger cannot take a
        rollout from the runner that holds it)."""
        with self._changed:
            entry = self._entries.get(rollout_id)
            if entry is None or entry.outcome is not None or entry.lease_id != lease_id:
                return False
            self._lose_lease(entry, f"sent a body the trainer refused ({reason})")
            return True

    def task(self, rollout_id: str) -> Any:
        """The task of an open rollout (`UnknownRollout` when it is not open)."""
        with self._changed:
            entry = self._entries.get(rollout_id)
            if entry is None:
                raise UnknownRollout(rollout_id)
            return entry.spec.task

    def stats(self) -> dict[str, int]:
        """Open rollouts by state, for progress output and the status route."""
        with self._changed:
            self._expire_leases()
            states = [
                ("done" if e.outcome else "leased" if e.lease_id else "pending")
                for e in self._entries.values()
            ]
            return {state: states.count(state) for state in ("pending", "leased", "done")}

    # -- internals ----------------------------------------------------------------------------------------
    def _grant(self, entry: _Entry, runner: str) -> Lease:
        now = self._clock()
        entry.attempts += 1
        entry.runner = runner
        entry.renew_by = now + self.lease_timeout_s
        entry.finish_by = now + self.episode_timeout_s + self.lease_timeout_s
        entry.serving = 0
        entry.paused_at_grant = self.paused_s()
        spec = entry.spec
        entry.lease = Lease(
            rollout_id=spec.rollout_id,
            lease_id=secrets.token_hex(8),
            task=spec.task,
            policy_version=spec.policy_version,
            attempt=entry.attempts,
            renew_within_s=self.lease_timeout_s,
            paused_s=entry.paused_at_grant,
        )
        return entry.lease

    def _leased(self, rollout_id: str, lease_id: str) -> _Entry:
        entry = self._entries.get(rollout_id)
        if entry is None:
            raise UnknownRollout(rollout_id)
        self._expire_leases()
        if entry.lease_id != lease_id:
            why = "it already has its episode" if entry.outcome is not None else "the lease expired"
            raise LeaseLost(f"rollout {rollout_id} is not leased under {lease_id}: {why}")
        return entry

    def _expire_leases(self) -> None:
        now, paused = self._clock(), self.paused_s()
        for entry in self._entries.values():
            if entry.lease_id is None or entry.outcome is not None:
                continue
            finish_by = entry.finish_by + (
                paused - entry.paused_at_grant
            )  # the updates' time is not the agent's
            if (now < entry.renew_by or entry.serving) and now < finish_by:
                continue
            # The time limit first: a lease held while a request is answered may also be past renew_by.
            reason = "ran past the episode time limit" if now >= finish_by else "stopped renewing its lease"
            self._lose_lease(entry, reason)

    def _lose_lease(self, entry: _Entry, reason: str) -> None:
        """End the entry's lease: issue the rollout again, or fail it once it used its attempts."""
        entry.history.append(f"attempt {entry.attempts} on runner {entry.runner!r} {reason}")
        entry.lease = None
        entry.serving = 0
        if entry.attempts >= self.max_attempts:
            log.warning(
                "rollout %s dropped after %d attempts (max_attempts): %s",
                entry.spec.rollout_id,
                entry.attempts,
                "; ".join(entry.history),
            )
            self._finish_failed(entry, "; ".join(entry.history))
        else:
            self._pending.append(entry.spec.rollout_id)
        self._changed.notify_all()

    def _finish_failed(self, entry: _Entry, reason: str) -> None:
        if entry.outcome is None:
            entry.outcome = Outcome(entry.spec.rollout_id, None, reason, entry.attempts, entry.runner)
            entry.lease = None


def _never_paused() -> float:
    return 0.0
