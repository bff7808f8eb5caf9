"""Running the agent, here or elsewhere: everything between "run this task" and "here is its episode".

- `in_process`: the agent runs `group_size` times per task in the trainer's process, concurrently;
- `queue`: rollouts waiting for runners, the leases they hold, and what came back;
- `schemas`: the runner protocol's wire bodies, imported by the routes and the runner client alike;
- `routes`, `gateway`: the protocol's HTTP routes on the trainer's server, and the gateway that records
  agents which cannot record themselves;
- `runners`, `ray_runners`, `remote`: runner processes and Ray actors the trainer starts, and the
  trainer's side of a step run on runners;
- `runner/`: the runner itself (`lightning-sdk runner`), the recording side only.

Nothing here imports the trainer, torch or vLLM (`tests/test_layout.py` checks it).
"""

from __future__ import annotations

from lightning_sdk.rollouts.queue import Lease, LeaseLost, Outcome, RolloutQueue, RolloutSpec, UnknownRollout

__all__ = ["Lease", "LeaseLost", "Outcome", "RolloutQueue", "RolloutSpec", "UnknownRollout"]
