"""Rollouts out of the trainer's process: the queue runners lease rollouts from, and its HTTP routes.

The trainer side of the runner protocol (`lightning_sdk.runner` is the runners' side). Nothing here imports
torch or vLLM.
"""

from __future__ import annotations

from lightning_sdk.rollouts.queue import Lease, LeaseLost, Outcome, RolloutQueue, RolloutSpec, UnknownRollout

__all__ = ["Lease", "LeaseLost", "Outcome", "RolloutQueue", "RolloutSpec", "UnknownRollout"]
