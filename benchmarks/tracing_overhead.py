"""How much latency does recording add to an openai (or anthropic) call? Target: under 50 µs per call.

Compares the median per-call latency of the same request made with the real openai client in three
modes, alternating call by call so that machine noise hits every mode alike:

- `baseline`: openai not instrumented;
- `outside episode`: instrumented, but no episode is active (the cost of the ContextVar check);
- `inside episode`: instrumented, inside an episode (the full recording, stream assembly included).

Two transports: the local OpenAI-compatible test server over HTTP (what an agent sees), and the same
responses served in-process through an `httpx` mock transport, which removes socket and server noise
so that a difference of a few microseconds is visible. Recording is CPU work in the calling thread,
so besides wall-clock time the table shows the CPU time of the calling thread, which scheduling noise
on a busy machine does not inflate. A fourth mode, `routed`, runs inside an episode with a router that
sends the call to another endpoint (what a rollout does to a client built at import time), on the
in-process transport only (the HTTP server has one address).

A single run's figures swing with the machine, so the whole measurement repeats in `--rounds` rounds and
the headline figures are the median over rounds with their spread (lowest..highest round). Usage:

    python benchmarks/tracing_overhead.py [--calls 1000] [--rounds 5]
    python benchmarks/tracing_overhead.py --client anthropic      # Messages API calls of `anthropic`

With `--client anthropic` the same modes time `messages.create` (whole and `stream=True`) of the real
`anthropic` client, in-process only (the test server speaks OpenAI's wire), against Messages bodies and
events of the same size as the openai case's, token ids included.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere: the repo's tests/ fixtures

import httpx2
import openai

import lightning_sdk as ls
from lightning_sdk.tracing.context import episode_scope
from lightning_sdk.tracing.routing import Router, routing
from tests.fixtures.fake_openai_wire import (
    STREAM_PIECE_CHARS,
    Reply,
    chat_chunks,
    chat_completion,
    fake_logprobs,
    fake_tokenize,
)
from tests.fixtures.openai_server import OpenAITestServer

MESSAGES = [
    {"role": "system", "content": "You are a careful assistant."},
    {"role": "user", "content": "What is 12 + 7? Answer with the number only."},
]
ANSWER = Reply("The answer is 19.")
ROUND = 50
MODES = ("baseline", "outside episode", "inside episode", "routed")
POLICY_URL = "http://policy.local/v1"


def timed(call: Callable[[], object], count: int) -> list[tuple[float, float]]:
    """(wall seconds, CPU seconds of this thread) taken by each of `count` calls."""
    samples = []
    for _ in range(count):
        wall, cpu = time.perf_counter(), time.thread_time()
        call()
        samples.append((time.perf_counter() - wall, time.thread_time() - cpu))
    return samples


def openai_request(client: openai.OpenAI, stream: bool) -> Callable[[], object]:
    def request() -> object:
        if stream:
            return list(client.chat.completions.create(model="test-model", messages=MESSAGES, stream=True))
        return client.chat.completions.create(model="test-model", messages=MESSAGES)

    return request


def anthropic_request(client: Any, stream: bool) -> Callable[[], object]:
    system, user = MESSAGES[0]["content"], MESSAGES[1:]

    def request() -> object:
        reply = client.messages.create(
            model="test-model", max_tokens=32, system=system, messages=user, stream=stream
        )
        return list(reply) if stream else reply

    return request


CLIENTS = {
    "openai": (openai_request, ls.instrument_openai, ls.uninstrument_openai),
    "anthropic": (anthropic_request, ls.instrument_anthropic, ls.uninstrument_anthropic),
}
"""Per client: how to make the benchmark's request, and how to switch its capture on and off."""


