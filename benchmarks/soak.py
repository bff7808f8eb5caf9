"""Soak: does memory or the count of open files grow with a long run? Written to benchmarks/results/soak.md.

Two loops, each sampling the resident memory (RSS) of this process and its children and this process's
open file descriptors as it goes:

- `recording`: 100,000 episodes of a traced agent (`@trace_agent`, `@reward`) whose openai client makes
  one chat call per episode, recorded with its token ids by the openai capture and appended to an
  `EpisodeStore`. The client talks to an in-process HTTP transport that answers in our token-id wire
  format, so the loop measures the recording side alone, not a model.
- `training`: the quickstart's calculator agent (AutoGen, real vLLM engine, bundled model) trained for
  many steps, the way `make demo` does, with no evaluation in between.

Growth is judged after a warm-up (the first quarter): the least-squares slope of RSS over the rest, and
the change in open files. A leak shows as a slope that does not fall with more episodes or steps.

    python benchmarks/soak.py recording [--episodes 100000]
    python benchmarks/soak.py training [--steps 40]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESULTS = Path(__file__).parent / "results"
WARM_UP_SHARE = 0.25


@dataclass
class Sample:
    at: float  # episodes done (recording) or seconds since start (training)
    rss_mb: float
    open_files: int


def measure(at: float) -> Sample:
    process = psutil.Process()
    rss = process.memory_info().rss
    for child in process.children(recursive=True):
        try:
            rss += child.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return Sample(at, rss / 2**20, process.num_fds())


def slope(samples: list[Sample]) -> float:
    """Least-squares slope of RSS (MB) per unit of `at`."""
    if len(samples) < 2:
        return 0.0
    mean_x = sum(s.at for s in samples) / len(samples)
    mean_y = sum(s.rss_mb for s in samples) / len(samples)
    spread = sum((s.at - mean_x) ** 2 for s in samples)
    return sum((s.at - mean_x) * (s.rss_mb - mean_y) for s in samples) / spread if spread else 0.0


def after_warm_up(samples: list[Sample]) -> list[Sample]:
    return samples[int(len(samples) * WARM_UP_SHARE) :]


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def growth(samples: list[Sample]) -> dict:
    """Growth after warm-up, robust to a single noisy sample: medians of the first and last third of the
    steady samples, the RSS slope over all of them, and the range of open files."""
    steady = after_warm_up(samples)
    third = max(1, len(steady) // 3)
    early, late = steady[:third], steady[-third:]
    return {
        "rss_slope": slope(steady),
        "rss_early_mb": median([s.rss_mb for s in early]),
        "rss_late_mb": median([s.rss_mb for s in late]),
        "files_early": median([s.open_files for s in early]),
        "files_late": median([s.open_files for s in late]),
        "files_min": min(s.open_files for s in steady),
        "files_max": max(s.open_files for s in steady),
    }


def growth_line(samples: list[Sample], per: str, scale: float) -> str:
    g = growth(samples)
    return (
        f"After warm-up: RSS median {g['rss_early_mb']:.1f} MB in the first third, {g['rss_late_mb']:.1f} MB "
        f"in the last; least-squares slope {g['rss_slope'] * scale:+.2f} MB {per}. Open files: median "
        f"{g['files_early']:.0f} -> {g['files_late']:.0f} (range {g['files_min']}-{g['files_max']})."
    )


# --- recording --------------------------------------------------------------------------------------
def recording_client():
    """An openai client whose HTTP transport answers every chat request in our token-id wire format."""
    import httpx
    import openai

    from tests.fixtures.fake_openai_wire import Reply, chat_completion

    counter = iter(range(10**9))

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        reply = chat_completion(body, [Reply(f"The answer is {next(counter) % 97}.")], "chatcmpl-soak")
        return httpx.Response(200, json=reply)

    http = httpx.Client(transport=httpx.MockTransport(answer))
    return openai.OpenAI(base_url="http://soak.local/v1", api_key="soak", http_client=http, max_retries=0)


def run_recording(episodes: int, every: int) -> dict:
    import lightning_sdk as ls

    client = recording_client()

    @ls.reward
    def exact(task: int, answer: str) -> float:
        return float(answer.endswith(f"{task % 97}."))

    @ls.trace_agent(name="soak")
    def agent(task: int) -> str:
        reply = client.chat.completions.create(
            model="soak", messages=[{"role": "user", "content": f"Question {task}: what is {task} mod 97?"}]
        )
        answer = reply.choices[0].message.content or ""
        exact(task, answer)
        return answer

    with tempfile.TemporaryDirectory(prefix="soak-") as folder:
        store = ls.EpisodeStore(Path(folder) / "episodes.sqlite")
        ls.configure(store=store)
        samples = [measure(0)]
        started = time.perf_counter()
        for task in range(1, episodes + 1):
            agent(task)
            if task % every == 0:
                samples.append(measure(task))
                print(
                    f"{task:>7} episodes  RSS {samples[-1].rss_mb:7.1f} MB  "
                    f"open files {samples[-1].open_files}",
                    flush=True,
                )
        elapsed = time.perf_counter() - started
        stored = store.count()
        size_mb = sum(p.stat().st_size for p in Path(folder).iterdir()) / 2**20
        ls.configure(store=None)
        store.close()
    return {
        "episodes": episodes,
        "stored": stored,
        "episodes_per_s": episodes / elapsed,
        "store_mb": size_mb,
        "samples": [asdict(s) for s in samples],
    }


# --- training ---------------------------------------------------------------------------------------
class Sampler(threading.Thread):
    """Measures every `interval` seconds until stopped."""

    def __init__(self, interval: float) -> None:
        super().__init__(daemon=True)
        self.interval, self.samples, self.started = interval, [], time.time()
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            self.samples.append(measure(time.time() - self.started))

    def stop(self) -> list[Sample]:
        self._stop_event.set()
        self.join()
        return self.samples


def run_training(steps: int) -> dict:
    from lightning_sdk.examples.calc_autogen.train import train
    from lightning_sdk.training.records.metrics import read_metrics

    sampler = Sampler(interval=2.0)
    sampler.start()
    with tempfile.TemporaryDirectory(prefix="soak-run-") as folder:
        run_dir = Path(folder) / "run"
        result = train(steps=steps, run_dir=run_dir, eval_every=0, test_size=8, report=False)
        records = [r for r in read_metrics(run_dir) if "reward_mean" in r]
    samples = sampler.stop()
    # RSS and open files at the end of each step: the last sample taken before the step's record.
    per_step = []
    for record in records:
        before = [s for s in samples if s.at <= record["time"] - sampler.started]
        if before:
            per_step.append(Sample(record["step"], before[-1].rss_mb, before[-1].open_files))
    return {
        "steps": len(records),
        "wall_s": result["wall_time_s"],
        "samples": [asdict(s) for s in per_step],
        "peak_rss_mb": max(s.rss_mb for s in samples) if samples else 0.0,
    }


# --- report -----------------------------------------------------------------------------------------
def machine() -> str:
    memory_gib = psutil.virtual_memory().total / 2**30
    return f"{os.cpu_count()} CPU cores, {memory_gib:.0f} GiB, {platform.platform()}"


def section(title: str, summary: str, r: dict, unit: str, per: str, scale: float, at: str, rss: str) -> list:
    """One part's lines: title, summary with machine and date, the samples table and the growth line."""
    samples = [Sample(**s) for s in r["samples"]]
    return [
        title,
        "",
        f"{summary} Machine: {r['machine']}; {r['date']}.",
        "",
        f"| {unit} | RSS (MB) | open files |",
        "|---:|---:|---:|",
        *[f"| {at.format(s.at)} | {rss.format(s.rss_mb)} | {s.open_files} |" for s in samples],
        "",
        growth_line(samples, per, scale),
        "",
    ]


