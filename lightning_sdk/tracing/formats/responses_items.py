"""The Responses API's items in Chat Completions terms, both ways. Pure Python.

A Responses request is a list of input items (messages, the model's earlier function calls, their
outputs) plus `instructions` and function tools; its output is a list of items (a message, function
calls). The server renders a Responses request through the same chat template as the equivalent chat
request, and the openai capture records it with the same chat-format `messages` and `response_message`,
so that a run through `responses.create` and the same run through `chat.completions.create` give the
same prompt token ids and episodes of the same structure. The conversion lives here, on the recording
side, because both the capture and the server need it and it imports nothing.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ResponsesInputError",
    "chat_tools",
    "input_messages",
    "output_message",
]


class ResponsesInputError(ValueError):
    """A Responses request this conversion cannot express as chat; `param` names the offending field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


_ROLES = {"user", "assistant", "system", "developer"}
_TEXT_PARTS = {"input_text", "output_text", "text"}


def _text(content: object, where: str) -> str:
    """A message's content as text: a string, or a list of text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces = []
        for index, part in enumerate(content):
            if (
                not isinstance(part, dict)
                or part.get("type") not in _TEXT_PARTS
                or not isinstance(part.get("text"), str)
            ):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ResponsesInputError(
                    f"{where}.content[{index}] of type {kind!r} is not supported; only text parts "
                    "(input_text, output_text) are.",
                    f"{where}.content",
                )
            pieces.append(part["text"])
        return "".join(pieces)
    raise ResponsesInputError(
        f"{where}.content must be a string or a list of text parts.", f"{where}.content"
    )


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in _ROLES:
        raise ResponsesInputError(f"{where}.role {role!r} is not one of {sorted(_ROLES)}.", f"{where}.role")
    return {"role": "system" if role == "developer" else role, "content": _text(item.get("content"), where)}


def _function_call(item: dict[str, Any], where: str) -> dict[str, Any]:
    name, arguments, call_id = item.get("name"), item.get("arguments"), item.get("call_id")
    if not isinstance(name, str) or not isinstance(arguments, str) or not isinstance(call_id, str):
        raise ResponsesInputError(f"{where} (function_call) needs string call_id, name and arguments.", where)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def input_messages(input: object, instructions: str | None = None) -> list[dict[str, Any]]:
    """Chat messages for a Responses `input` (a string or a list of items) and `instructions`.

    Consecutive function calls become one assistant message with several `tool_calls`, as a chat model
    emits them; an assistant message directly before them carries them. Raises `ResponsesInputError`
    for items with no chat equivalent (reasoning, hosted tool calls, images, ...).
    """
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    if isinstance(input, str):
        return [*messages, {"role": "user", "content": input}]
    if not isinstance(input, list) or not input:
        raise ResponsesInputError("input must be a string or a non-empty list of items.", "input")
    for index, item in enumerate(input):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise ResponsesInputError(f"{where} must be an object.", where)
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(item, where))
        elif kind == "function_call":
            call = _function_call(item, where)
            last = messages[-1] if messages else None
            if (
                last is not None
                and last["role"] == "assistant"
                and (last.get("tool_calls") or not last["content"])
            ):
                last.setdefault("tool_calls", []).append(call)
            elif last is not None and last["role"] == "assistant":
                last["tool_calls"] = [call]
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output, call_id = item.get("output"), item.get("call_id")
            if not isinstance(call_id, str):
                raise ResponsesInputError(f"{where} (function_call_output) needs a string call_id.", where)
            content = output if isinstance(output, str) else _text(output, where)
            messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
        else:
            raise ResponsesInputError(
                f"{where} has type {kind!r}, which this server does not support; it accepts message, "
                "function_call and function_call_output items.",
                f"{where}.type",
            )
    return messages


def chat_tools(tools: object) -> list[dict[str, Any]]:
    """Chat-format function tools for Responses `tools` (`{"type": "function", "name", ...}`)."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise ResponsesInputError("tools must be a list.", "tools")
    converted = []
    for index, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function" or not isinstance(tool.get("name"), str):
            raise ResponsesInputError(
                f"tools[{index}] of type {kind!r} is not supported: this server runs function tools only "
                "(hosted tools such as web_search or file_search need OpenAI's servers).",
                f"tools[{index}].type",
            )
        # The key order of a chat tool as clients send it (name, description, parameters, strict): tools
        # are rendered into the prompt as JSON, so the order is part of the prompt's token ids.
        function: dict[str, Any] = {"name": tool["name"]}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        function["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
        if tool.get("strict") is not None:
            function["strict"] = tool["strict"]
        converted.append({"type": "function", "function": function})
    return converted


def output_message(output: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat assistant message equivalent to a Responses `output` (text and function calls)."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in output:
        if item.get("type") == "message":
            texts += [part.get("text", "") for part in item.get("content") or [] if isinstance(part, dict)]
        elif item.get("type") == "function_call":
            calls.append(
                {
                    "id": item.get("call_id"),
                    "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments")},
                }
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    return message
