"""The rollout queue's rules: one lease at a time, expiry and re-issue, bounded attempts, one upload."""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any

import pytest

from lightning_sdk.rollouts import LeaseLost, RolloutQueue, RolloutSpec, UnknownRollout


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def open_queue(clock: Clock, count: int = 1, **options) -> tuple[RolloutQueue, list[str]]:
    queue = RolloutQueue(lease_timeout_s=10, episode_timeout_s=100, clock=clock, **options)
    ids = queue.submit(RolloutSpec(f"r{i}", {"question": i}, policy_version=7) for i in range(count))
    return queue, ids


def test_a_rollout_goes_to_one_runner_with_its_task_and_policy_version(clock) -> None:
    queue, _ = open_queue(clock)
    lease = queue.lease("a")
    assert (lease.rollout_id, lease.task, lease.policy_version, lease.attempt) == (
        "r0",
        {"question": 0},
        7,
        1,
    )
    assert queue.lease("b") is None  # leased already
    assert queue.stats() == {"pending": 0, "leased": 1, "done": 0}


def test_upload_is_stored_once_and_a_repeat_is_recognised(clock) -> None:
    queue, ids = open_queue(clock)
    lease = queue.lease("a")
    assert queue.complete("r0", lease.lease_id, {"id": "e1"}) is True
    assert queue.complete("r0", lease.lease_id, {"id": "e1"}) is False  # retried upload: not stored twice
    [outcome] = queue.wait(ids, timeout_s=0)
    assert (outcome.episode, outcome.failure, outcome.attempts, outcome.runner) == (
        {"id": "e1"},
        None,
        1,
        "a",
    )


def test_an_unrenewed_lease_expires_and_the_rollout_goes_to_another_runner(clock) -> None:
    queue, ids = open_queue(clock)
    first = queue.lease("a")
    clock.now = 5
    queue.renew("r0", first.lease_id)  # renewing keeps it
    clock.now = 14
    assert queue.lease("b") is None
    clock.now = 15.1  # 10 s after the last renewal: runner "a" is gone
    second = queue.lease("b")
    assert (second.rollout_id, second.attempt) == ("r0", 2)
    with pytest.raises(LeaseLost, match="the lease expired"):  # the late runner is refused, never mixed in
        queue.complete("r0", first.lease_id, {"id": "late"})
    with pytest.raises(LeaseLost):
        queue.renew("r0", first.lease_id)
    queue.complete("r0", second.lease_id, {"id": "e2"})
    [outcome] = queue.wait(ids, timeout_s=0)
    assert outcome.episode == {"id": "e2"} and outcome.runner == "b" and outcome.attempts == 2


def test_a_hanging_agent_loses_its_lease_even_while_renewing(clock) -> None:
    queue, _ = open_queue(clock)
    lease = queue.lease("a")
    for now in range(5, 110, 5):
        clock.now = now
        queue.renew("r0", lease.lease_id)
    clock.now = 111  # past the episode limit (100 s) plus the lease timeout
    assert queue.lease("b").attempt == 2


def test_the_time_an_update_held_calls_moves_the_episode_limit_and_renewals_say_so(clock) -> None:
    paused = Clock()  # seconds the trainer held model calls for its updates
    paused.now = 3.0
    queue, _ = open_queue(clock, paused_s=paused)
    lease = queue.lease("a")
    assert lease.paused_s == 3.0  # the runner's own limit starts from the same clock
    for now in range(5, 150, 5):
        clock.now = now
        paused.now = 3.0 + min(now, 40)  # updates held calls for 40 s of the episode
        queue.renew("r0", lease.lease_id)
    assert queue.lease("b") is None  # at 145 s: past 110 s, but 40 s of it were the updates'
    clock.now = 151  # past the limit (100 s) plus the lease timeout plus the pauses
    assert queue.lease("b").attempt == 2


