"""Hostile input at the serving edge, each through the public HTTP surface (docs/serving.md, "Hostile input").

The policy's server runs on the shared vLLM engine with a recording upstream: a real HTTP server on
127.0.0.1 that answers every method and path and records what reached it. What is tried: account routes
and paths that climb out of `/v1` through the pass-through (refused, nothing reaches the upstream), bodies
over the size limit with and without a length (413 at once), requests that would start too many sequences
(400), JSON that is malformed or nested 50k deep (400 in the shape of the route's API), and a client that
goes away during a non-streaming generation (the engine stops it). Requests are sent with `http.client` or
`httpx` so that the path and the body reach the server exactly as written.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

import lightning_sdk as ls
from lightning_sdk.serving import Upstream, start_server

pytestmark = pytest.mark.slow

KEY = "sk-hostile-test"
UPSTREAM_KEY = "sk-the-users-own-key"
HI = [{"role": "user", "content": "hi"}]


class RecordingUpstream:
    """A real HTTP server that answers every request with 200 and records (method, path, key, body size)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str | None, int]] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def answer(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                recorder.seen.append((self.command, self.path, self.headers.get("authorization"), len(body)))
                payload = json.dumps({"object": "list", "data": [], "path": self.path}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = answer

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


@pytest.fixture(scope="module")
def upstream() -> Iterator[RecordingUpstream]:
    recording = RecordingUpstream()
    yield recording
    recording.stop()


@pytest.fixture(scope="module")
def server(vllm_engine: Any, upstream: RecordingUpstream) -> Iterator[Any]:
    handle = start_server(vllm_engine, api_key=KEY, upstream=Upstream(upstream.base_url, UPSTREAM_KEY))
    yield handle
    handle.stop()


@pytest.fixture(autouse=True)
def nothing_seen_yet(upstream: RecordingUpstream) -> None:
    upstream.seen.clear()


def send(base_url: str, method: str, path: str, body: bytes = b"", key: str = KEY) -> tuple[int, Any]:
    """`method path` with `body`, the path sent byte for byte as written (no client-side normalising)."""
    parts = urlsplit(base_url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    try:
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        connection.request(method, path, body=body, headers=headers)
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read() or b"null")
    finally:
        connection.close()


# --- the pass-through passes inference routes only ----------------------------------------------------
REFUSED = [
    ("DELETE", "/v1/files/file-abc"),
    ("POST", "/v1/fine_tuning/jobs"),
    ("GET", "/v1/files"),
    ("POST", "/v1/files"),
    ("POST", "/v1/batches"),
    ("GET", "/v1/responses/resp_123"),
    ("DELETE", "/v1/models/ft:gpt-4o-mini:org::abc"),
    ("GET", "/v1/%2e%2e/secret"),
    ("POST", "/v1/%2e%2e/secret"),
    ("GET", "/v1/../secret"),
    ("POST", "/v1/embeddings/../../secret"),
    ("GET", "/v1/models/..%2f..%2fsecret"),
    ("POST", "/v1/%252e%252e/embeddings"),
    ("POST", "/v1/%2fembeddings%2f..%2f..%2fsecret"),
    ("PUT", "/v1/embeddings"),
]


@pytest.mark.parametrize(("method", "path"), REFUSED)
def test_account_routes_and_paths_out_of_v1_are_refused_and_nothing_reaches_the_upstream(
    server: Any, upstream: RecordingUpstream, method: str, path: str
) -> None:
    status, body = send(server.endpoint.base_url, method, path, b"{}")
    assert status == 404, body
    error = body["error"]
    assert error["code"] == "route_not_passed_through"
    assert f"{method} /v1/" in error["message"] and "passthrough_routes" in error["message"]
    assert upstream.seen == []


def test_inference_routes_reach_the_upstream_with_its_key_at_the_normalised_path(
    server: Any, upstream: RecordingUpstream
) -> None:
    base = server.endpoint.base_url
    for path in ("/v1/embeddings", "/v1//embeddings", "/v1/./moderations", "/v1/x/../audio/speech"):
        status, _ = send(base, "POST", path, b'{"input": "a cat"}')
        assert status == 200
    status, _ = send(base, "GET", "/v1/models/text-embedding-3-small")
    assert status == 200
    assert [(method, path, key) for method, path, key, _ in upstream.seen] == [
        ("POST", "/v1/embeddings", f"Bearer {UPSTREAM_KEY}"),
        ("POST", "/v1/embeddings", f"Bearer {UPSTREAM_KEY}"),
        ("POST", "/v1/moderations", f"Bearer {UPSTREAM_KEY}"),
        ("POST", "/v1/audio/speech", f"Bearer {UPSTREAM_KEY}"),
        ("GET", "/v1/models/text-embedding-3-small", f"Bearer {UPSTREAM_KEY}"),
    ]


def test_the_policys_own_model_entry_is_answered_here(server: Any, upstream: RecordingUpstream) -> None:
    client = server.endpoint.openai_client(max_retries=0)
    assert client.models.retrieve(server.endpoint.model).id == server.endpoint.model
    assert upstream.seen == []


def test_a_caller_without_the_key_reaches_nothing(server: Any, upstream: RecordingUpstream) -> None:
    status, body = send(server.endpoint.base_url, "POST", "/v1/embeddings", b"{}", key="sk-guess")
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    assert upstream.seen == []


def test_a_user_lists_more_routes_or_none(vllm_engine: Any, upstream: RecordingUpstream) -> None:
    more = Upstream(upstream.base_url, UPSTREAM_KEY, routes=(*ls.PASSTHROUGH_ROUTES, "DELETE /v1/files/*"))
    with start_server(vllm_engine, api_key=KEY, upstream=more) as handle:
        assert send(handle.endpoint.base_url, "DELETE", "/v1/files/file-abc")[0] == 200
        assert send(handle.endpoint.base_url, "DELETE", "/v1/files/a/b")[0] == 404  # '*' is one segment
    assert [(method, path) for method, path, _, _ in upstream.seen] == [("DELETE", "/v1/files/file-abc")]
    off = Upstream(upstream.base_url, UPSTREAM_KEY, routes=())
    with start_server(vllm_engine, api_key=KEY, upstream=off) as handle:
        status, body = send(handle.endpoint.base_url, "POST", "/v1/embeddings", b"{}")
    assert status == 404 and "passthrough_routes is empty" in body["error"]["message"]
    assert len(upstream.seen) == 1


def test_the_trainer_passes_its_routes_to_the_upstream(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning_sdk.training.run.upstream import trainer_upstream

    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-user")
    default = trainer_upstream(ls.TrainerConfig())
    assert default is not None and default.routes == ls.PASSTHROUGH_ROUTES
    more = (*ls.PASSTHROUGH_ROUTES, "POST /v1/files")
    named = ls.TrainerConfig(upstream_base_url="http://127.0.0.1:1/v1", passthrough_routes=more)
    assert trainer_upstream(named).routes == more  # type: ignore[union-attr]
    off = trainer_upstream(ls.TrainerConfig(passthrough_routes=()))
    assert off is not None and off.routes == ()


def test_a_route_that_is_not_one_is_refused_where_it_is_set() -> None:
    for bad in (["DELETE"], ["POST v1/files"], ["POST /v1/../secret"], ["POST /v1/%2e"], "POST /v1/files"):
        with pytest.raises(ValueError, match="passthrough_routes"):
            Upstream("http://127.0.0.1:1/v1", routes=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="passthrough_routes"):
            ls.TrainerConfig(passthrough_routes=bad)
        with pytest.raises(ValueError, match="passthrough_routes"):  # before the model loads
            ls.serve(upstream="http://127.0.0.1:1/v1", passthrough_routes=bad)
    with pytest.raises(ValueError, match="name one with upstream"):
        ls.serve(passthrough_routes=["POST /v1/files"])


# --- bodies, sequences and JSON -------------------------------------------------------------------------
FORTY_MB = 40 * 1024 * 1024


@pytest.mark.parametrize(
    ("path", "shape"),
    [("/chat/completions", "openai"), ("/messages", "anthropic"), ("/embeddings", "openai")],
)
def test_a_40_mb_body_is_refused_with_413_before_it_is_read(
    server: Any, upstream: RecordingUpstream, path: str, shape: str
) -> None:
    body = b'{"model": "default", "input": "' + b"x" * FORTY_MB + b'"}'
    answer = httpx.post(
        f"{server.endpoint.base_url}{path}",
        content=body,
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
        timeout=120,
    )
    assert answer.status_code == 413
    _assert_error_shape(answer.json(), shape, "max_body_bytes")
    assert upstream.seen == []


def test_a_body_without_a_length_is_counted_as_it_arrives(server: Any, upstream: RecordingUpstream) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"model": "default", "input": "'
        for _ in range(40):
            yield b"x" * (1024 * 1024)
        yield b'"}'

    answer = httpx.post(
        f"{server.endpoint.base_url}/embeddings",
        content=chunks(),
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
        timeout=120,
    )
    assert answer.status_code == 413 and answer.json()["error"]["code"] == "body_too_large"
    assert upstream.seen == []


def test_a_smaller_body_limit_is_set_in_one_place(vllm_engine: Any) -> None:
    limits = ls.RequestLimits(max_body_bytes=1024)
    with start_server(vllm_engine, api_key=KEY, limits=limits) as handle:
        big = {"model": "default", "messages": [{"role": "user", "content": "x" * 2000}]}
        status, body = send(
            handle.endpoint.base_url, "POST", "/v1/chat/completions", json.dumps(big).encode()
        )
        assert status == 413 and "1024 bytes" in body["error"]["message"]
        status, _ = send(handle.endpoint.base_url, "GET", "/v1/models")  # a route without a body still works
        assert status == 200


def test_many_prompts_times_n_is_refused_before_anything_is_generated(server: Any) -> None:
    status, body = send(
        server.endpoint.base_url,
        "POST",
        "/v1/completions",
        json.dumps({"model": "default", "prompt": ["Say hi"] * 2000, "n": 16, "max_tokens": 4}).encode(),
    )
    assert status == 400, body
    error = body["error"]
    assert error["code"] == "too_many_sequences" and error["param"] == "n"
    assert "32000" in error["message"] and "max_sequences" in error["message"]
    # Within the bound, the same route serves.
    client = server.endpoint.openai_client(max_retries=0)
    reply = client.completions.create(model="default", prompt=["Say hi"] * 4, n=2, max_tokens=2)
    assert len(reply.choices) == 8


@pytest.mark.parametrize(
    ("path", "field"),
    [("/chat/completions", "messages"), ("/completions", "prompt"), ("/messages", "messages")],
)
def test_a_prompt_too_long_to_fit_is_refused_before_it_is_tokenized(
    server: Any, path: str, field: str
) -> None:
    # 4 MB of text: under the body limit, but more characters than any prompt that fits 2048 tokens has.
    text = "word " * 800_000
    body: dict[str, Any] = {"model": "default", "max_tokens": 2}
    body.update({"prompt": text} if field == "prompt" else {"messages": [{"role": "user", "content": text}]})
    status, answer = send(server.endpoint.base_url, "POST", f"/v1{path}", json.dumps(body).encode())
    assert status == 400, answer
    assert "characters" in answer["error"]["message"]
    if path != "/messages":
        assert answer["error"]["code"] == "context_length_exceeded" and answer["error"]["param"] == field


def test_the_sequence_bound_covers_n_on_chat(vllm_engine: Any) -> None:
    with start_server(vllm_engine, api_key=KEY, limits=ls.RequestLimits(max_sequences=4)) as handle:
        body = {"model": "default", "messages": HI, "n": 8, "max_tokens": 2}
        status, answer = send(
            handle.endpoint.base_url, "POST", "/v1/chat/completions", json.dumps(body).encode()
        )
    assert status == 400 and answer["error"]["code"] == "too_many_sequences"


@pytest.mark.parametrize("depth", [100, 50_000])
@pytest.mark.parametrize(
    ("path", "shape"),
    [
        ("/chat/completions", "openai"),
        ("/completions", "openai"),
        ("/responses", "openai"),
        ("/messages", "anthropic"),
    ],
)
def test_deep_json_is_a_400_in_the_routes_shape(server: Any, path: str, shape: str, depth: int) -> None:
    deep = b'{"model": "default", "messages": ' + b"[" * depth + b"]" * depth + b"}"
    status, body = send(server.endpoint.base_url, "POST", f"/v1{path}", deep)
    assert status == 400, body
    _assert_error_shape(body, shape, "deep")


@pytest.mark.parametrize(("path", "shape"), [("/chat/completions", "openai"), ("/messages", "anthropic")])
def test_malformed_json_is_a_400_in_the_routes_shape(server: Any, path: str, shape: str) -> None:
    for broken in (b'{"model": "default", "messages": [', b"\xff\xfe", b'{"a": 1}}'):
        status, body = send(server.endpoint.base_url, "POST", f"/v1{path}", broken)
        assert status == 400, body
        _assert_error_shape(body, shape, "not valid JSON")


def _assert_error_shape(body: Any, shape: str, mentions: str) -> None:
    if shape == "anthropic":
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
        assert body["error"]["type"] in ("invalid_request_error", "request_too_large")
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"}
    assert mentions in body["error"]["message"]


# --- a client that goes away ----------------------------------------------------------------------------
def test_a_non_streaming_request_whose_client_goes_away_stops_generating(
    server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="lightning_sdk.serving.http.disconnect")
    loop = server.engine._loop
    # An answer that cannot end before max_tokens (the schema asks for more digits than fit), so the
    # engine is still generating it when the client goes, however fast this machine is.
    digits = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 5000}
    body = json.dumps(
        {
            "model": "default",
            "messages": [{"role": "user", "content": "List digits."}],
            "max_tokens": 1500,
            "response_format": {"type": "json_schema", "json_schema": {"name": "d", "schema": digits}},
        }
    ).encode()
    parts = urlsplit(server.endpoint.base_url)
    client = socket.create_connection((parts.hostname, parts.port))
    client.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    _wait_for(lambda: loop.busy, "the engine to start the request")
    client.close()  # the client goes away without reading an answer
    _wait_for(lambda: any("client went away" in r.getMessage() for r in caplog.records), "the disconnect")
    # The abort went to the engine before the log line; the engine thread runs commands in order.
    assert loop.call(lambda engine: engine.has_unfinished_requests(), timeout=60) is False
    assert not loop.busy


def _wait_for(condition: Any, what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.01)


def test_the_trainer_endpoint_takes_its_limits_from_the_config(vllm_engine: Any) -> None:
    from lightning_sdk.serving.options import SamplingPolicy
    from lightning_sdk.training.run.startup import start_endpoint

    config = ls.TrainerConfig(request_limits=ls.RequestLimits(max_sequences=2))
    handle = start_endpoint(vllm_engine, config, SamplingPolicy(accept_any_model=True), [], "127.0.0.1", 0)
    try:
        body = {"model": "default", "messages": HI, "n": 3, "max_tokens": 2}
        status, answer = send(
            handle.endpoint.base_url,
            "POST",
            "/v1/chat/completions",
            json.dumps(body).encode(),
            key=handle.endpoint.api_key,
        )
    finally:
        handle.stop()
    assert status == 400 and answer["error"]["code"] == "too_many_sequences"
    assert "TrainerConfig(request_limits=" in answer["error"]["message"]
    with pytest.raises(ValueError, match="request_limits"):
        ls.TrainerConfig(request_limits={"max_sequences": 2})  # type: ignore[arg-type]