def render(results: dict) -> str:
    lines = [
        "# Soak: memory and open files over long runs",
        "",
        "Written by `python benchmarks/soak.py recording|training`; each part keeps its last result.",
        (
            f"RSS counts this process and its children. Growth is measured after a warm-up of the first "
            f"{WARM_UP_SHARE:.0%} of the samples."
        ),
        "",
    ]
    if "recording" in results:
        r = results["recording"]
        summary = (
            f"{r['episodes']:,} episodes of a traced agent, one recorded chat call each (openai "
            f"capture, token ids), appended to an `EpisodeStore` ({r['stored']:,} stored, "
            f"{r['store_mb']:.0f} MB): {r['episodes_per_s']:.0f} episodes/s."
        )
        lines += section(
            "## Recording: episodes into the store",
            summary,
            r,
            "episodes",
            "per 10,000 episodes",
            10_000,
            at="{:,.0f}",
            rss="{:.1f}",
        )
    if "training" in results:
        r = results["training"]
        summary = (
            f"{r['steps']} GRPO steps of the calculator agent (AutoGen, vLLM engine, bundled model), "
            f"{r['wall_s'] / 60:.0f} minutes; peak RSS {r['peak_rss_mb']:.0f} MB."
        )
        lines += section(
            "## Training: the quickstart agent for many steps",
            summary,
            r,
            "step",
            "per step",
            1,
            at="{:.0f}",
            rss="{:.0f}",
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "part",
        choices=["recording", "training", "render"],
        help="a loop to run, or render: rewrite soak.md from soak.json",
    )
    parser.add_argument("--episodes", type=int, default=100_000, help="recording: episodes to record")
    parser.add_argument("--every", type=int, default=5_000, help="recording: measure every this many")
    parser.add_argument("--steps", type=int, default=40, help="training: GRPO steps")
    args = parser.parse_args()
    raw = RESULTS / "soak.json"
    if args.part == "render":
        (RESULTS / "soak.md").write_text(render(json.loads(raw.read_text())))
        return

    if args.part == "recording":
        result = run_recording(args.episodes, args.every)
    else:
        result = run_training(args.steps)
    result.update(machine=machine(), date=time.strftime("%Y-%m-%d"))
    RESULTS.mkdir(exist_ok=True)
    results = json.loads(raw.read_text()) if raw.exists() else {}
    results[args.part] = result
    raw.write_text(json.dumps(results, indent=1) + "\n")
    (RESULTS / "soak.md").write_text(render(results))
    print(render({args.part: result}))


if __name__ == "__main__":
    main()
