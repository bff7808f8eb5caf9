"""LLMEndpoint: plain data that builds openai and anthropic clients and environment variables."""

from __future__ import annotations

import os
import subprocess
import sys

import anthropic
import openai
import pytest

import lightning_sdk as ls


def test_endpoint_builds_clients_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    endpoint = ls.LLMEndpoint("http://127.0.0.1:9/v1", "sk-test", "m")
    client = endpoint.openai_client()
    assert isinstance(client, openai.OpenAI)
    assert str(client.base_url).rstrip("/") == "http://127.0.0.1:9/v1"
    assert client.api_key == "sk-test"
    assert isinstance(endpoint.async_openai_client(), openai.AsyncOpenAI)
    assert endpoint.env == {
        "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_MODEL": "m",
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:9",  # the anthropic client adds /v1/messages itself
        "ANTHROPIC_API_KEY": "sk-test",
    }
    for name in endpoint.env:
        monkeypatch.delenv(name, raising=False)
    endpoint.export_env()
    assert os.environ["OPENAI_BASE_URL"] == "http://127.0.0.1:9/v1"
    assert str(openai.OpenAI().base_url).rstrip("/") == "http://127.0.0.1:9/v1"
    hosted = anthropic.Anthropic()  # built from the environment, as an agent's default client is
    assert str(hosted.base_url).rstrip("/") == "http://127.0.0.1:9" and hosted.api_key == "sk-test"
    assert str(endpoint.anthropic_client().base_url).rstrip("/") == "http://127.0.0.1:9"
    assert isinstance(endpoint.async_anthropic_client(), anthropic.AsyncAnthropic)


def test_endpoint_and_serve_import_without_torch() -> None:
    code = (
        "import sys, lightning_sdk as ls; ls.LLMEndpoint; ls.serve; import lightning_sdk.engine;"
        "heavy = [m for m in ('torch', 'vllm', 'transformers', 'fastapi') if m in sys.modules];"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