def test_after_max_attempts_the_rollout_fails_with_the_reasons(clock) -> None:
    queue, ids = open_queue(clock, max_attempts=2)
    queue.lease("a")
    clock.now = 11
    queue.lease("b")
    clock.now = 22
    assert queue.lease("c") is None  # no third attempt
    [outcome] = queue.wait(ids, timeout_s=0)
    assert outcome.episode is None and outcome.attempts == 2
    assert outcome.failure == (
        "attempt 1 on runner 'a' stopped renewing its lease; "
        "attempt 2 on runner 'b' stopped renewing its lease"
    )


def test_closed_and_unknown_rollouts_refuse_uploads(clock) -> None:
    queue, ids = open_queue(clock)
    lease = queue.lease("a")
    queue.complete("r0", lease.lease_id, {"id": "e"})
    queue.wait(ids, timeout_s=0)
    with pytest.raises(UnknownRollout):  # the step is over: a very late upload cannot land in the next one
        queue.complete("r0", lease.lease_id, {"id": "e"})
    with pytest.raises(UnknownRollout):
        queue.renew("nope", "x")


def test_wait_times_out_the_rest(clock) -> None:
    queue, ids = open_queue(clock, count=2)
    lease = queue.lease("a")
    queue.complete(lease.rollout_id, lease.lease_id, {"id": "e"})
    outcomes = queue.wait(ids, timeout_s=0)
    assert [o.failure for o in outcomes] == [None, "no episode within 0 s"]


def test_waiting_runners_get_rollouts_as_they_open() -> None:
    queue = RolloutQueue(lease_timeout_s=10)
    got = []
    waiter = threading.Thread(target=lambda: got.append(queue.lease("a", wait_s=10)))
    waiter.start()
    queue.submit([RolloutSpec("r0", {})])
    waiter.join(5)
    assert got and got[0].rollout_id == "r0"


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="max_attempts >= 1"):
        RolloutQueue(max_attempts=0)
    queue = RolloutQueue()
    queue.submit([RolloutSpec("r0", {})])
    with pytest.raises(ValueError, match="already open"):
        queue.submit([RolloutSpec("r0", {})])


def test_closing_fails_what_is_open_and_ends_long_polls_at_once(clock) -> None:
    queue, ids = open_queue(clock, count=1)
    queue.lease("a")
    waiting = []
    waiter = threading.Thread(target=lambda: waiting.append(queue.lease("b", wait_s=3600)))
    waiter.start()
    queue.close("the training run ended")
    waiter.join(5)
    assert waiting == [None]  # the long poll did not have to run out
    assert queue.lease("c", wait_s=3600) is None
    assert [o.failure for o in queue.wait(ids, timeout_s=0)] == ["the training run ended"]


def test_a_closed_queue_says_why(clock) -> None:
    queue, _ = open_queue(clock)
    assert queue.closed_because is None
    queue.close("the training run ended")
    assert queue.closed_because == "the training run ended"  # the routes answer 410 with it


def test_the_lease_that_holds_a_rollout_is_found_by_its_id(clock) -> None:
    queue, _ = open_queue(clock)
    lease = queue.lease("a")
    assert queue.leased("r0", lease.lease_id) == lease
    with pytest.raises(LeaseLost):
        queue.leased("r0", "another")
    with pytest.raises(UnknownRollout):
        queue.leased("nope", lease.lease_id)
    clock.now = 11  # expired: the lease holds nothing any more
    with pytest.raises(LeaseLost, match="the lease expired"):
        queue.leased("r0", lease.lease_id)