def measure(
    client: Any, calls: int, stream: bool, modes: tuple[str, ...], kind: str = "openai"
) -> dict[str, tuple[float, float]]:
    """Median (wall, thread CPU) seconds per call in each mode."""
    router = Router(POLICY_URL, "sk-run-key")
    make_request, instrument, uninstrument = CLIENTS[kind]
    request = make_request(client, stream)

    def inside_episode() -> object:
        with episode_scope(ls.Episode(name="bench")) as episode:
            result = request()
        if len(episode.calls) != 1:
            raise RuntimeError("the call was not recorded: the benchmark would measure nothing")
        return result

    def routed() -> object:
        with routing(router):
            return inside_episode()

    calls_of = {"inside episode": inside_episode, "routed": routed}

    def run(mode: str) -> list[tuple[float, float]]:
        (uninstrument if mode == "baseline" else instrument)()
        return timed(calls_of.get(mode, request), 1)

    samples: dict[str, list[tuple[float, float]]] = {mode: [] for mode in modes}
    timed(request, ROUND)  # warm up connections and code paths
    for number in range(calls):
        if number % ROUND == 0:
            gc.collect()  # collections land on whichever call happens to run: keep them out of samples
            gc.disable()
        turn = number % len(modes)
        for mode in modes[turn:] + modes[:turn]:  # modes alternate call by call, in turn
            samples[mode] += run(mode)
        if number % ROUND == ROUND - 1:
            gc.enable()
    gc.enable()
    uninstrument()
    return {
        mode: (statistics.median(w for w, _ in values), statistics.median(c for _, c in values))
        for mode, values in samples.items()
    }


def in_process_client() -> openai.OpenAI:
    """An openai client whose requests are answered in-process with the test server's bodies."""

    def answer(request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        if body.get("stream"):
            events = [f"data: {json.dumps(chunk)}\n\n" for chunk in chat_chunks(body, [ANSWER], "chatcmpl-1")]
            content = ("".join(events) + "data: [DONE]\n\n").encode()
            return httpx2.Response(200, content=content, headers={"content-type": "text/event-stream"})
        return httpx2.Response(200, json=chat_completion(body, [ANSWER], "chatcmpl-1"))

    http_client = openai.DefaultHttpxClient(transport=httpx2.MockTransport(answer))
    return openai.OpenAI(base_url="http://in-process/v1", api_key="test-key", http_client=http_client)


def anthropic_in_process_client() -> Any:
    """An anthropic client whose Messages calls are answered in-process: a whole message, or its events
    (text deltas of the openai case's chunk size), with our token-id extras."""
    import anthropic

    def answer(request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        prompt_ids = fake_tokenize(json.dumps(body["messages"]) + str(body.get("system")))
        token_ids = fake_tokenize(ANSWER.content or "")
        tokens = {
            "prompt_token_ids": prompt_ids,
            "token_ids": token_ids,
            "token_logprobs": fake_logprobs(token_ids),
        }
        usage = {"input_tokens": len(prompt_ids), "output_tokens": len(token_ids)}
        text = ANSWER.content or ""
        message = {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": usage,
        }
        if not body.get("stream"):
            return httpx2.Response(200, json={**message, **tokens})
        pieces = [text[i : i + STREAM_PIECE_CHARS] for i in range(0, len(text), STREAM_PIECE_CHARS)]
        events = [
            {"type": "message_start", "message": {**message, "content": [], "stop_reason": None}},
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            *(
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}
                for piece in pieces
            ),
            {"type": "content_block_stop", "index": 0},
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": len(token_ids)},
                **tokens,
            },
            {"type": "message_stop"},
        ]
        content = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()
        return httpx2.Response(200, content=content, headers={"content-type": "text/event-stream"})

    http_client = anthropic.DefaultHttpxClient(transport=httpx2.MockTransport(answer))
    return anthropic.Anthropic(base_url="http://in-process", api_key="test-key", http_client=http_client)


def report(
    transport: str, client: Any, calls: int, modes: tuple[str, ...], kind: str = "openai"
) -> dict[tuple[str, str], float]:
    """Print one table block; return the CPU time each mode adds (µs), by (request, mode)."""
    added = {}
    for stream in (False, True):
        medians = measure(client, calls, stream, modes, kind)
        base_wall, base_cpu = medians["baseline"]
        for mode, (wall, cpu) in medians.items():
            extra = (
                ("", "")
                if mode == "baseline"
                else (f"{(wall - base_wall) * 1e6:+.1f}", f"{(cpu - base_cpu) * 1e6:+.1f}")
            )
            print(
                f"{transport:<12} {'stream' if stream else 'whole':<7} {mode:<16} "
                f"{wall * 1e6:>9.1f} {extra[0]:>9}"
                f" {cpu * 1e6:>9.1f} {extra[1]:>9}"
            )
        for mode in modes[1:]:
            added[("stream" if stream else "whole", mode)] = (medians[mode][1] - base_cpu) * 1e6
    return added


