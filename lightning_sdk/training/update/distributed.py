"""One multi-GPU node under `torchrun`: each rank runs its own engine and rollouts on its share of the
batch, LoRA gradients are all-reduced (DDP), rank 0 writes checkpoints and metrics.

Without `torchrun` (no `WORLD_SIZE` in the environment) everything here is a no-op.

Every decision that changes how many collectives a rank makes (how many samples it trains on, when the run
stops) is taken together (`balance`, `any_rank`): a rank that decided alone would leave the others waiting
in a collective until the process group's timeout (`collective_timeout`) ends the job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Literal, TypeAlias, TypeVar, cast

from lightning_sdk.engine.placement import Placement, plan_placement

if TYPE_CHECKING:
    import torch
    from peft import PeftModel
    from torch.nn.parallel import DistributedDataParallel

    from lightning_sdk.training.config import TrainerConfig

    PolicyModel: TypeAlias = PeftModel | DistributedDataParallel
    """The LoRA model being trained: a `PeftModel`, wrapped in `DistributedDataParallel` under torchrun."""

__all__ = ["NCCL_DEFAULT_TIMEOUT", "Distributed", "unwrap"]

T = TypeVar("T")

NCCL_DEFAULT_TIMEOUT = timedelta(minutes=10)
"""How long an NCCL collective waits for the other ranks unless told otherwise (`default_pg_nccl_timeout` in
torch/distributed/constants.py; gloo's default is 30 minutes). `collective_timeout` never goes below it."""


@dataclass
class Distributed:
    """This process's place in a `torchrun` job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    initialized_here: bool = False
    device: str = "cpu"
    """Where this rank's policy trains (see `lightning_sdk.engine.placement`)."""

    @classmethod
    def from_environment(
        cls, placement: Placement | None = None, timeout: timedelta | None = None
    ) -> Distributed:
        """Join the torchrun job described by `placement` (default: read from the environment); a no-op
        with one process. On GPUs this rank's device is made current first, and the NCCL process group is
        bound to it, so that no rank creates a context on GPU 0.

        Args:
            placement: this process's devices (`lightning_sdk.engine.placement.plan_placement`).
            timeout: how long a collective waits for the other ranks before the job fails; the trainer
                passes `collective_timeout(config)`. `None`: torch's default (10 minutes with NCCL).
        """
        placement = placement or plan_placement()
        if placement.world_size <= 1:
            return cls(device=placement.device)
        import torch
        import torch.distributed as dist

        if placement.on_gpu:
            torch.cuda.set_device(placement.device)
        initialized_here = False
        if not dist.is_initialized():
            device_id = torch.device(placement.device) if placement.on_gpu else None
            dist.init_process_group(
                backend=placement.process_group_backend, device_id=device_id, timeout=timeout
            )
            initialized_here = True
        rank, world_size = dist.get_rank(), dist.get_world_size()
        return cls(rank, world_size, placement.local_rank, initialized_here, placement.device)

    @staticmethod
    def collective_timeout(config: TrainerConfig) -> timedelta:
        """How long a rank may wait in a collective for the others: long enough for the slowest rank's
        rollouts of a step, so that one slow agent does not end the job.

        The rule: ranks meet after every rollout phase (to even out the samples), and the slowest rank
        may still be running its `batch_size * group_size` episodes then. At most `max_concurrency` of them
        run at once, so they run in `ceil(batch_size * group_size / max_concurrency)` waves, and each
        episode is cancelled after `episode_timeout_s`: the rollouts of a step take at most `waves *
        episode_timeout_s`. The timeout is twice that (an evaluation between two steps is another such
        rollout), plus NCCL's default 10 minutes for what is not an episode (the update, the weight push,
        a checkpoint, engine start). The defaults (4 x 8 episodes, 32 at once, 300 s) give 20 minutes.
        """
        episodes_per_rank = config.batch_size * config.group_size
        waves = math.ceil(episodes_per_rank / config.max_concurrency)
        return 2 * waves * timedelta(seconds=config.episode_timeout_s) + NCCL_DEFAULT_TIMEOUT

    @property
    def is_main(self) -> bool:
        """True on rank 0, which writes checkpoints, metrics and reports."""
        return self.rank == 0

    def wrap(self, model: PeftModel) -> PolicyModel:
        """The model wrapped in DistributedDataParallel when there are several ranks."""
        if self.world_size == 1:
            return model
        from torch.nn.parallel import DistributedDataParallel

        device = next(model.parameters()).device
        if str(device) != self.device:  # DDP over a model on another device fails later, less clearly
            raise RuntimeError(f"rank {self.rank}: the policy is on {device}, not on {self.device}.")
        device_ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids)

    @staticmethod
    def unwrap(model: PolicyModel) -> PeftModel:
        """The peft model inside a DDP wrapper (or the model itself): `unwrap(model)`."""
        return cast("PeftModel", unwrap(model))

    def shard(self, items: list[T]) -> list[T]:
        """This rank's share of the step's tasks: every `world_size`-th, starting at `rank`."""
        return items if self.world_size == 1 else items[self.rank :: self.world_size]

    def balance(self, samples: list[T], minimum_per_rank: int) -> list[T]:
        """Even out the samples across ranks, so that every rank makes the same number of all-reduces.

        Groups with no reward spread give no samples, so ranks can end a rollout with very different
        counts; a rank with none would leave the others waiting in the all-reduce. When the whole step
        has fewer than `minimum_per_rank` samples per rank, every rank skips the update.
        """
        if self.world_size == 1:
            return samples
        import torch.distributed as dist

        gathered: list[list[T] | None] = [None] * self.world_size
        dist.all_gather_object(gathered, samples)
        everything = [sample for part in gathered for sample in (part or [])]
        if len(everything) < self.world_size * minimum_per_rank:
            return []
        return everything[self.rank :: self.world_size]

    def any_rank(self, flag: bool) -> bool:
        """True on every rank when `flag` is true on at least one (an all-reduce with MAX); `flag` itself
        with one process.

        Decisions that end the loop, such as the time budget, go through this: each rank measures its
        own clock, and a rank that stopped one step before the others would leave them waiting in the
        next step's collectives until the timeout kills the job.
        """
        if self.world_size == 1:
            return flag
        import torch
        import torch.distributed as dist

        # NCCL only reduces tensors on this rank's GPU; gloo on the CPU.
        vote = torch.tensor([int(flag)], dtype=torch.int32, device=self.device)
        dist.all_reduce(vote, op=dist.ReduceOp.MAX)
        return bool(vote.item())

    def mean_metrics(self, values: dict[str, float], weight_key: str = "episodes") -> dict[str, float]:
        """Evaluation metrics over every rank's share, weighted by its `weight_key` (its episode count)."""
        return values if self.world_size == 1 else _average(values, weight_key, self.world_size)

    def barrier(self) -> None:
        """Wait for every rank (no-op with one rank)."""
        if self.world_size > 1:
            import torch.distributed as dist

            dist.barrier()

    def close(self) -> None:
        """End the process group if this object started it (and nothing ended it already: a vLLM engine in
        `external_launcher` mode ends the job's process group when it shuts down)."""
        if self.initialized_here:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def unwrap(model: torch.nn.Module, to: Literal["adapter", "base"] = "adapter") -> torch.nn.Module:
    """The model inside the wrappers the trainer puts around it, the one place that unwraps them.

    `"adapter"` takes off DistributedDataParallel (under torchrun): the peft model, whose adapter is saved
    and whose flags (gradient checkpointing) the training pass reads. `"base"` takes off peft's wrapper too:
    the transformers causal LM, whose config, decoder and output embeddings the training pass uses. A model
    without a wrapper is itself.
    """
    from torch.nn.parallel import DistributedDataParallel

    inner = model.module if isinstance(model, DistributedDataParallel) else model
    get_base_model = getattr(inner, "get_base_model", None) if to == "base" else None  # peft
    return cast("torch.nn.Module", get_base_model()) if callable(get_base_model) else inner


def _average(values: dict[str, float], weight_key: str, world_size: int) -> dict[str, float]:
    """Weighted average of per-rank metric dicts gathered with all_gather_object."""
    import torch.distributed as dist

    gathered: list[dict[str, float] | None] = [None] * world_size
    dist.all_gather_object(gathered, values)
    parts = [part for part in gathered if part and part.get(weight_key, 0.0)]  # a rank with none says nothing
    total = sum(part.get(weight_key, 0.0) for part in parts)
    merged: dict[str, float] = {weight_key: total}
    for key in values:
        if key == weight_key:
            continue
        if key.endswith("_failed"):
            merged[key] = sum(part[key] for part in parts)
        else:
            merged[key] = sum(part[key] * part[weight_key] for part in parts) / total if total else math.nan
    return merged
