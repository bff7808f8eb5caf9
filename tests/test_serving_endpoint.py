"""LLMEndpoint: plain data that builds openai clients and environment variables."""

from __future__ import annotations

import os
import subprocess
import sys

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
    }
    for name in endpoint.env:
        monkeypatch.delenv(name, raising=False)
    endpoint.export_env()
    assert os.environ["OPENAI_BASE_URL"] == "http://127.0.0.1:9/v1"
    assert str(openai.OpenAI().base_url).rstrip("/") == "http://127.0.0.1:9/v1"


def test_endpoint_and_serve_import_without_torch() -> None:
    code = (
        "import sys, lightning_sdk as ls; ls.LLMEndpoint; ls.serve; import lightning_sdk.engine;"
        "heavy = [m for m in ('torch', 'vllm', 'transformers', 'fastapi') if m in sys.modules];"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
