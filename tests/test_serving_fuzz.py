"""Property-based fuzzing of the OpenAI-compatible HTTP surface, on the real vLLM engine over real HTTP.

Schemathesis reads the server's own OpenAPI document (`GET /openapi.json`, built from the request
models that validate bodies) and generates requests for every route: bodies that follow the schema
(positive) and bodies that break it (negative: wrong types, missing fields, out-of-range values).
Hypothesis adds what no schema describes: bodies that are not JSON objects, not JSON or not UTF-8,
unknown paths and methods, missing or wrong keys. For every request the server must answer within the
timeout, or a 4xx whose body is an OpenAI error object (Anthropic's on the Messages routes); never a
5xx. Afterwards it still serves, and a greedy request gives the same token ids as before the fuzz.

Generation is deterministic so CI runs the same cases every time; set `LIGHTNING_SDK_FUZZ_SEED` to
explore new ones (the property holds for any seed) and `LIGHTNING_SDK_FUZZ_EXAMPLES` for more of them.
Explicit lengths are kept to at most 16 tokens and 4 choices, or past the context window, however they
are written (the request models read `"1000"` and `1000.0` as 1000): the values in between are valid and
only cost generation time, which `default_max_tokens` bounds for requests that omit them.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

pytestmark = pytest.mark.slow

KEY = "fuzz-key"
FUZZ_SEED = os.environ.get("LIGHTNING_SDK_FUZZ_SEED")
EXAMPLES = int(os.environ.get("LIGHTNING_SDK_FUZZ_EXAMPLES", "150"))
TIMEOUT_S = 60.0
ERROR_FIELDS = {"message", "type", "param", "code"}
tried: dict[str, int] = {}
statuses: dict[int, int] = {}


def fuzz_settings(examples: int = EXAMPLES) -> Any:
    configured = settings(
        max_examples=examples,
        deadline=None,  # the engine's time is not the property; TIMEOUT_S catches a hang
        derandomize=FUZZ_SEED is None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )
    return (lambda test: seed(int(FUZZ_SEED))(configured(test))) if FUZZ_SEED else configured


@pytest.fixture(scope="module")
def server(vllm_engine: Any) -> Iterator[Any]:
    from lightning_sdk.serving import start_server

    handle = start_server(vllm_engine, api_key=KEY, default_max_tokens=8)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def http(server: Any) -> Iterator[httpx.Client]:
    root = server.endpoint.base_url.removesuffix("/v1")
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=root, headers=headers, timeout=TIMEOUT_S) as client:
        yield client


@pytest.fixture(scope="module")
def before_fuzz(http: httpx.Client) -> dict[str, Any]:
    """A greedy answer taken before any fuzz case (the module's first test asks for it)."""
    return greedy(http)


def greedy(http: httpx.Client) -> dict[str, Any]:
    body = {
        "model": "default",
        "messages": [{"role": "user", "content": "Name three colours."}],
        "temperature": 0,
        "max_tokens": 12,
    }
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def is_messages(path: str) -> bool:
    """Anthropic's Messages routes answer in Anthropic's shapes."""
    return path.startswith("/v1/messages")


def check_answer(response: Any, path: str, anthropic: bool = False) -> None:
    """The property: 2xx, or 4xx with an OpenAI error object (Anthropic's when `anthropic`); never 5xx.
    `response` is httpx's or Schemathesis's (both have `status_code`, `headers` and `text`)."""
    tried[path] = tried.get(path, 0) + 1
    statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
    content_type = response.headers.get("content-type", "")
    content_type = content_type[0] if isinstance(content_type, list) else content_type
    assert response.status_code < 500, f"{response.status_code} on {path}: {response.text[:500]}"
    if response.status_code >= 400:
        body = json.loads(response.text)
        error = body["error"]
        if anthropic:
            assert body["type"] == "error" and set(error) == {"type", "message"}
        else:
            assert set(error) == ERROR_FIELDS
        assert isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str)
        return
    if content_type.startswith("text/event-stream"):
        # SSE lines end at CR, LF or CRLF only: str.splitlines() would also split an event whose text holds
        # U+2028 or U+0085, which JSON leaves as they are (the model samples such characters now and then).
        lines = re.split(r"\r\n|\r|\n", response.text)
        events = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
        # Schemathesis stops reading a stream after 20 events (`stream_cut_short`): the events it read must
        # still be whole, but the end was never read, so it cannot be checked.
        if not getattr(response, "stream_cut_short", False):
            if path == "POST /v1/responses":  # Responses streams end with their final event, not [DONE]
                final = json.loads(events[-1])["type"]
                assert final in ("response.completed", "response.incomplete", "error")
                events.append("[DONE]")
            elif anthropic:  # so do Messages streams
                assert json.loads(events[-1])["type"] in ("message_stop", "error")
                events.append("[DONE]")
            assert events and events[-1] == "[DONE]", response.text[-300:]
        for event in events:
            if event != "[DONE]":
                json.loads(event)  # every event is JSON: a chunk, or an error object if the engine failed
    elif path == "POST /v1/messages":  # a Message: content blocks and the token ids
        answer = json.loads(response.text)
        assert answer["type"] == "message" and answer["prompt_token_ids"] and "token_ids" in answer
    elif path == "POST /v1/messages/count_tokens":
        assert json.loads(response.text)["input_tokens"] > 0
    elif path == "POST /v1/responses":  # a Response: output items and the prompt's token ids
        answer = json.loads(response.text)
        assert answer["object"] == "response" and answer["output"] and answer["prompt_token_ids"]
    elif path.startswith("POST /v1/"):  # a completion: choices with the sampled token ids
        answer = json.loads(response.text)
        assert answer["choices"] and all(isinstance(c["token_ids"], list) for c in answer["choices"])
    else:
        assert isinstance(json.loads(response.text), dict)


