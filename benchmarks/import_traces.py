"""Learning from traffic, the plumbing: how fast OTLP traces import, and feedback from several processes.

1. Writes an OTLP JSON file of `--traces` traces, each an agent span with `--calls` chat spans (current GenAI
   conventions, a few hundred characters of messages each), then times `read_otlp_traces` and the store
   writes of `import_traces` into a fresh `EpisodeStore`.
2. Starts `--writers` processes that each give `--feedback` rewards to random stored episodes at once, and
   checks that every one landed (the feedback records stored equal the feedback sent).

    python benchmarks/import_traces.py [--traces 1000] [--calls 10] [--writers 4] [--feedback 250]

Results go to `benchmarks/results/import_traces.md`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lightning_sdk.tracing.formats.trace_files import import_traces
from lightning_sdk.tracing.store import EpisodeStore

OUTPUT = Path(__file__).parent / "results" / "import_traces.md"
FEEDBACK_WRITER = """
import random, sys
import lightning_sdk as ls
store = ls.EpisodeStore(sys.argv[1])
ids = sys.argv[4].split(",")
rng = random.Random(int(sys.argv[3]))
for i in range(int(sys.argv[2])):
    ls.feedback(rng.choice(ids), rng.random(), name=f"writer{sys.argv[3]}-{i}", store=store)
"""


def attribute(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    if isinstance(value, float):
        return {"key": key, "value": {"doubleValue": value}}
    return {"key": key, "value": {"stringValue": value}}


def otlp_document(traces: int, calls: int, seed: int = 0) -> dict[str, Any]:
    """Synthetic OTLP JSON: each trace an `invoke_agent` span with `calls` `chat` spans under it."""
    rng = random.Random(seed)
    spans = []
    for trace in range(traces):
        trace_id = f"{rng.getrandbits(128):032x}"
        agent_id = f"{rng.getrandbits(64):016x}"
        start = 1_700_000_000_000_000_000 + trace * 10_000_000_000
        spans.append(
            {
                "traceId": trace_id,
                "spanId": agent_id,
                "name": "invoke_agent support",
                "startTimeUnixNano": str(start),
                "endTimeUnixNano": str(start + 9_000_000_000),
                "attributes": [
                    attribute("gen_ai.operation.name", "invoke_agent"),
                    attribute("gen_ai.agent.name", "support"),
                ],
            }
        )
        for call in range(calls):
            question = (
                f"Ticket {trace}-{call}: my order {rng.randrange(10**6)} has not arrived, what now? " * 2
            )
            answer = f"Sorry about order {rng.randrange(10**6)}; I have opened a claim, expect an email soon."
            spans.append(
                {
                    "traceId": trace_id,
                    "spanId": f"{rng.getrandbits(64):016x}",
                    "parentSpanId": agent_id,
                    "name": "chat gpt-4o-mini",
                    "startTimeUnixNano": str(start + call * 800_000_000),
                    "endTimeUnixNano": str(start + call * 800_000_000 + 700_000_000),
                    "attributes": [
                        attribute("gen_ai.operation.name", "chat"),
                        attribute("gen_ai.request.model", "gpt-4o-mini"),
                        attribute("gen_ai.usage.input_tokens", 60),
                        attribute("gen_ai.usage.output_tokens", 24),
                        attribute(
                            "gen_ai.input.messages",
                            json.dumps([{"role": "user", "parts": [{"type": "text", "content": question}]}]),
                        ),
                        attribute(
                            "gen_ai.output.messages",
                            json.dumps(
                                [
                                    {
                                        "role": "assistant",
                                        "parts": [{"type": "text", "content": answer}],
                                        "finish_reason": "stop",
                                    }
                                ]
                            ),
                        ),
                    ],
                }
            )
    return {"resourceSpans": [{"resource": {}, "scopeSpans": [{"scope": {"name": "bench"}, "spans": spans}]}]}


def concurrent_feedback(store_path: Path, ids: list[str], writers: int, per_writer: int) -> dict[str, Any]:
    sample = ",".join(random.Random(1).sample(ids, min(len(ids), 200)))
    started = time.perf_counter()
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", FEEDBACK_WRITER, str(store_path), str(per_writer), str(w), sample]
        )
        for w in range(writers)
    ]
    codes = [process.wait() for process in processes]
    seconds = time.perf_counter() - started
    with EpisodeStore(store_path) as store:
        stored = sum(len(episode.metadata.get("feedback", [])) for episode in store.episodes())
    return {"codes": codes, "seconds": seconds, "sent": writers * per_writer, "stored": stored}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--traces", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--feedback", type=int, default=250)
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        trace_file = Path(scratch) / "traces.json"
        trace_file.write_text(json.dumps(otlp_document(args.traces, args.calls)))
        megabytes = trace_file.stat().st_size / 2**20
        store_path = Path(scratch) / "episodes.db"
        started = time.perf_counter()
        with EpisodeStore(store_path) as store:
            report = import_traces(trace_file, store)
            count = store.count()
        import_seconds = time.perf_counter() - started
        ids = [episode.id for episode in report.episodes]
        feedback = concurrent_feedback(store_path, ids, args.writers, args.feedback)
    spans = args.traces * (args.calls + 1)
    lines = [
        "# Importing traces and concurrent feedback",
        "",
        f"Written by `python benchmarks/import_traces.py --traces {args.traces} --calls {args.calls} "
        f"--writers {args.writers} --feedback {args.feedback}` on "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} CPU cores.",
        "",
        "| what | result |",
        "|---|---|",
        f"| OTLP JSON file | {spans:,} spans ({args.traces:,} agent spans, {report.calls:,} chat spans), "
        f"{megabytes:.1f} MiB |",
        f"| read and stored | {import_seconds:.2f} s ({spans / import_seconds:,.0f} spans/s); "
        f"{count:,} episodes in the store |",
        f"| feedback from {args.writers} processes at once | {feedback['sent']:,} sent, "
        f"{feedback['stored']:,} stored, in {feedback['seconds']:.1f} s (exit codes {feedback['codes']}) |",
        f"| 1-minute load average at the end | {os.getloadavg()[0]:.1f} |",
    ]
    page = "\n".join(lines) + "\n"
    args.output.write_text(page)
    print(page)
    if feedback["stored"] != feedback["sent"] or any(feedback["codes"]):
        raise SystemExit("feedback was lost")


if __name__ == "__main__":
    main()
