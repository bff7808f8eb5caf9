"""The run explorer on a large run: time to the first page, every page's answer time, the viewer's memory.

1. Writes a synthetic run folder with the run folder's own writers (`MetricsWriter`,
   `RunEpisodes.keep_training` / `keep_evaluation`, `write_run_info`; `tests/fixtures/explorer_runs.py`):
   `--steps` steps of `--tasks` groups of `--group` samples (10,000 episodes by default, two calls each with a
   tool call and its result), and `--held-out` tasks evaluated every 25 steps.
2. Starts `lightning-sdk view RUN_DIR` as a user does (a new process, cold) and times it from the command's
   start to the first page's last byte, `--repeats` times; then the same inside a running Python
   (`serve_explorer`), which leaves out the interpreter's start and the imports.
3. Asks every kind of page over HTTP `--repeats` times each (the step page of a different step each time, so
   no answer is the same as the one before): the run page, a step, a step filtered by task text, a step
   sorted worst-first, an episode, held-out, held-out failing only, the metrics poll; then the viewer's
   resident memory.

    python benchmarks/explorer.py [--steps 125] [--tasks 10] [--group 8] [--held-out 50] [--repeats 15]

Results go to `benchmarks/results/explorer.md`.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lightning_sdk.explorer import serve_explorer
from tests.fixtures.explorer_runs import synthetic_run

OUTPUT = Path(__file__).parent / "results" / "explorer.md"


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_viewer(run_dir: Path) -> tuple[subprocess.Popen[bytes], str, float]:
    """`lightning-sdk view` in a new process; its address and the seconds to its first page."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    command = [sys.executable, "-m", "lightning_sdk.cli", "view", str(run_dir), "--port", str(port)]
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    while True:
        try:
            response = httpx.get(url, timeout=5)
            response.raise_for_status()
            return process, url, time.perf_counter() - started
        except httpx.TransportError:
            if process.poll() is not None:
                raise RuntimeError("the viewer exited") from None
            time.sleep(0.005)


def timed(client: httpx.Client, url: str) -> float:
    started = time.perf_counter()
    response = client.get(url)
    seconds = time.perf_counter() - started
    response.raise_for_status()
    return seconds


def resident_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=125)
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--held-out", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as folder:
        run_dir = Path(folder) / "run"
        started = time.perf_counter()
        synthetic_run(
            run_dir,
            steps=args.steps,
            tasks_per_step=args.tasks,
            group_size=args.group,
            held_out=args.held_out,
            eval_every=25,
        )
        written_s = time.perf_counter() - started
        episodes = args.steps * args.tasks * args.group
        store_mb = (run_dir / "episodes.sqlite").stat().st_size / 2**20

        first_pages = []
        for _ in range(args.repeats):
            process, url, seconds = start_viewer(run_dir)
            first_pages.append(seconds)
            process.terminate()
            process.wait()

        in_process = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            with serve_explorer(run_dir, port=0) as server:
                httpx.get(server.url, timeout=30).raise_for_status()
                in_process.append(time.perf_counter() - started)

        process, url, _ = start_viewer(run_dir)
        try:
            with httpx.Client(timeout=30) as client:
                step_page = client.get(f"{url}step/{args.steps}").text
                episode = re.findall(r'href="/(episode/training/[0-9a-f]+)"', step_page)[0]
                steps = [1 + (index * 37) % args.steps for index in range(args.repeats)]
                pages = {
                    "run page `/`": lambda i: "",
                    "step `/step/N` (10 groups of 8)": lambda i: f"step/{steps[i]}",
                    "step filtered by task text": lambda i: f"step/{steps[i]}?q=What+is+1",
                    "step sorted worst first": lambda i: f"step/{steps[i]}?sort=worst",
                    "episode (2 calls)": lambda i: episode,
                    "held-out (50 tasks x 6 evaluations)": lambda i: "held-out",
                    "held-out, failing only": lambda i: "held-out?failing=1",
                    "metrics poll `/api/metrics`": lambda i: "api/metrics",
                }
                rows = []
                for name, path in pages.items():
                    times = [timed(client, url + path(index)) for index in range(args.repeats)]
                    rows.append((name, statistics.median(times), max(times)))
            memory = resident_mb(process.pid)
        finally:
            process.terminate()
            process.wait()

    load = os.getloadavg()[0]
    lines = [
        "# The run explorer on a large run",
        "",
        f"`python benchmarks/explorer.py --steps {args.steps} --tasks {args.tasks} --group {args.group} "
        f"--held-out {args.held_out} --repeats {args.repeats}`, {time.strftime('%Y-%m-%d')}, "
        f"{os.cpu_count()} CPU cores ({_cpu()}), load average {load:.1f} when it finished.",
        "",
        f"A synthetic run folder written by the run folder's own writers: {episodes:,} training episodes "
        f"({args.steps} steps x {args.tasks} groups x {args.group} samples, two calls each with a tool call "
        f"and its result), {args.held_out} held-out tasks at 6 evaluations; episodes.sqlite "
        f"{store_mb:.0f} MB; written in {written_s:.1f} s.",
        "",
        "| what | median | worst |",
        "| --- | --- | --- |",
        f"| `lightning-sdk view RUN_DIR`: command start to the first page's last byte (a new process, cold) "
        f"| {statistics.median(first_pages):.2f} s | {max(first_pages):.2f} s |",
        "| the same in a running Python (`serve_explorer(run_dir)`: open the store, read the index, start "
        f"the server, answer the first page) | {statistics.median(in_process):.2f} s "
        f"| {max(in_process):.2f} s |",
        *(f"| {name} | {median * 1000:.0f} ms | {worst * 1000:.0f} ms |" for name, median, worst in rows),
        "",
        f"Resident memory of the viewer after every page: {memory:.0f} MB (the store is {store_mb:.0f} MB; "
        "the viewer keeps an index of three integers per episode and parses one page at a time).",
        "",
        "Bars (issue 52): first page under 1 s; every page under 300 ms on 2 cores.",
    ]
    OUTPUT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


if __name__ == "__main__":
    main()
