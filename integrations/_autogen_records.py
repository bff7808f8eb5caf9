"""Plain conversions from AutoGen model-client arguments and results to `LLMCall` fields."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autogen_core import FunctionCall
from autogen_core.models import (
    AssistantMessage,
    CreateResult,
    FunctionExecutionResultMessage,
    SystemMessage,
    UserMessage,
)

from lightning_sdk.integrations._support import openai_tool_call

__all__ = ["openai_messages", "openai_tools", "response_fields"]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    # A multimodal user message: keep its text parts (images are not part of a training sample).
    return "".join(part for part in content if isinstance(part, str))


def _tool_calls(calls: Sequence[FunctionCall]) -> list[dict[str, Any]]:
    return [openai_tool_call(call.id, call.name, call.arguments) for call in calls]


def openai_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """AutoGen `LLMMessage`s in the OpenAI chat format (what `OpenAIChatCompletionClient` sends)."""
    converted: list[dict[str, Any]] = []
    for message in messages:
        if isinstance(message, SystemMessage):
            converted.append({"role": "system", "content": message.content})
        elif isinstance(message, UserMessage):
            converted.append({"role": "user", "content": _text(message.content), "name": message.source})
        elif isinstance(message, AssistantMessage):
            if isinstance(message.content, str):
                converted.append({"role": "assistant", "content": message.content})
            else:
                converted.append(
                    {
                        "role": "assistant",
                        "content": message.thought,
                        "tool_calls": _tool_calls(message.content),
                    }
                )
        elif isinstance(message, FunctionExecutionResultMessage):
            converted.extend(
                {"role": "tool", "tool_call_id": result.call_id, "content": result.content}
                for result in message.content
            )
    return converted


def openai_tools(tools: Sequence[Any]) -> list[dict[str, Any]] | None:
    """Tools (`Tool` objects or `ToolSchema` dicts) in the OpenAI chat format."""
    schemas = [tool.schema if hasattr(tool, "schema") else tool for tool in tools]
    return [{"type": "function", "function": dict(schema)} for schema in schemas] or None


def response_fields(result: CreateResult) -> dict[str, Any]:
    """`LLMCall` fields of a finished AutoGen model call."""
    if isinstance(result.content, str):
        message: dict[str, Any] = {"role": "assistant", "content": result.content}
        text = result.content
    else:
        message = {"role": "assistant", "content": result.thought, "tool_calls": _tool_calls(result.content)}
        text = result.thought or ""
    usage = {"prompt_tokens": result.usage.prompt_tokens, "completion_tokens": result.usage.completion_tokens}
    logprobs = [entry.logprob for entry in result.logprobs] if result.logprobs else None
    # AutoGen normalises OpenAI's "tool_calls" finish reason to "function_calls"; records use OpenAI's words.
    finish_reason = "tool_calls" if result.finish_reason == "function_calls" else result.finish_reason
    return {
        "response_message": message,
        "text": text,
        "finish_reason": finish_reason,
        "usage": usage,
        "logprobs": logprobs,
    }
