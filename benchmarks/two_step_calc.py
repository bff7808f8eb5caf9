"""An agent whose first call decides the outcome: two-step word problems, one calculator call per step.

For the step-level credit runs of `benchmarks/learning.py` (`--only calc_two_step`, issue 51). The
problems are the calculator example's two-step kinds ("has 14 cards and buys 7 boxes of 10"), the agent
a plain OpenAI-client loop: the first call computes the first part (`7 * 10`), the calculator's result
joins the conversation, the second call computes the answer from it (`14 + 70`), whose result is the
final answer. A wrong first expression spoils the episode whatever the second call does, and samples
whose first calls wrote the same expression reach the same second state: the case where comparing calls
that faced the same state should find the call that mattered.

Like the calculator example, the model copies earlier turns better than it follows instructions, so the
conversation starts with four worked examples of the two-call pattern (with two, the bundled model
imitates the tool's result turn instead of calling the tool, as the calculator example found).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai

import lightning_sdk as ls
from lightning_sdk.examples.calc_autogen.agent import answer_reward
from lightning_sdk.examples.calc_autogen.calculator import calculator

__all__ = [
    "DEFAULTS",
    "TWO_STEP_KINDS",
    "first_call_right",
    "first_part",
    "problem_kind",
    "solve_two_step",
    "train",
]

TWO_STEP_KINDS = (4, 5)
"""The two-step templates of `examples/calc_autogen/data.py` (`a + b - c` and `a + b * c`)."""
DEFAULTS: dict[str, Any] = {
    "steps": 20,
    "batch_size": 4,
    "group_size": 8,
    "learning_rate": 2e-4,
    "temperature": 0.7,
    "train_size": 400,
    "test_size": 48,
    "eval_every": 4,
    "max_tokens": 48,
}
"""The calculator example's measured configuration, with 48 held-out problems."""
SYSTEM = "You solve math word problems in two steps: call calculator for the first part, then for the answer."
TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": 'Compute an arithmetic expression, e.g. "12 + 7". Numbers and + - * / ( ) only.',
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
WORKED = (
    ("Tom has 3 apples and buys 4 bags of 2 apples. How many apples does Tom have now?", "4 * 2", "3 + 8"),
    ("Rosa has 12 shells, finds 5 more, then gives 3 away. How many shells are left?", "12 + 5", "17 - 3"),
    ("Sam has 6 cards and buys 3 boxes of 5 cards. How many cards does Sam have now?", "3 * 5", "6 + 15"),
    ("Lena has 30 coins, finds 12 more, then gives 9 away. How many coins are left?", "30 + 12", "42 - 9"),
)


def worked_turns() -> list[dict[str, Any]]:
    """The worked examples as chat turns: the question, then each calculator call and its result."""
    turns: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for number, (question, first, second) in enumerate(WORKED):
        turns.append({"role": "user", "content": question})
        for part, expression in enumerate((first, second)):
            call_id = f"example_{number}_{part}"
            arguments = json.dumps({"expression": expression})
            turns.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": "calculator", "arguments": arguments},
                        }
                    ],
                }
            )
            turns.append({"role": "tool", "tool_call_id": call_id, "content": calculator(expression)})
    return turns


@ls.trace_agent(name="calc_two_step")
def solve_two_step(task: dict[str, Any], llm: ls.LLMEndpoint | None = None) -> str | None:
    """Two calls, one calculator step each; the final answer is the last calculator result (or the text of
    a call that answered without calling the tool). Scores itself with the calculator example's reward."""
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key) if llm else openai.OpenAI()
    model = llm.model if llm else "default"
    messages = [*worked_turns(), {"role": "user", "content": task["question"]}]
    final: str | None = None
    for _ in range(2):
        reply = client.chat.completions.create(
            model=model, messages=messages, tools=[TOOL], max_tokens=DEFAULTS["max_tokens"]
        )
        message = reply.choices[0].message
        if not message.tool_calls:
            final = message.content
            break
        tool_call = message.tool_calls[0]
        try:
            expression = str(json.loads(tool_call.function.arguments).get("expression", ""))
        except (json.JSONDecodeError, AttributeError):
            expression = ""
        result = calculator(expression) if expression else "Error: no expression"
        messages.append(message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"}))
        messages.append({"role": "tool", "tool_call_id": tool_call.id, "content": result})
        final = result
    answer_reward(task, final)
    return final


def first_part(task: dict[str, Any]) -> float:
    """The value the first call should compute: `b * c` of `a + b * c`, `a + b` of `a + b - c`."""
    numbers = [float(token) for token in task["expression"].split() if token not in "+-*/"]
    a, b, c = numbers
    return b * c if "*" in task["expression"] else a + b


def problem_kind(task: dict[str, Any]) -> str:
    """`"a + b * c"` (the first part is the product, which the bundled model rarely computes first) or
    `"a + b - c"`."""
    return "a + b * c" if "*" in task["expression"] else "a + b - c"


def first_call_right(episode: ls.Episode) -> bool:
    """Whether the episode's first call asked the calculator for the first part: the decision the
    second call cannot repair (the reward sees only the final answer)."""
    from lightning_sdk.examples.calc_autogen.calculator import CalculatorError, calculate

    calls = episode.all_calls()
    if not calls:
        return False
    tool_calls = (calls[0].response_message or {}).get("tool_calls") or []
    if not tool_calls:
        return False
    try:
        expression = str(json.loads(tool_calls[0]["function"]["arguments"]).get("expression", ""))
        return abs(calculate(expression) - first_part(episode.task)) < 1e-9
    except (CalculatorError, json.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError):
        return False


def train(
    seed: int = 0,
    run_dir: str | Path | None = None,
    *,
    model: str | None = None,
    steps: int = DEFAULTS["steps"],
    train_size: int = DEFAULTS["train_size"],
    test_size: int = DEFAULTS["test_size"],
    **overrides: Any,
) -> dict[str, Any]:
    """Train the two-step agent on the calculator's two-step problems; the summary of `summarize_fit`.
    `overrides`: any `TrainerConfig` field."""
    from lightning_sdk.examples.calc_autogen.data import train_test_split
    from lightning_sdk.examples.results import summarize_fit

    train_tasks, test_tasks = train_test_split(train_size, test_size, seed=seed, kinds=TWO_STEP_KINDS)
    fields = {
        key: DEFAULTS[key]
        for key in ("batch_size", "group_size", "learning_rate", "temperature", "eval_every", "max_tokens")
    }
    config = ls.TrainerConfig(
        **{**fields, "max_steps": steps, "save_every": 0, "seed": seed, "run_dir": str(run_dir), **overrides}
    )
    result = ls.Trainer(model, config=config).fit(solve_two_step, train_tasks, test_tasks)
    return summarize_fit(result, report=True)
