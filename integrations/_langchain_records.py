"""Plain conversions from LangChain callback arguments to `LLMCall` fields (no state, no recording)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.messages import BaseMessage, convert_to_openai_messages
from langchain_core.outputs import ChatGeneration, Generation, LLMResult

from lightning_sdk.integrations._support import openai_tool_call
from lightning_sdk.tracing.episode import LLMCall

__all__ = ["calls_from_result", "generation_text", "request_fields", "response_id_of"]

_SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "n",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "logprobs",
    "top_logprobs",
)


def request_fields(
    messages: Sequence[BaseMessage] | None, prompt: str | None, invocation_params: dict[str, Any] | None
) -> dict[str, Any]:
    """`LLMCall` fields known when a model run starts."""
    params = invocation_params or {}
    return {
        "kind": "chat" if messages is not None else "completion",
        "messages": convert_to_openai_messages(list(messages)) if messages is not None else None,
        "prompt": prompt,
        "model": params.get("model") or params.get("model_name"),
        "tools": params.get("tools"),
        "sampling": {key: params[key] for key in _SAMPLING_KEYS if params.get(key) is not None},
    }


def response_id_of(result: LLMResult) -> str | None:
    """The server's response id, when the model reports it (ChatOpenAI does, except when streaming)."""
    value = (result.llm_output or {}).get("id")
    return value if isinstance(value, str) else None


def generation_text(generation: Generation) -> str:
    """The text a generation produced (a chat message's content, or the completion text)."""
    if isinstance(generation, ChatGeneration):
        content = generation.message.content
        return content if isinstance(content, str) else generation.text
    return generation.text


def calls_from_result(result: LLMResult, request: dict[str, Any]) -> list[LLMCall]:
    """One `LLMCall` per generation (choice) of a finished run, built from LangChain's objects."""
    generations = result.generations[0] if result.generations else []
    usage = (result.llm_output or {}).get("token_usage") or (result.llm_output or {}).get("usage")
    calls = []
    for index, generation in enumerate(generations):
        info = generation.generation_info or {}
        response_message = None
        if isinstance(generation, ChatGeneration):
            message = generation.message
            tool_calls = [
                openai_tool_call(tc.get("id"), tc["name"], tc.get("args", {}))
                for tc in getattr(message, "tool_calls", None) or []
            ]
            response_message = {"role": "assistant", "content": generation_text(generation)}
            if tool_calls:
                response_message["tool_calls"] = tool_calls
            usage = usage or _usage_of_message(message)
        calls.append(
            LLMCall(
                **request,
                request_id=response_id_of(result),
                choice_index=index,
                source="langchain",
                response_message=response_message,
                text=generation_text(generation),
                finish_reason=info.get("finish_reason"),
                usage=dict(usage) if usage else None,
            )
        )
    return calls


def _usage_of_message(message: Any) -> dict[str, Any] | None:
    usage = getattr(message, "usage_metadata", None)
    if not usage:
        return None
    return {
        "prompt_tokens": usage.get("input_tokens"),
        "completion_tokens": usage.get("output_tokens"),
        "total_tokens": usage.get("total_tokens"),
    }