def recording_code_alone(client: openai.OpenAI, router: Router | None, count: int = 5000) -> float:
    """Median seconds of the recording code itself on a whole chat completion, run in a hot loop: reading
    the request (and routing it, with a router), building the `LLMCall` from the parsed response,
    appending it."""
    from openai._models import FinalRequestOptions
    from openai.types.chat import ChatCompletion

    from lightning_sdk.tracing.capture.openai_client import _start

    response = client.chat.completions.create(model="test-model", messages=MESSAGES)
    # The client builds a request's options afresh for every request (and routing changes them in place):
    # so does this loop, outside the timed part.
    requests = [
        (
            ChatCompletion,
            FinalRequestOptions.construct(
                method="post",
                url="/chat/completions",
                json_data={"model": "test-model", "messages": MESSAGES},
            ),
        )
        for _ in range(count + 1)
    ]
    samples = []
    with episode_scope(ls.Episode(name="bench")) as episode:
        for arguments in requests[:count]:
            start = time.perf_counter()
            _, _, recording = _start(client, arguments, {}, episode, router)
            assert recording is not None
            recording.handle_result(response)
            samples.append(time.perf_counter() - start)
            episode.calls.clear()
        arguments = requests[count]
    if router is not None and episode is not None:
        routed_to = _start(client, arguments, {}, episode, router)[2]
        assert routed_to is not None and routed_to.template.base_url == POLICY_URL  # it did route
    return statistics.median(samples)


def spread(values: list[float]) -> str:
    """`median (lowest..highest)` of per-round figures."""
    return f"{statistics.median(values):.1f} ({min(values):.1f}..{max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000, help="calls per mode, case and round (1000)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the whole measurement (5)")
    parser.add_argument("--client", choices=sorted(CLIENTS), default="openai", help="whose calls (openai)")
    args = parser.parse_args()
    if args.client == "anthropic":
        anthropic_main(args.calls, args.rounds)
        return
    server = OpenAITestServer(responder=lambda request: ANSWER).start()
    http = openai.OpenAI(base_url=server.base_url, api_key=server.api_key, max_retries=0)
    local = in_process_client()
    headline: dict[str, list[float]] = {}
    try:
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        print(
            f"openai {openai.__version__}; {args.calls} calls per mode and round, {args.rounds} rounds; "
            f"{os.cpu_count()} CPUs, load {load:.1f}"
        )
        for number in range(1, args.rounds + 1):
            print(f"\nround {number}\n{'':<37} {'wall-clock µs':>19} {'caller CPU µs':>19}")
            print(
                f"{'transport':<12} {'request':<7} {'mode':<16} "
                f"{'median':>9} {'added':>9} {'median':>9} {'added':>9}"
            )
            report("HTTP server", http, args.calls, MODES[:3])
            for (request, mode), value in report("in-process", local, args.calls, MODES).items():
                headline.setdefault(f"added CPU µs, in-process, {request}, {mode}", []).append(value)
            for name, router in (("off", None), ("on", Router(POLICY_URL, "sk-run-key"))):
                alone = recording_code_alone(local, router) * 1e6
                headline.setdefault(f"recording code alone µs (hot loop), routing {name}", []).append(alone)
        print(f"\nover {args.rounds} rounds: median (lowest..highest round)")
        for name, values in headline.items():
            print(f"  {name:<55} {spread(values)}")
        print(
            "target: under 50 µs added per call; the recording code alone at or under 15 µs with routing on"
        )
    finally:
        http.close()
        local.close()
        server.stop()


def anthropic_main(calls: int, rounds: int) -> None:
    """The anthropic client's figures: in-process transport, the four modes, whole and streamed."""
    import anthropic

    client = anthropic_in_process_client()
    headline: dict[str, list[float]] = {}
    print(f"anthropic {anthropic.__version__}; {calls} calls per mode and round, {rounds} rounds")
    for number in range(1, rounds + 1):
        print(f"\nround {number}\n{'':<37} {'wall-clock µs':>19} {'caller CPU µs':>19}")
        for (request, mode), value in report("in-process", client, calls, MODES, "anthropic").items():
            headline.setdefault(f"added CPU µs, in-process, {request}, {mode}", []).append(value)
    print(f"\nover {rounds} rounds: median (lowest..highest round)")
    for name, values in headline.items():
        print(f"  {name:<55} {spread(values)}")
    print("target: under 50 µs added per call")
    client.close()


if __name__ == "__main__":
    main()
