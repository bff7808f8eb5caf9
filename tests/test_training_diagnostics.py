"""Warnings for steps with nothing to learn from: each names its cause and the fix, once per run."""

from __future__ import annotations

from lightning_sdk.tracing.episode import Episode, LLMCall
from lightning_sdk.training.algorithm.diagnostics import StepDiagnostics, step_problems

ENDPOINT = "http://127.0.0.1:8000/v1"


def call(base_url: str | None = ENDPOINT, token_ids: bool = True) -> LLMCall:
    ids = [1, 2, 3] if token_ids else None
    return LLMCall(base_url=base_url, prompt_token_ids=ids, completion_token_ids=ids, text="hi")


def episode(*calls: LLMCall, error: dict[str, str] | None = None) -> Episode:
    return Episode(name="agent", calls=list(calls), error=error)


def test_a_healthy_step_has_no_problem() -> None:
    groups = [[episode(call()), episode(call("http://localhost:8000/v1/"))], [episode(call())]]
    assert step_problems(groups, ENDPOINT) == {}


def test_calls_to_another_server_name_the_server_and_the_fix() -> None:
    groups = [[episode(call("https://api.openai.com/v1")), episode(call("https://api.openai.com/v1"))]]
    problems = step_problems(groups, ENDPOINT)
    assert list(problems) == ["other_server"]
    assert "https://api.openai.com/v1" in problems["other_server"]
    assert "TrainerConfig(routes=...)" in problems["other_server"]


def test_one_call_reaching_the_endpoint_is_enough() -> None:
    # An agent may also call a judge elsewhere on purpose; that is not a mistake.
    groups = [[episode(call("https://api.openai.com/v1"), call())]]
    assert step_problems(groups, ENDPOINT) == {}


def test_episodes_without_calls_and_failing_episodes() -> None:
    assert list(step_problems([[episode(), episode()]], ENDPOINT)) == ["no_calls"]
    failed = [[episode(error={"type": "KeyError", "message": "'question'"})] * 3]
    problems = step_problems(failed, ENDPOINT)
    assert list(problems) == ["all_failed"]
    assert "all 3 episodes" in problems["all_failed"] and "KeyError: 'question'" in problems["all_failed"]


def test_calls_without_token_ids() -> None:
    assert list(step_problems([[episode(call(token_ids=False))]], ENDPOINT)) == ["no_token_ids"]


def test_each_cause_is_reported_once_per_run() -> None:
    diagnostics = StepDiagnostics(ENDPOINT)
    stale = [[episode(call("https://api.openai.com/v1"))]]
    assert len(diagnostics.new_problems(stale)) == 1
    assert diagnostics.new_problems(stale) == []
    assert len(diagnostics.new_problems([[episode()]])) == 1  # a new cause is still reported
