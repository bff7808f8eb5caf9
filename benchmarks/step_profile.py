"""Where a training step's time goes: a torch profiler summary of one step, by group (`gpu_train.py
--profile`).

One warm step (forward, backward and the optimizer's step) runs under `torch.profiler`; every operator's
self time on the device (the GPU's kernels; on a CPU, the operator's own CPU time) goes to one group:

- `attention`: SDPA, flash, efficient or flex attention and their backward (flex's compiled kernels too);
- `LoRA matmuls`: matrix products with the adapter's rank as a dimension (A and B, forward and backward);
- `base matmuls`: the other matrix products of the decoder (the frozen projections);
- `projection and loss`: the vocabulary projection's matrix products and the log-probability's reductions
  (`logsumexp`, `gather`, softmax);
- `optimizer`: the optimizer's step (profiled on its own, after the pass);
- `other device work`: everything else launched (norms, activations, casts, copies, masks);
- `host gaps` (GPU): the step's wall time the GPU spent without a kernel, waiting on the host.

The operators are classified by name and by the shapes of their inputs (`record_shapes`), so that LoRA's
rank-16 products and the projection's vocabulary-wide ones are told apart from the base weights'.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

GROUPS = (
    "attention",
    "LoRA matmuls",
    "base matmuls",
    "projection and loss",
    "optimizer",
    "other device work",
    "host gaps",
)
_MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm")
_ATTENTION_MARKS = ("attention", "flex", "triton_tem", "sdpa", "flash")
_LOSS_MARKS = ("logsumexp", "gather", "softmax", "cross_entropy")


def profile_step(
    step: Callable[[], None], optimizer_step: Callable[[], None], on_gpu: bool
) -> dict[str, Any]:
    """Run `step` (forward and backward), then `optimizer_step`, each once under its own profiler: the two
    profiles and the wall seconds of each."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    runs: dict[str, Any] = {}
    for name, work in (("pass", step), ("optimizer", optimizer_step)):
        with profile(activities=activities, record_shapes=True) as profiled:
            if on_gpu:
                torch.cuda.synchronize()
            started = time.perf_counter()
            work()
            if on_gpu:
                torch.cuda.synchronize()
            runs[name] = (profiled, time.perf_counter() - started)
    return runs


def classify(name: str, shapes: Iterable[Any], rank: int, vocab: int) -> str:
    """The group of one operator, from its name and its inputs' shapes."""
    lowered = name.lower()
    if any(mark in lowered for mark in _ATTENTION_MARKS):
        return "attention"
    if any(mark in lowered for mark in _LOSS_MARKS):
        return "projection and loss"
    if name in _MATMULS:
        dims = {dim for shape in shapes if isinstance(shape, list | tuple) for dim in shape}
        if vocab in dims:
            return "projection and loss"
        return "LoRA matmuls" if rank in dims else "base matmuls"
    return "other device work"


def _is_operator(event: Any) -> bool:
    """A host-side operator (its kernels' time is credited to it), not a kernel's own row or a user
    annotation: summing those too would count each kernel twice."""
    on_host = str(getattr(event, "device_type", "CPU")).endswith("CPU")
    return on_host and not getattr(event, "is_user_annotation", False)


def _self_time_us(event: Any, on_gpu: bool) -> float:
    """An operator's own time in microseconds: its kernels' on a GPU, its CPU time on a CPU."""
    if not on_gpu:
        return float(event.self_cpu_time_total)
    if hasattr(event, "self_device_time_total"):
        return float(event.self_device_time_total)
    return float(event.self_cuda_time_total)  # torch before 2.4


def _own_total_us(profiled: Any, on_gpu: bool) -> float:
    """The own time of every operator of a profile (its kernels on a GPU)."""
    return sum(_self_time_us(event, on_gpu) for event in profiled.key_averages() if _is_operator(event))


def _kernel_busy_us(profiled: Any) -> float:
    """How long at least one GPU kernel ran: the union of the kernels' intervals."""
    intervals = sorted(
        (event.time_range.start, event.time_range.end)
        for event in profiled.events()
        if str(getattr(event, "device_type", "")).endswith("CUDA")
        and not getattr(event, "is_user_annotation", False)
        and event.time_range.end > 0
    )
    busy, current_start, current_end = 0.0, None, None
    for start, end in intervals:
        if current_end is None or start > current_end:
            if current_end is not None and current_start is not None:
                busy += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None and current_start is not None:
        busy += current_end - current_start
    return busy


def summarize(runs: dict[str, Any], on_gpu: bool, rank: int, vocab: int, top: int = 15) -> dict[str, Any]:
    """The step's seconds by group (`GROUPS`) and the pass's `top` operators by own time, as plain data."""
    (profiled, pass_seconds), (optimizer, optimizer_seconds) = runs["pass"], runs["optimizer"]
    by_group = dict.fromkeys(GROUPS, 0.0)
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for event in profiled.key_averages(group_by_input_shape=True):
        own = _self_time_us(event, on_gpu) if _is_operator(event) else 0.0
        if own <= 0:
            continue
        group = classify(event.key, event.input_shapes or [], rank, vocab)
        by_group[group] += own
        row = merged.setdefault(
            (event.key, group), {"operator": event.key, "group": group, "calls": 0, "us": 0.0}
        )
        row["calls"] += event.count
        row["us"] += own
    by_group["optimizer"] = _own_total_us(optimizer, on_gpu)
    if on_gpu:  # the wall time of both parts without a kernel running
        busy = _kernel_busy_us(profiled) + _kernel_busy_us(optimizer)
        by_group["host gaps"] = max(0.0, (pass_seconds + optimizer_seconds) * 1e6 - busy)
    ranked = sorted(merged.values(), key=lambda row: -row["us"])[:top]
    return {
        "wall_seconds": pass_seconds + optimizer_seconds,
        "groups": {group: value / 1e6 for group, value in by_group.items()},
        "top_operators": [
            {
                "operator": row["operator"],
                "group": row["group"],
                "calls": row["calls"],
                "seconds": row["us"] / 1e6,
            }
            for row in ranked
        ],
    }


def as_markdown(summary: dict[str, Any], title: str, on_gpu: bool) -> str:
    """The summary as two tables: the groups, then the top operators."""
    wall = summary["wall_seconds"]
    time_kind = "GPU kernel time" if on_gpu else "CPU time of the operators themselves"
    lines = [
        f"# {title}",
        "",
        f"One warm step (forward, backward, optimizer) under torch.profiler: {wall:.3f} s wall. Seconds are "
        f"{time_kind}, by group (`benchmarks/step_profile.py` says how operators are grouped).",
        "",
        "| group | seconds | share of wall |",
        "| --- | ---: | ---: |",
    ]
    lines += [
        f"| {group} | {value:.3f} | {value / wall:.0%} |"
        for group, value in summary["groups"].items()
        if value
    ]
    lines += ["", "| operator | group | calls | seconds |", "| --- | --- | ---: | ---: |"]
    lines += [
        f"| `{row['operator']}` | {row['group']} | {row['calls']} | {row['seconds']:.3f} |"
        for row in summary["top_operators"]
    ]
    return "\n".join(lines) + "\n"
