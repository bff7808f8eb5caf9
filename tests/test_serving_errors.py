"""Bad input gets an OpenAI error object and a 4xx; engine failures a 500; the server keeps serving."""

from __future__ import annotations

import asyncio
import socket
import threading

import httpx
import openai
import pytest

pytestmark = pytest.mark.slow

HI = [{"role": "user", "content": "hi"}]

BAD_CHAT_REQUESTS = [
    ({"n": 0}, 400, "n"),
    ({"n": 100}, 400, "n"),
    ({"max_tokens": 0}, 400, "max_tokens"),
    ({"max_tokens": 10_000}, 400, "context_length_exceeded"),
    ({"temperature": -1}, 400, "temperature"),
    ({"temperature": "hot"}, 400, "temperature"),
    ({"top_p": 0}, 400, "top_p"),
    ({"top_logprobs": 3}, 400, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 50}, 400, "top_logprobs"),
    ({"stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ({"messages": []}, 400, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        400,
        "messages",
    ),
    ({"messages": [{"role": "user", "content": "hi " * 3000}]}, 400, "context_length_exceeded"),
    ({"tools": [{"type": "retrieval"}]}, 400, "tools"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, 400, "tools"),
    ({"tool_choice": "required", "tools": "add"}, 400, "tools"),
    ({"tool_choice": "required"}, 400, "tool_choice"),  # no tools to call
    ({"tool_choice": "none", "tools": [{"type": "retrieval"}]}, 400, "tools"),  # still validated
    ({"seed": 2**64}, 400, "seed"),  # would overflow the engine's generator
    ({"max_completion_tokens": 0}, 400, "max_tokens"),
    ({"model": "gpt-4o"}, 404, "model_not_found"),
    ({"presence_penalty": 2.5}, 400, "presence_penalty"),
    ({"frequency_penalty": -3}, 400, "frequency_penalty"),
    ({"response_format": {"type": "grammar"}}, 400, "response_format"),
]


def _assert_next_request_works(endpoint) -> None:
    reply = endpoint.openai_client().chat.completions.create(model=endpoint.model, messages=HI, max_tokens=2)
    assert reply.choices[0].token_ids


def _assert_refused(endpoint, path: str, body: dict, status: int, mentions: str) -> None:
    """POST `body`; expect `status` with an OpenAI error object naming `mentions` (its param or code)."""
    response = httpx.post(
        f"{endpoint.base_url}{path}",
        json=body,
        headers={"Authorization": f"Bearer {endpoint.api_key}"},
        timeout=60,
    )
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == mentions or (error["param"] or "").startswith(mentions), error
    _assert_next_request_works(endpoint)


@pytest.mark.parametrize(("change", "status", "mentions"), BAD_CHAT_REQUESTS)
def test_bad_chat_request_is_refused_cleanly(served_endpoint, change, status, mentions) -> None:
    endpoint = served_endpoint.endpoint
    body = {"model": endpoint.model, "messages": HI, "max_tokens": 4, **change}
    _assert_refused(endpoint, "/chat/completions", body, status, mentions)


BAD_COMPLETION_REQUESTS = [
    ({"n": 0}, 400, "n"),
    ({"max_tokens": 0}, 400, "max_tokens"),
    ({"max_tokens": 10_000}, 400, "context_length_exceeded"),
    ({"temperature": 5}, 400, "temperature"),
    ({"seed": -(2**63) - 1}, 400, "seed"),
    ({"prompt": []}, 400, "prompt"),
    ({"model": "gpt-4o"}, 404, "model_not_found"),
]


@pytest.mark.parametrize(("change", "status", "mentions"), BAD_COMPLETION_REQUESTS)
def test_bad_completion_request_is_refused_cleanly(served_endpoint, change, status, mentions) -> None:
    endpoint = served_endpoint.endpoint
    body = {"model": endpoint.model, "prompt": "Once upon a time", "max_tokens": 4, **change}
    _assert_refused(endpoint, "/completions", body, status, mentions)


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b""])
def test_malformed_json_is_a_400(served_endpoint, content) -> None:
    endpoint = served_endpoint.endpoint
    response = httpx.post(
        f"{endpoint.base_url}/chat/completions",
        content=content,
        headers={"Authorization": f"Bearer {endpoint.api_key}"},
    )
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    _assert_next_request_works(endpoint)


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic abc"}])
def test_missing_or_wrong_key_is_a_401(served_endpoint, headers) -> None:
    endpoint = served_endpoint.endpoint
    for method, path in (("GET", "/models"), ("POST", "/chat/completions"), ("POST", "/completions")):
        response = httpx.request(method, endpoint.base_url + path, headers=headers, json={})
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"
    _assert_next_request_works(endpoint)


def test_openai_client_raises_typed_errors(served_endpoint) -> None:
    endpoint = served_endpoint.endpoint
    client = endpoint.openai_client(max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=HI)
    with pytest.raises(openai.BadRequestError) as too_long:
        client.chat.completions.create(model=endpoint.model, messages=HI, max_tokens=100_000, stream=True)
    assert too_long.value.code == "context_length_exceeded"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=endpoint.base_url, api_key="wrong", max_retries=0).models.list()
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=endpoint.model, prompt=[10**9], max_tokens=2)


def test_a_server_that_does_not_start_leaves_neither_thread_nor_port(
    bundled_model, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uvicorn

    from lightning_sdk.engine import TransformersEngine
    from lightning_sdk.serving import start_server

    engine = TransformersEngine(bundled_model, max_model_len=256)

    # Its startup waits until told to exit, as one stuck loading or binding would, so the deadline passes
    # every time.
    async def stuck_startup(self: uvicorn.Server, sockets: object = None) -> None:
        while not self.should_exit:
            await asyncio.sleep(0.01)

    def servers() -> set[threading.Thread]:
        return {thread for thread in threading.enumerate() if thread.name == "lightning-sdk-server"}

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    servers_before = servers()
    with monkeypatch.context() as patch:
        patch.setattr(uvicorn.Server, "startup", stuck_startup)
        with pytest.raises(RuntimeError, match=f"did not start on 127.0.0.1:{port}"):
            start_server(engine, port=port, startup_timeout=0.2)
    assert servers() <= servers_before  # other tests' servers may still run
    with socket.socket() as again:
        again.bind(("127.0.0.1", port))
    engine.shutdown()


def test_engine_failure_is_a_500_not_a_hang(bundled_model) -> None:
    from lightning_sdk.engine import TransformersEngine
    from lightning_sdk.serving import start_server

    engine = TransformersEngine(bundled_model, max_model_len=256)
    with start_server(engine) as server:
        endpoint = server.endpoint
        client = endpoint.openai_client(max_retries=0, timeout=30)
        assert client.chat.completions.create(model=endpoint.model, messages=HI, max_tokens=2).choices
        engine.shutdown()  # the engine is gone; the server must say so instead of hanging
        with pytest.raises(openai.InternalServerError, match="shut down"):
            client.chat.completions.create(model=endpoint.model, messages=HI, max_tokens=2)
        with pytest.raises(openai.InternalServerError, match="shut down"):
            client.chat.completions.create(model=endpoint.model, messages=HI, max_tokens=2, stream=True)
        assert httpx.get(endpoint.base_url.removesuffix("/v1") + "/health").status_code == 200
