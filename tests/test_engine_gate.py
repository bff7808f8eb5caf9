"""RequestGate: a call made while the weights change waits, then goes on; closing waits for running ones."""

from __future__ import annotations

import asyncio
import signal
import threading
import time

import pytest

from lightning_sdk.engine.gate import RequestGate


def test_a_call_made_while_closed_waits_and_runs_once_the_gate_opens() -> None:
    gate = RequestGate()
    gate.close()
    order: list[str] = []

    async def call() -> None:
        await gate.enter()
        order.append("call ran")
        gate.leave()

    async def scenario() -> None:
        task = asyncio.create_task(call())
        await asyncio.sleep(0.1)
        assert gate.held == 1 and not order  # held, neither failed nor run
        order.append("weights changed")
        await asyncio.to_thread(gate.open)  # the trainer opens it from its own thread
        await asyncio.wait_for(task, 5)

    asyncio.run(scenario())
    assert order == ["weights changed", "call ran"] and gate.held == 0 and gate.in_flight == 0


def test_closing_waits_for_the_calls_already_running() -> None:
    gate = RequestGate()
    gate.enter_blocking()  # one call running
    closed = threading.Event()
    closer = threading.Thread(target=lambda: (gate.close(), closed.set()))
    closer.start()
    assert not closed.wait(0.2)  # still waiting for the running call
    gate.leave()
    assert closed.wait(5)
    closer.join()
    assert not gate.is_open
    gate.open()


def test_a_blocking_call_waits_too_and_busy_time_counts_only_calls_in_flight() -> None:
    gate = RequestGate()
    gate.close()
    ran = threading.Event()

    def blocking_call() -> None:
        gate.enter_blocking()
        time.sleep(0.2)
        gate.leave()
        ran.set()

    worker = threading.Thread(target=blocking_call)
    worker.start()
    time.sleep(0.3)
    assert not ran.is_set() and gate.busy_seconds() == 0.0  # held calls are not engine work
    gate.open()
    assert ran.wait(5)
    worker.join()
    assert 0.15 <= gate.busy_seconds() < 2.0


def test_a_close_that_times_out_reopens_the_gate_and_says_why() -> None:
    gate = RequestGate()
    gate.enter_blocking()
    with pytest.raises(TimeoutError, match="1 model calls were still running"):
        gate.close(timeout_s=0.1)
    assert gate.is_open
    gate.leave()


def test_a_close_interrupted_by_ctrl_c_opens_the_gate_again() -> None:
    """Ctrl+C while the trainer waits for running calls must not leave every later call held for good."""
    gate = RequestGate()
    gate.enter_blocking()  # a call that never finishes

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(KeyboardInterrupt):
            gate.close()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert gate.is_open
    gate.enter_blocking()  # a new call is admitted at once, not held
    assert gate.in_flight == 2


def test_a_held_call_whose_caller_gave_up_leaves_nothing_behind() -> None:
    gate = RequestGate()
    gate.close()

    async def scenario() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(gate.enter(), 0.1)

    asyncio.run(scenario())
    assert gate.held == 0 and gate.in_flight == 0
    gate.open()  # its loop is closed: opening must not fail
    gate.close(timeout_s=1)  # nothing counted in flight
