"""What do runners cost, and what do they buy? Two measurements, written to benchmarks/results/runners.md:

(a) Overhead: the latency of one episode of a trivial agent (no LLM call, no work) run in the trainer's
    process versus through the runner protocol (queue, lease, HTTP upload, one runner process), one
    episode at a time; the median difference is what the protocol adds per episode.
(b) Throughput: episodes per second of an agent whose tools burn CPU (2 calls x 0.2 s of pure-Python work
    each, holding the GIL like many real tools): in the trainer's process (threads), in 2 runner processes,
    and in 2 runner actors on a local Ray cluster.

The agents make no LLM call, so the model is not measured; the server still runs (the transformers
engine, idle). On a 2-core machine, (b) can show at most 2x from leaving the GIL, and the runners share
those cores with the trainer; more runners than cores buy nothing here. Usage:

    python benchmarks/runners.py [--episodes 200] [--throughput-episodes 24]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the agents module, as runners import it

from benchmarks.runner_agents import cpu_tool, trivial
from lightning_sdk.engine import TransformersEngine
from lightning_sdk.rollouts import RolloutQueue
from lightning_sdk.rollouts.in_process import run_rollouts
from lightning_sdk.rollouts.ray_runners import RayRunners
from lightning_sdk.rollouts.remote import RemoteRollouts
from lightning_sdk.rollouts.routes import install_rollout_routes
from lightning_sdk.rollouts.runners import RunnerLaunch, RunnerProcesses
from lightning_sdk.serving import start_server

RESULTS = Path(__file__).parent / "results" / "runners.md"


def in_process(agent, tasks, concurrency: int) -> list:
    return asyncio.run(run_rollouts(agent, tasks, 1, max_concurrency=concurrency))


def latencies(run_one, count: int) -> list[float]:
    run_one()  # warm-up
    times = []
    for _ in range(count):
        started = time.perf_counter()
        run_one()
        times.append((time.perf_counter() - started) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=200, help="episodes for the overhead measurement")
    parser.add_argument("--throughput-episodes", type=int, default=24)
    args = parser.parse_args()
    os.chdir(
        Path(__file__).resolve().parents[1]
    )  # runner processes import benchmarks.runner_agents from here

    engine = TransformersEngine(max_model_len=512)
    queue = RolloutQueue(lease_timeout_s=30)
    server = start_server(
        engine, routes=[lambda app, authorize: install_rollout_routes(app, authorize, queue)]
    )
    root, key = server.endpoint.base_url.removesuffix("/v1"), server.endpoint.api_key
    rows: list[str] = []
    try:
        task = {"x": 1}
        here = latencies(lambda: in_process(trivial, [task], 1), args.episodes)
        one = RunnerProcesses(1, RunnerLaunch("benchmarks.runner_agents:trivial", root, key, 1, 60))
        remote = RemoteRollouts(queue, server.endpoint.base_url, "", one)
        try:
            remote.run([task], 1, None)  # the runner is up
            there = latencies(lambda: remote.run([task], 1, None), args.episodes)
        finally:
            one.stop()
        overhead = statistics.median(there) - statistics.median(here)
        rows += [
            "## (a) Overhead per episode (trivial agent, one at a time)",
            "",
            "| path | median ms | p90 ms |",
            "| --- | --- | --- |",
            f"| in-process | {statistics.median(here):.2f} | {_p90(here):.2f} |",
            f"| 1 runner process over HTTP | {statistics.median(there):.2f} | {_p90(there):.2f} |",
            "",
            (
                f"The runner protocol adds a median {overhead:.1f} ms per episode "
                f"({args.episodes} episodes each)."
            ),
            "",
        ]
        tasks = [{"x": i, "tool_calls": 2, "tool_s": 0.2} for i in range(args.throughput_episodes)]
        tool_runner = RunnerLaunch("benchmarks.runner_agents:cpu_tool", root, key, 1, 60)
        throughput = [("in-process (threads)", _timed(lambda: in_process(cpu_tool, tasks, 8), len(tasks)))]
        for label, pool in (
            (
                "2 runner processes",
                lambda: RunnerProcesses(2, tool_runner),
            ),
            (
                "2 Ray actors (local cluster)",
                lambda: RayRunners(2, tool_runner),
            ),
        ):
            runners = pool()
            remote = RemoteRollouts(queue, server.endpoint.base_url, "", runners)
            try:
                remote.run(tasks[:2], 1, None)  # every runner up
                throughput.append((label, _timed(lambda r=remote: r.run(tasks, 1, None), len(tasks))))
            finally:
                runners.stop()
        base = throughput[0][1][0]
        rows += [
            (
                f"## (b) Throughput, agent with CPU-bound tools "
                f"({len(tasks)} episodes x 2 tool calls x 0.2 s CPU)"
            ),
            "",
            "| where the agent runs | episodes/s | wall s | vs in-process |",
            "| --- | --- | --- | --- |",
            *(
                f"| {label} | {rate:.2f} | {wall:.1f} | {rate / base:.2f}x |"
                for label, (rate, wall) in throughput
            ),
            "",
        ]
    finally:
        queue.close("benchmark over")
        server.stop()
        engine.shutdown()
    machine = f"{os.cpu_count()} CPU cores, load average at the end {os.getloadavg()[0]:.2f}"
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    header = f"# Runners benchmark\n\n`python benchmarks/runners.py` on {machine}, {when}.\n"
    text = "\n".join([header, *rows])
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
    print(text)


def _p90(values: list[float]) -> float:
    return sorted(values)[int(0.9 * (len(values) - 1))]


def _timed(run, count: int) -> tuple[float, float]:
    started = time.perf_counter()
    run()
    wall = time.perf_counter() - started
    return count / wall, wall


if __name__ == "__main__":
    main()