def test_a_lease_holds_while_the_server_answers_under_it(clock) -> None:
    queue, _ = open_queue(clock)
    lease = queue.lease("a")
    queue.begin_serving("r0", lease.lease_id)
    queue.begin_serving("r0", lease.lease_id)  # two requests at once
    clock.now = 50.0  # far past the renewal time: a slow engine, not a dead runner
    assert queue.stats()["leased"] == 1 and queue.leased("r0", lease.lease_id) == lease
    queue.end_serving("r0", lease.lease_id)
    clock.now = 80.0
    assert queue.stats()["leased"] == 1  # the other request is still being answered
    queue.end_serving("r0", lease.lease_id)  # the renewal clock restarts here, at 80
    clock.now = 89.0
    queue.renew("r0", lease.lease_id)
    clock.now = 99.5
    with pytest.raises(LeaseLost, match="expired"):
        queue.renew("r0", lease.lease_id)  # not renewed for 10.5 s after the answer
    queue.end_serving("r0", lease.lease_id)  # a lost lease's late end changes nothing
    assert queue.lease("b").attempt == 2


def test_the_episode_time_limit_holds_even_while_a_request_is_answered(clock) -> None:
    queue, _ = open_queue(clock)
    lease = queue.lease("a")
    queue.begin_serving("r0", lease.lease_id)
    clock.now = 110.0  # past episode_timeout_s + lease_timeout_s
    with pytest.raises(LeaseLost):
        queue.leased("r0", lease.lease_id)
    with pytest.raises(LeaseLost):
        queue.begin_serving("r0", lease.lease_id)


async def test_a_streamed_answer_ends_its_hold_however_sending_ends() -> None:
    # The gateway's wrapper of a streamed answer (`routes._SentThen`): `done` runs when the stream was
    # sent, and when the client was gone before the first event (a wrapped body iterator would never
    # start then, and the lease would hold until the episode time limit).
    from starlette.responses import StreamingResponse

    from lightning_sdk.rollouts.routes import _SentThen

    async def events() -> Any:
        yield b"data: 1\n\n"
        yield b"data: 2\n\n"

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def gone(message: dict[str, Any]) -> None:
        raise OSError("the client went away")

    scope = {"type": "http", "asgi": {"spec_version": "2.3"}, "method": "POST", "path": "/", "headers": []}
    for sender in (send, gone):
        done: list[bool] = []
        answer = _SentThen(StreamingResponse(events()), functools.partial(done.append, True))
        with contextlib.suppress(OSError):
            await answer(scope, receive, sender)
        assert done == [True], sender
    assert any(message.get("body") == b"data: 2\n\n" for message in sent)  # sent whole when it could be


def test_a_refused_body_ends_its_lease_and_the_rollout_goes_to_the_next_runner(clock) -> None:
    queue, ids = open_queue(clock)
    bad = queue.lease("bad")
    assert not queue.refuse(ids[0], "not-the-lease", "episode.metadata: ...")  # a stranger changes nothing
    assert queue.refuse(ids[0], bad.lease_id, "episode.metadata: Input should be a valid dictionary")
    with pytest.raises(LeaseLost):
        queue.complete(ids[0], bad.lease_id, {"name": "late"})
    honest = queue.lease("honest")  # at once: no lease had to lapse
    assert honest is not None and honest.attempt == 2
    queue.complete(ids[0], honest.lease_id, {"name": "solver"})
    [outcome] = queue.wait(ids, timeout_s=0)
    assert outcome.episode == {"name": "solver"} and outcome.runner == "honest"


def test_a_rollout_refused_max_attempts_times_is_dropped_with_a_warning(clock, caplog) -> None:
    queue, ids = open_queue(clock, max_attempts=2)
    for _ in range(2):
        lease = queue.lease("bad")
        assert queue.refuse(ids[0], lease.lease_id, "episode.rewards.r: must be a finite number")
    assert queue.lease("honest") is None  # nothing left to run
    [outcome] = queue.wait(ids, timeout_s=0)
    assert outcome.episode is None and outcome.attempts == 2
    assert outcome.failure.count("sent a body the trainer refused (episode.rewards.r") == 2
    [warning] = [record for record in caplog.records if record.levelname == "WARNING"]
    assert f"rollout {ids[0]} dropped after 2 attempts" in warning.getMessage()
