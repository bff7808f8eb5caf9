"""Runners: run a `@trace_agent` agent outside the trainer's process and send its episodes to the trainer.

The recording side only (no torch, no vLLM): a runner leases rollouts from the trainer's server, runs the
agent against the trainer's OpenAI-compatible endpoint, and uploads each recorded episode::

    lightning-sdk runner my_agent:solve --trainer http://10.0.0.5:8123 --key-file runner.key --concurrency 4

or, from Python, `lightning_sdk.runner.run_runner(solve, "http://10.0.0.5:8123", key, concurrency=4)`.
"""

from __future__ import annotations

from lightning_sdk.rollouts.runner.agents import load_agent
from lightning_sdk.rollouts.runner.client import LeasedRollout, ProtocolRefusal, TrainerClient, TrainingOver
from lightning_sdk.rollouts.runner.worker import arun_runner, run_runner

__all__ = [
    "LeasedRollout",
    "ProtocolRefusal",
    "TrainerClient",
    "TrainingOver",
    "arun_runner",
    "load_agent",
    "run_runner",
]
