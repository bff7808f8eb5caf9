"""Forced tool calls follow the tool's own schema, strict or not, through all three APIs with their real
clients (`openai` for chat and Responses, `anthropic` for Messages) on the bundled model.

The tool is `add(a, b)` without `strict`, its schema closed and bounded (`CLOSED_ADD_SCHEMA`), so that every
answer the grammar allows fits in `max_tokens` whatever was sampled: each test asserts that the call's
arguments parse and validate against the schema, never which numbers the model picks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import jsonschema
import pytest

from tests.fixtures.tools import ADD_DESCRIPTION, CLOSED_ADD_SCHEMA

pytestmark = pytest.mark.slow

ASK = "What is 12 + 7? Use the add tool."
CHAT_TOOL = {
    "type": "function",
    "function": {"name": "add", "description": ADD_DESCRIPTION, "parameters": CLOSED_ADD_SCHEMA},
}
RESPONSES_TOOL = {
    "type": "function",
    "name": "add",
    "description": ADD_DESCRIPTION,
    "parameters": CLOSED_ADD_SCHEMA,
    "strict": False,
}
MESSAGES_TOOL = {"name": "add", "description": ADD_DESCRIPTION, "input_schema": CLOSED_ADD_SCHEMA}


@pytest.fixture
def messages_client(served_endpoint: Any) -> Iterator[anthropic.Anthropic]:
    endpoint = served_endpoint.endpoint
    root = endpoint.base_url.removesuffix("/v1")
    with anthropic.Anthropic(base_url=root, api_key=endpoint.api_key, max_retries=0) as client:
        yield client


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_chat(served_endpoint: Any, tool_choice: Any) -> None:
    client = served_endpoint.endpoint.openai_client(max_retries=0)
    reply = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": ASK}],
        tools=[CHAT_TOOL],
        tool_choice=tool_choice,
        max_tokens=60,
    )
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name == "add"
    jsonschema.validate(json.loads(call.function.arguments), CLOSED_ADD_SCHEMA)


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "name": "add"}])
def test_responses(served_endpoint: Any, tool_choice: Any) -> None:
    client = served_endpoint.endpoint.openai_client(max_retries=0)
    response = client.responses.create(
        model="default", input=ASK, tools=[RESPONSES_TOOL], tool_choice=tool_choice, max_output_tokens=60
    )
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert call.name == "add"
    jsonschema.validate(json.loads(call.arguments), CLOSED_ADD_SCHEMA)


@pytest.mark.parametrize("tool_choice", [{"type": "any"}, {"type": "tool", "name": "add"}])
def test_messages(messages_client: anthropic.Anthropic, tool_choice: Any) -> None:
    message = messages_client.messages.create(
        model="default",
        max_tokens=60,
        messages=[{"role": "user", "content": ASK}],
        tools=[MESSAGES_TOOL],
        tool_choice=tool_choice,
    )
    (call,) = [block for block in message.content if block.type == "tool_use"]
    assert call.name == "add" and message.stop_reason == "tool_use"
    jsonschema.validate(call.input, CLOSED_ADD_SCHEMA)
