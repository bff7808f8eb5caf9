"""Requests the policy does not serve (a retriever's `/v1/embeddings`) pass through to the upstream API the
agent would otherwise have called, or get a 404 that names the setting. The upstream is a real HTTP server
(`OpenAITestServer`, which serves embeddings); the client is the real openai client; the policy's server
runs on the real vLLM engine."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

import lightning_sdk as ls
from lightning_sdk.serving import Upstream, start_server
from lightning_sdk.serving.passthrough.upstream import OPENAI_API_BASE
from lightning_sdk.training.records.metrics import read_metrics

pytestmark = pytest.mark.slow


@pytest.fixture
def policy_server(vllm_engine: Any, openai_server: Any) -> Iterator[Any]:
    """The policy's server with the test server as its upstream."""
    handle = start_server(vllm_engine, upstream=Upstream(openai_server.base_url, openai_server.api_key))
    yield handle
    handle.stop()


def test_embeddings_pass_through_to_the_upstream_with_its_key(policy_server: Any, openai_server: Any) -> None:
    client = policy_server.endpoint.openai_client(max_retries=0)
    reply = client.embeddings.create(model="text-embedding-3-small", input=["a cat", "two dogs run"])
    assert [item.embedding for item in reply.data] == [[0.05, 0.1], [0.12, 0.2]]
    # The upstream answered, so it got its own key (it refuses any other); it saw the body unchanged.
    assert openai_server.requests == [
        {"model": "text-embedding-3-small", "input": ["a cat", "two dogs run"], "encoding_format": "base64"}
    ]
    # The policy's own routes are still served here, not passed through.
    chat = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Hi"}], max_tokens=2, temperature=0
    )
    assert chat.model == policy_server.endpoint.model and len(openai_server.requests) == 1


def test_a_caller_without_our_key_gets_401_and_the_upstream_sees_nothing(
    policy_server: Any, openai_server: Any
) -> None:
    stranger = openai.OpenAI(base_url=policy_server.endpoint.base_url, api_key="not-our-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        stranger.embeddings.create(model="m", input="x")
    assert openai_server.requests == []


def test_the_upstreams_errors_come_back_unchanged(vllm_engine: Any, openai_server: Any) -> None:
    with start_server(vllm_engine, upstream=Upstream(openai_server.base_url, "a-wrong-key")) as handle:
        client = handle.endpoint.openai_client(max_retries=0)
        with pytest.raises(openai.AuthenticationError, match="Incorrect API key provided"):
            client.embeddings.create(model="m", input="x")


def test_without_an_upstream_other_routes_get_a_404_that_names_the_setting(served_endpoint: Any) -> None:
    client = served_endpoint.endpoint.openai_client(max_retries=0)
    with pytest.raises(openai.NotFoundError) as caught:
        client.embeddings.create(model="m", input="x")
    message = caught.value.body["message"]
    assert "POST /v1/embeddings is not served here" in message and "--upstream" in message
    assert caught.value.body["code"] == "unknown_route"
    endpoint = served_endpoint.endpoint
    answer = httpx.get(f"{endpoint.base_url}/files", headers={"Authorization": f"Bearer {endpoint.api_key}"})
    assert answer.status_code == 404 and "GET /v1/files" in answer.json()["error"]["message"]


def test_an_unreachable_upstream_is_a_502_that_names_it(vllm_engine: Any) -> None:
    closed = f"http://127.0.0.1:{_free_port()}/v1"
    with start_server(vllm_engine, upstream=Upstream(closed, "k")) as handle:
        client = handle.endpoint.openai_client(max_retries=0)
        with pytest.raises(openai.InternalServerError) as caught:
            client.embeddings.create(model="m", input="x")
        assert caught.value.status_code == 502 and closed in caught.value.body["message"]
        # and the server goes on serving its own routes
        assert client.models.list().data[0].id == handle.endpoint.model


def test_an_upstream_that_is_this_server_is_refused_not_looped(vllm_engine: Any) -> None:
    port, key = _free_port(), "sk-loop-test"
    itself = Upstream(f"http://127.0.0.1:{port}/v1", key)
    with start_server(vllm_engine, port=port, api_key=key, upstream=itself) as handle:
        client = handle.endpoint.openai_client(max_retries=0)
        with pytest.raises(openai.APIStatusError) as caught:
            client.embeddings.create(model="m", input="x")
        assert caught.value.status_code == 508 and "not this endpoint" in caught.value.body["message"]


def test_the_upstream_defaults_to_what_the_openai_client_would_call() -> None:
    assert Upstream.from_environment({}) is None
    assert Upstream.from_environment({"OPENAI_API_KEY": "sk-1"}) == Upstream(OPENAI_API_BASE, "sk-1")
    assert Upstream.from_environment(
        {"OPENAI_BASE_URL": "http://h:1/v1/", "OPENAI_API_KEY": "sk-1"}
    ) == Upstream("http://h:1/v1", "sk-1")
    assert (
        Upstream.from_environment({"OPENAI_BASE_URL": "http://h:1/v1", "MY_KEY": "k"}, "MY_KEY").api_key
        == "k"
    )
    assert "sk-1" not in repr(Upstream(OPENAI_API_BASE, "sk-1"))
    with pytest.raises(ValueError, match="http"):
        Upstream("api.openai.com/v1")


def test_a_rag_agent_that_embeds_through_openai_trains(
    vllm_engine: Any, openai_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RETRIEVER_KEY", openai_server.api_key)
    documents = {"paris": "Paris is the capital of France.", "rome": "Rome is the capital of Italy."}

    @ls.trace_agent(name="rag")
    def rag(task: dict[str, str]) -> str:
        client = openai.OpenAI(max_retries=0)  # built from the environment, as agents do
        query = client.embeddings.create(model="text-embedding-3-small", input=task["question"]).data[0]
        best = min(documents.values(), key=lambda doc: abs(len(doc) / 100.0 - query.embedding[0]))
        reply = client.chat.completions.create(
            model="gpt-4o-mini",
            max_tokens=8,
            messages=[{"role": "user", "content": f"{best}\nQuestion: {task['question']}"}],
        )
        return reply.choices[0].message.content or ""

    config = ls.TrainerConfig(
        group_size=2,
        batch_size=2,
        max_steps=1,
        max_tokens=8,
        save_every=0,
        eval_every=0,
        run_dir=str(tmp_path / "run"),
        progress_bar=False,
        upstream_base_url=openai_server.base_url,
        upstream_api_key_env="RETRIEVER_KEY",
    )
    tasks = [
        {"question": "What is the capital of France?", "answer": "Paris"},
        {"question": "What is the capital of Italy?", "answer": "Rome"},
    ]
    try:
        ls.Trainer(config=config, engine=vllm_engine).fit(
            rag, tasks, reward=lambda task, answer: float(task["answer"] in answer)
        )
    finally:
        vllm_engine.load_adapter(None, version=None)
    (step,) = [r for r in read_metrics(tmp_path / "run") if "reward_mean" in r]
    assert step["episodes"] == 4 and step.get("episodes_failed", 0) == 0
    assert len(openai_server.requests) == 4  # each episode's embedding went upstream, none of its chat calls
    with ls.EpisodeStore(tmp_path / "run" / "episodes.sqlite") as store:
        calls = [call for episode in store.episodes() for call in episode.all_calls()]
    assert len(calls) == 4 and all(call.trainable for call in calls)  # only the chat calls are recorded


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
