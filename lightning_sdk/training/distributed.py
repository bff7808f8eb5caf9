"""One multi-GPU node under `torchrun`: each rank runs its own engine and rollouts on its share of the
batch, LoRA gradients are all-reduced (DDP), rank 0 writes checkpoints and metrics.

Without `torchrun` (no `WORLD_SIZE` in the environment) everything here is a no-op.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

__all__ = ["Distributed"]


@dataclass
class Distributed:
    """This process's place in a `torchrun` job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    initialized_here: bool = False

    @classmethod
    def from_environment(cls) -> Distributed:
        """Read `RANK`/`WORLD_SIZE`/`LOCAL_RANK` set by torchrun; start the process group when > 1 rank."""
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if world_size <= 1:
            return cls()
        import torch
        import torch.distributed as dist

        initialized_here = False
        if not dist.is_initialized():
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            dist.init_process_group(backend=backend)
            initialized_here = True
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if torch.cuda.is_available():
            torch.cuda.set_device(local_rank)
        return cls(dist.get_rank(), dist.get_world_size(), local_rank, initialized_here)

    @property
    def is_main(self) -> bool:
        """True on rank 0, which writes checkpoints, metrics and reports."""
        return self.rank == 0

    def wrap(self, model: Any) -> Any:
        """The model wrapped in DistributedDataParallel when there are several ranks."""
        if self.world_size == 1:
            return model
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [self.local_rank] if next(model.parameters()).is_cuda else None
        return DistributedDataParallel(model, device_ids=device_ids)

    @staticmethod
    def unwrap(model: Any) -> Any:
        """The peft model inside a DDP wrapper (or the model itself)."""
        return getattr(model, "module", model)

    def shard(self, items: list[Any]) -> list[Any]:
        """This rank's share of the step's tasks: every `world_size`-th, starting at `rank`."""
        return items if self.world_size == 1 else items[self.rank :: self.world_size]

    def balance(self, samples: list[Any], minimum_per_rank: int) -> list[Any]:
        """Even out the samples across ranks, so that every rank makes the same number of all-reduces.

        Groups with no reward spread give no samples, so ranks can end a rollout with very different
        counts; a rank with none would leave the others waiting in the all-reduce. When the whole step
        has fewer than `minimum_per_rank` samples per rank, every rank skips the update.
        """
        if self.world_size == 1:
            return samples
        import torch.distributed as dist

        gathered: list[list[Any] | None] = [None] * self.world_size
        dist.all_gather_object(gathered, samples)
        everything = [sample for part in gathered for sample in (part or [])]
        if len(everything) < self.world_size * minimum_per_rank:
            return []
        return everything[self.rank :: self.world_size]

    def mean_metrics(self, values: dict[str, float]) -> dict[str, float]:
        """Evaluation metrics over every rank's share, weighted by its episode count."""
        return values if self.world_size == 1 else _average(values, "episodes", self.world_size)

    def barrier(self) -> None:
        """Wait for every rank (no-op with one rank)."""
        if self.world_size > 1:
            import torch.distributed as dist

            dist.barrier()

    def close(self) -> None:
        """End the process group if this object started it."""
        if self.initialized_here:
            import torch.distributed as dist

            dist.destroy_process_group()


def _average(values: dict[str, float], weight_key: str, world_size: int) -> dict[str, float]:
    """Weighted average of per-rank metric dicts gathered with all_gather_object."""
    import torch.distributed as dist

    gathered: list[dict[str, float] | None] = [None] * world_size
    dist.all_gather_object(gathered, values)
    parts = [part for part in gathered if part]
    total = sum(part.get(weight_key, 0.0) for part in parts)
    merged: dict[str, float] = {weight_key: total}
    for key in values:
        if key == weight_key:
            continue
        if key.endswith("_failed"):
            merged[key] = sum(part[key] for part in parts)
        else:
            merged[key] = sum(part[key] * part.get(weight_key, 0.0) for part in parts) / total if total else 0.0
    return merged
