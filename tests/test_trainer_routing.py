"""`fit` trains an agent whose client was built before it started (as at import time), pointed at a hosted
model: the calls the policy replaces reach the trainer's endpoint and are trained, the rest keep their
destination, and outside `fit` nothing is redirected. `openai_server` stands in for the hosted model and
counts what reaches it."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

import lightning_sdk as ls
from lightning_sdk.training.records.metrics import read_metrics
from tests.fixtures.openai_server import OpenAITestServer

pytestmark = pytest.mark.slow

TASKS = [{"id": i, "question": f"Name a colour number {i}."} for i in range(2)]


@pytest.fixture
def hosted(openai_server: OpenAITestServer) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=openai_server.base_url, api_key=openai_server.api_key, max_retries=0)
    yield client
    client.close()


def _config(run_dir: Path, **overrides: Any) -> ls.TrainerConfig:
    fields: dict[str, Any] = {
        "group_size": 2,
        "batch_size": 2,
        "max_steps": 1,
        "max_tokens": 6,
        "learning_rate": 1e-3,
        "save_every": 0,
        "eval_every": 0,
        "run_dir": str(run_dir),
        "progress_bar": False,
    }
    return ls.TrainerConfig(**{**fields, **overrides})


def _ask(client: openai.OpenAI, model: str, question: str) -> str:
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": question}], max_tokens=6
    )
    return reply.choices[0].message.content or ""


def _step(run_dir: Path) -> dict[str, Any]:
    [record] = [record for record in read_metrics(run_dir) if "reward_mean" in record]
    return record


def _served_by_the_policy(run_dir: Path, model: str) -> list[bool]:
    """For each recorded call to `model` in the run, whether the policy's endpoint served it: it has the
    endpoint's token ids. (Not the step's `calls_trained`: a group whose two sampled answers happen to
    score the same trains no call, and that depends on the seed.)"""
    with ls.EpisodeStore(run_dir / "episodes.sqlite") as store:
        calls = [call for episode in store.episodes() for call in episode.all_calls() if call.model == model]
    return [call.prompt_token_ids is not None and call.completion_token_ids is not None for call in calls]


def test_with_no_setting_every_call_of_an_import_time_client_is_trained(
    vllm_engine: Any, tmp_path: Path, openai_server: OpenAITestServer, hosted: openai.OpenAI
) -> None:
    @ls.trace_agent(name="solver")
    def solver(task: dict[str, Any]) -> str:
        return _ask(hosted, "gpt-4o-mini", task["question"])

    ls.Trainer(config=_config(tmp_path / "run"), engine=vllm_engine).fit(
        solver, TASKS, reward=lambda task, answer: len(answer) / 40
    )
    assert openai_server.requests == []  # no rollout call reached the hosted model
    record = _step(tmp_path / "run")
    assert _served_by_the_policy(tmp_path / "run", "gpt-4o-mini") == [True] * 4
    assert "calls_untrained_other_endpoint" not in record

    solver({"question": "In production"})  # after fit: the hosted model, as the client was built
    assert [request["model"] for request in openai_server.requests] == ["gpt-4o-mini"]


def test_the_map_keeps_a_hosted_judge_and_names_a_key_no_call_used(
    vllm_engine: Any,
    tmp_path: Path,
    openai_server: OpenAITestServer,
    hosted: openai.OpenAI,
    caplog: pytest.LogCaptureFixture,
) -> None:
    @ls.trace_agent(name="solver")
    def solver(task: dict[str, Any]) -> str:
        answer = _ask(hosted, "policy-model", task["question"])
        _ask(hosted, "judge", f"Is {answer!r} a colour?")
        return answer

    routes = {"policy-model": "policy", "gpt-typo": "policy"}
    with caplog.at_level(logging.WARNING, logger="lightning_sdk.training"):
        ls.Trainer(config=_config(tmp_path / "run", routes=routes), engine=vllm_engine).fit(
            solver, TASKS, reward=lambda task, answer: len(answer) / 40
        )
    assert [request["model"] for request in openai_server.requests] == ["judge"] * 4
    record = _step(tmp_path / "run")
    assert record["calls_untrained_other_endpoint"] == 4  # the judge's calls: not the policy's to learn
    assert _served_by_the_policy(tmp_path / "run", "policy-model") == [True] * 4
    [warning] = [r.getMessage() for r in caplog.records if "selected no call" in r.getMessage()]
    assert "'gpt-typo'" in warning and "'judge', 'policy-model'" in warning
