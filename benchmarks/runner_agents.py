"""Agents for benchmarks/runners.py, importable by runner processes and Ray actors
(`benchmarks.runner_agents:trivial`, `benchmarks.runner_agents:cpu_tool`). They make no LLM call: the
benchmark measures the rollout path itself, not the model."""

from __future__ import annotations

import time
from typing import Any

import lightning_sdk as ls


@ls.reward
def done(task: dict[str, Any], answer: Any) -> float:
    return 1.0


@ls.trace_agent(name="trivial")
def trivial(task: dict[str, Any]) -> Any:
    done(task, task["x"])
    return task["x"]


def burn_cpu(seconds: float) -> None:
    """A tool call that keeps one core busy (pure Python: it holds the GIL, as many real tools do)."""
    # This thread's own CPU time: with a process-wide clock, threads would finish each other's work.
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


@ls.trace_agent(name="cpu_tool")
def cpu_tool(task: dict[str, Any]) -> Any:
    for _ in range(task.get("tool_calls", 2)):
        burn_cpu(task.get("tool_s", 0.2))
    done(task, task["x"])
    return task["x"]
