"""The calculator example (examples/calc_autogen): its calculator, data, answer extraction and reward, and
a short real training run of the AutoGen agent on the session's vLLM engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lightning_sdk.examples.calc_autogen.calculator import (
    MAX_EXPONENT,
    MAX_EXPRESSION_CHARS,
    CalculatorError,
    calculate,
    calculator,
)
from lightning_sdk.examples.calc_autogen.data import TEMPLATES, make_problems, train_test_split
from lightning_sdk.tracing.store import EpisodeStore


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("1 + 2 * 3", 7),
        ("(1 + 2) * 3", 9),
        ("7 / 2", 3.5),
        ("7 // 2", 3),
        ("7 % 4", 3),
        ("2 ** 10", 1024),
        ("-3 + +5", 2),
        ("-(4 - 10)", 6),
        (" 1.5 * 4 ", 6.0),
        ("2 ** -1", 0.5),
    ],
)
def test_calculator_computes_arithmetic(expression: str, value: float) -> None:
    assert calculate(expression) == value


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("__import__('os').system('true')", "Call"),
        ("x + 1", "the name 'x'"),
        ("'a' * 3", "the constant 'a'"),
        ("True + 1", "the constant True"),
        ("[1, 2]", "List"),
        ("1 < 2", "Compare"),
        ("2 ** 1000", f"Exponents above {MAX_EXPONENT}"),
        ("9 ** 9 ** 9", f"Exponents above {MAX_EXPONENT}"),
        ("10 ** 20", "Results above"),
        ("1e300 * 1e300", "too large"),
        ("(-8) ** 0.5", "not a real number"),
        ("1 / 0", "Division by zero"),
        ("5 % 0", "Division by zero"),
        ("1 +", "Not a valid arithmetic expression"),
        ("", "Give an arithmetic expression"),
        ("1+" * MAX_EXPRESSION_CHARS + "1", "longer than"),
    ],
)
def test_calculator_refuses_everything_else_with_a_clear_message(expression: str, message: str) -> None:
    with pytest.raises(CalculatorError, match=message.replace("(", r"\(").replace("*", r"\*")):
        calculate(expression)
    assert calculator(expression).startswith("Error: ")  # the tool returns the message to the model


def test_calculator_tool_formats_results_for_the_model() -> None:
    assert calculator("6 / 3") == "2"  # a whole float reads as an integer
    assert calculator("1 / 3") == "0.333333"
    assert calculator(12) == "Error: Give an arithmetic expression as a string, e.g. '12 * 3'."  # type: ignore[arg-type]


def test_problems_are_reproducible_and_their_answers_match_the_expression() -> None:
    first, again, other = make_problems(50, seed=3), make_problems(50, seed=3), make_problems(50, seed=4)
    assert first == again and first != other
    assert len({problem["question"] for problem in first}) == 50
    for problem in first:
        assert calculate(problem["expression"]) == problem["answer"] and problem["answer"] >= 0
    kinds = {problem["expression"].count(" ") // 2 for problem in make_problems(200, seed=0)}
    assert kinds == {1, 2}  # one- and two-operation problems
    assert len(TEMPLATES) == 6


def test_train_and_held_out_problems_are_disjoint() -> None:
    train, test = train_test_split(400, 64, seed=0)
    assert len(train) == 400 and len(test) == 64
    assert not {p["question"] for p in train} & {p["question"] for p in test}
    assert not {p["expression"] for p in train} & {p["expression"] for p in test}  # not just new wording
    assert train_test_split(400, 64, seed=0) == (train, test)


autogen = pytest.importorskip("autogen_agentchat", reason="the example needs lightning-sdk[autogen]")

from lightning_sdk.examples.calc_autogen.agent import (  # noqa: E402 - after the importorskip above
    AGENT_NAME,
    answer_reward,
    example_turns,
    final_answer,
)


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("42", 42.0),
        ("The answer is 1,250.", 1250.0),
        ("3 + 4 = 7 apples", 7.0),
        ("-5", -5.0),
        ("0.333333", 0.333333),
        ("no number", None),
        (None, None),
        ("Error: Exponents above 64 are not allowed.", None),
    ],
)
def test_final_answer_is_the_last_number_of_the_final_message(text: str | None, answer: float | None) -> None:
    assert final_answer(text) == answer


def test_reward_is_one_within_one_percent_of_the_gold_answer() -> None:
    task = {"question": "q", "answer": 200}
    assert answer_reward(task, "201.9") == 1.0  # within 1%
    assert answer_reward(task, "203") == 0.0
    assert answer_reward(task, "Tom has 3 apples, so 200") == 1.0
    assert answer_reward(task, "200 apples and 3 pears") == 0.0  # the last number counts
    assert answer_reward(task, None) == 0.0
    assert answer_reward({"answer": 0}, "0") == 1.0 and answer_reward({"answer": 0}, "0.001") == 0.0


def test_worked_examples_are_tool_calls_with_their_results() -> None:
    turns = example_turns()
    calls = [turn.content[0] for turn in turns if type(turn).__name__ == "AssistantMessage"]
    results = [turn.content[0] for turn in turns if type(turn).__name__ == "FunctionExecutionResultMessage"]
    assert calls and len(calls) == len(results)
    for call, result in zip(calls, results, strict=True):
        assert call.name == "calculator" and result.call_id == call.id
        assert result.content == calculator(json.loads(call.arguments)["expression"])


@pytest.fixture
def engine(vllm_engine: Any) -> Any:
    yield vllm_engine
    vllm_engine.load_adapter(None, version=None)  # base weights back for the next test


@pytest.fixture
def autogen_off_after() -> Any:
    from lightning_sdk.integrations.autogen import uninstrument_autogen

    yield
    uninstrument_autogen()  # the agent switches the integration on; leave no patch behind


@pytest.mark.slow
def test_two_training_steps_end_to_end(engine: Any, tmp_path: Path, autogen_off_after: None) -> None:
    from lightning_sdk.examples.calc_autogen.train import train

    run_dir = tmp_path / "run"
    summary = train(
        steps=2,
        run_dir=run_dir,
        engine=engine,
        batch_size=2,
        group_size=4,
        train_size=16,
        test_size=4,
        eval_every=0,
        curve_to=tmp_path / "curve.png",
    )

    assert (
        summary["steps"] == 2
        and 0.0 <= summary["base_reward"] <= 1.0
        and 0.0 <= summary["trained_reward"] <= 1.0
    )
    assert (tmp_path / "curve.png").stat().st_size > 0 and Path(summary["report"]).is_file()
    assert (Path(summary["adapter"]) / "adapter_model.safetensors").is_file()
    episodes = EpisodeStore(run_dir / "episodes.sqlite").episodes()
    assert len(episodes) >= 2 * 2 * 4
    for episode in episodes:
        assert episode.reward in (0.0, 1.0)
        assert episode.calls and all(call.agent_name == AGENT_NAME for call in episode.calls)
        assert all(call.trainable and call.completion_token_ids for call in episode.calls)
