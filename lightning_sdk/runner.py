"""`lightning_sdk.runner`: the runner's public names, kept at the path the docs and scripts use.

The runner lives with the rest of running the agent, in `lightning_sdk.rollouts.runner`; this module
re-exports it so that `from lightning_sdk.runner import run_runner` keeps working.
"""

from __future__ import annotations

from lightning_sdk.rollouts.runner import (
    LeasedRollout,
    ProtocolRefusal,
    TrainerClient,
    TrainingOver,
    arun_runner,
    load_agent,
    run_runner,
)

__all__ = [
    "LeasedRollout",
    "ProtocolRefusal",
    "TrainerClient",
    "TrainingOver",
    "arun_runner",
    "load_agent",
    "run_runner",
]
