"""The agent: an AutoGen `AssistantAgent` with a calculator tool, plus the two lightning-sdk decorators.

It is written the way an AutoGen user would write it; the only additions are `@ls.trace_agent`, the
`@ls.reward` function and `instrument_autogen()` (so each model call carries the agent's name).

The final answer is the **last number in the agent's final message**. With `reflect_on_tool_use=False`
(our choice, see README.md) that message is the calculator's result when the model called the tool, or
the model's own text when it answered directly. A calculator error ("Error: ...") counts as no answer.
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Any

from autogen_agentchat.agents import AssistantAgent
from autogen_core import FunctionCall
from autogen_core.model_context import UnboundedChatCompletionContext
from autogen_core.models import (
    AssistantMessage,
    FunctionExecutionResult,
    FunctionExecutionResultMessage,
    LLMMessage,
    UserMessage,
)
from autogen_core.tools import FunctionTool
from autogen_ext.models.openai import OpenAIChatCompletionClient

import lightning_sdk as ls
from lightning_sdk.examples.calc_autogen.calculator import calculator
from lightning_sdk.integrations.autogen import instrument_autogen

__all__ = [
    "AGENT_NAME",
    "MAX_TOKENS",
    "SYSTEM_MESSAGE",
    "answer",
    "answer_reward",
    "final_answer",
    "solve",
]

AGENT_NAME = "math_solver"
"""The AutoGen agent's name: its LLM calls are recorded (and can be trained) under this name."""
SYSTEM_MESSAGE = (
    "You solve math word problems with the calculator tool. "
    "Call calculator with one arithmetic expression that computes the answer."
)
"""Short on purpose: the 135M model follows a short instruction better, and every prompt token costs
time in the training forward pass. The server adds the tool's description and call format after it."""
WORKED_EXAMPLES = (
    ("Tom has 3 apples and buys 4 bags of 2 apples. How many apples does Tom have now?", "3 + 4 * 2"),
    ("Mia had 20 eggs and gave 5 away. How many eggs are left?", "20 - 5"),
)
"""Earlier turns shown to the model: the question and the calculator call that answers it. A 135M model
ignores a tool-call format described in the system prompt, but it copies its own earlier turns."""
TOOL_DESCRIPTION = 'Compute an arithmetic expression, e.g. "12 + 7 * 3". Numbers and + - * / ( ) only.'
MAX_TOKENS = 48
"""Enough for one tool call (`<tool_call>{"name": "calculator", ...}</tool_call>` is about 25 tokens)."""
# AutoGen does not know our model name, so it must be told what the model can do.
MODEL_INFO = {
    "vision": False,
    "function_calling": True,
    "json_output": False,
    "family": "unknown",
    "structured_output": False,
}
RELATIVE_TOLERANCE = 0.01
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def final_answer(text: str | None) -> float | None:
    """The last number in the final message (thousands separators allowed), or None.

    A calculator error message is not an answer even when it contains a number ("Exponents above 64").
    """
    if not text or text.lstrip().startswith("Error:"):
        return None
    numbers = _NUMBER.findall(text)
    if not numbers:
        return None
    try:
        return float(numbers[-1].replace(",", ""))
    except ValueError:  # e.g. "1,,2" after the commas go
        return None


@ls.reward
def answer_reward(task: dict[str, Any], final_message: str | None) -> float:
    """1 when the final answer is within 1% (relative) of the gold answer, else 0."""
    predicted, gold = final_answer(final_message), float(task["answer"])
    if predicted is None:
        return 0.0
    return 1.0 if math.isclose(predicted, gold, rel_tol=RELATIVE_TOLERANCE, abs_tol=1e-9) else 0.0


def _model_client(llm: ls.LLMEndpoint | None) -> OpenAIChatCompletionClient:
    # The trainer passes `llm`; run by hand, the agent reads OPENAI_BASE_URL / OPENAI_API_KEY as openai
    # does.
    base_url = llm.base_url if llm else os.environ.get("OPENAI_BASE_URL")
    api_key = llm.api_key if llm else os.environ.get("OPENAI_API_KEY", "")
    model = llm.model if llm else os.environ.get("OPENAI_MODEL", "default")
    return OpenAIChatCompletionClient(
        model=model,
        base_url=base_url,
        api_key=api_key,
        model_info=MODEL_INFO,
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        max_retries=0,
    )


def example_turns(examples: tuple[tuple[str, str], ...] = WORKED_EXAMPLES) -> list[LLMMessage]:
    """The worked examples as AutoGen chat history: question, calculator call, calculator result."""
    turns: list[LLMMessage] = []
    for number, (question, expression) in enumerate(examples):
        call_id = f"example_{number}"
        arguments = json.dumps({"expression": expression})
        turns.append(UserMessage(content=question, source="user"))
        turns.append(
            AssistantMessage(
                content=[FunctionCall(id=call_id, name="calculator", arguments=arguments)], source=AGENT_NAME
            )
        )
        result = FunctionExecutionResult(content=calculator(expression), name="calculator", call_id=call_id)
        turns.append(FunctionExecutionResultMessage(content=[result]))
    return turns


def build_agent(model_client: OpenAIChatCompletionClient) -> AssistantAgent:
    """The AutoGen assistant: one tool call, whose result is the final answer (no reflection call)."""
    tool = FunctionTool(calculator, description=TOOL_DESCRIPTION, name="calculator")
    return AssistantAgent(
        AGENT_NAME,
        model_client=model_client,
        tools=[tool],
        system_message=SYSTEM_MESSAGE,
        model_context=UnboundedChatCompletionContext(initial_messages=example_turns()),
        reflect_on_tool_use=False,
        max_tool_iterations=1,
    )


async def answer(task: dict[str, Any], llm: ls.LLMEndpoint | None = None) -> str | None:
    """Run the assistant on one word problem and return its final message, unscored (for training with
    a judge instead of `answer_reward`: `benchmarks/learning.py`'s judged run traces this one)."""
    instrument_autogen()  # idempotent; records each model call under the AutoGen agent's name
    model_client = _model_client(llm)
    try:
        result = await build_agent(model_client).run(task=task["question"])
    finally:
        await model_client.close()
    return result.messages[-1].to_text() if result.messages else None


@ls.trace_agent(name="calc_autogen")
async def solve(task: dict[str, Any], llm: ls.LLMEndpoint | None = None) -> str | None:
    """Run the assistant on one word problem; score its final message; return that message."""
    final = await answer(task, llm)
    answer_reward(task, final)
    return final