def test_the_server_describes_its_routes(http: httpx.Client, before_fuzz: dict[str, Any]) -> None:
    document = httpx.get(str(http.base_url) + "/openapi.json").json()  # no key needed, like /health
    assert document["openapi"].startswith("3.1")
    assert set(document["paths"]) == {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/models",
        "/health",
    }
    chat = document["components"]["schemas"]["ChatRequest"]
    assert chat["required"] == ["model", "messages"] and chat["additionalProperties"] is True
    assert before_fuzz["choices"][0]["token_ids"]


# --- schema-driven cases (Schemathesis) ----------------------------------------------------------------
@pytest.fixture(scope="module")
def api_cases(server: Any) -> Any:
    """Requests Schemathesis generates from the server's own OpenAPI document, loaded over HTTP: half
    follow the schema, half break it."""
    schema = schemathesis.openapi.from_url(server.endpoint.base_url.removesuffix("/v1") + "/openapi.json")
    cases = schema.as_strategy(GenerationMode.POSITIVE) | schema.as_strategy(GenerationMode.NEGATIVE)
    # Most generated model names are unknown (a quick 404): name the served alias in most cases so that
    # requests reach the engine.
    return cases.flatmap(
        lambda case: st.sampled_from(["default", "default", "default", None]).map(
            lambda model: served_and_bounded(case, model)
        )
    )


def served_and_bounded(case: Any, model: str | None) -> Any:
    """The case with `model` (None keeps the generated one) and cheap lengths: at most 16 tokens and 4
    choices, or past the context window (see the module doc)."""
    body = case.body
    if not isinstance(body, dict):
        return case
    body = dict(body)
    if model is not None:
        body["model"] = model
    for name in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        if name in body:
            body[name] = bounded(body[name], 16, 2048)
    if "n" in body:
        body["n"] = bounded(body["n"], 4, None)
    case.body = body
    return case


def bounded(value: Any, most: int, past: int | None) -> Any:
    """`value`, or the same kind of value below `most` when the server would read it as an integer between
    `most` and `past` (a costly length or count). The request models read integers leniently, as pydantic
    does: `"1000"` and `1000.0` are 1000, so a negative case that sends them would ask for 1000 tokens, a
    generation whose time depends on when the sampled answer ends (once over the 60 s timeout)."""
    number = lenient_int(value)
    if number is None or number <= most or (past is not None and number > past):
        return value
    small = number % (most + 1)
    return str(small) if isinstance(value, str) else type(value)(small)


def lenient_int(value: Any) -> int | None:
    """The integer a lenient integer field reads from `value`, or None when it reads none."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return None
    return None


def test_every_generated_request_gets_a_2xx_or_an_openai_4xx(api_cases: Any, server: Any) -> None:
    root = server.endpoint.base_url.removesuffix("/v1")

    @fuzz_settings(examples=3 * EXAMPLES)
    @given(case=api_cases)
    def fuzz(case: Any) -> None:
        # Schemathesis serialises the body (a negative case may not be JSON at all).
        response = case.call(base_url=root, headers={"Authorization": f"Bearer {KEY}"}, timeout=TIMEOUT_S)
        check_answer(response, f"{case.method} {case.path}", anthropic=is_messages(case.path))

    fuzz()


# --- raw requests (Hypothesis) ------------------------------------------------------------------------
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@fuzz_settings()
@given(
    path=st.sampled_from(
        [
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/responses",
            "/v1/messages",
            "/v1/messages/count_tokens",
            "/v1/models",
            "/health",
            "/v1/nope",
            "/v1/chat/completions/x",
            "/",
            "/openapi.json",
        ]
    ),
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE"]),
    raw=st.binary(max_size=64) | json_values.map(lambda value: json.dumps(value).encode()),
    authorization=st.sampled_from([f"Bearer {KEY}", "Bearer wrong", "Bearer", "Basic Zm9vOmJhcg=="]),
)
def test_raw_bodies_methods_paths_and_keys_get_an_openai_answer(
    http: httpx.Client, path: str, method: str, raw: bytes, authorization: str
) -> None:
    headers = {"Authorization": authorization}
    response = http.request(method, path, content=raw, headers=headers)
    check_answer(response, f"{method} (raw)", anthropic=is_messages(path))


def test_after_the_fuzz_the_server_serves_the_same_tokens(http: httpx.Client, before_fuzz: dict) -> None:
    assert http.get("/health").json()["status"] == "ok"
    after = greedy(http)
    assert after["choices"][0]["token_ids"] == before_fuzz["choices"][0]["token_ids"]
    assert after["prompt_token_ids"] == before_fuzz["prompt_token_ids"]
    total = sum(tried.values())
    seen = f"{dict(sorted(tried.items()))}; statuses {dict(sorted(statuses.items()))}"
    print(f"\nfuzzed {total} requests: {seen}")
    assert total >= EXAMPLES
