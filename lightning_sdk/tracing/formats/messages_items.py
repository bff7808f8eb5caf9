"""Anthropic's Messages API conversation in Chat Completions terms, both ways. Pure Python.

A Messages request is a top-level `system` and a list of messages whose content is a string or blocks
(text, `tool_use`, `tool_result`); the answer is content blocks. The server renders a Messages request
through the same chat template as the equivalent chat request, and the anthropic capture records it with
the same chat-format `messages` and `response_message`, so the same conversation gives the same prompt
token ids and episodes of the same structure through either API. The conversion lives here, on the
recording side, because both the capture and the server need it and it imports nothing.

The rules, each in one function here:

- `system` (a string or text blocks) is the system message.
- A user message's `tool_result` blocks become `tool` messages, in place (a chat template wants a call's
  result right after the call); its text blocks become user messages around them. `is_error` puts
  `Error: ` in front of the result, so that the model is told the call failed.
- An assistant message's text blocks are its content and its `tool_use` blocks its `tool_calls` (the input
  as JSON arguments).
- Tools are function tools (`input_schema` is `parameters`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = [
    "ERROR_PREFIX",
    "MessagesInputError",
    "assistant_message",
    "chat_messages",
    "chat_tools",
]

ERROR_PREFIX = "Error: "
"""Put in front of a tool result sent with `is_error`."""


class MessagesInputError(ValueError):
    """A Messages request this conversion (or the server) cannot serve; `param` names the offending field
    (dotted path)."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


# --- the conversation ---------------------------------------------------------------------------------
def chat_messages(messages: object, system: object = None) -> list[dict[str, Any]]:
    """Chat messages for a Messages request's `messages` and `system`."""
    converted: list[dict[str, Any]] = []
    if system:
        converted.append({"role": "system", "content": _text(system, "system")})
    if not isinstance(messages, list):
        raise MessagesInputError("messages must be a list of messages.", "messages")
    for index, message in enumerate(messages):
        where = f"messages.{index}"
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            raise MessagesInputError(f"{where}.role must be 'user' or 'assistant'.", f"{where}.role")
        content = message.get("content")
        if isinstance(content, str):
            converted.append({"role": role, "content": content})
        elif not isinstance(content, list):
            raise MessagesInputError(
                f"{where}.content must be a string or a list of blocks.", f"{where}.content"
            )
        elif role == "assistant":
            converted.append(_assistant(content, where))
        else:
            converted += _user(content, where)
    return converted


def _text(content: object, where: str) -> str | list[dict[str, Any]]:
    """A string, or text blocks as chat's text parts (the chat template joins them as chat's route does)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise MessagesInputError(f"{where} must be a string or a list of text blocks.", where)
    return [_text_part(block, f"{where}.{index}") for index, block in enumerate(content)]


def _text_part(block: object, where: str) -> dict[str, Any]:
    if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
        raise MessagesInputError(f"{where} must be a text block.", where)
    return {"type": "text", "text": block["text"]}


def _user(blocks: list[Any], where: str) -> list[dict[str, Any]]:
    """A user message's blocks: its text as user messages, each tool result as a tool message, in order."""
    converted: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for index, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            parts.append(_text_part(block, f"{where}.content.{index}"))
        elif kind == "tool_result":
            if parts:
                converted.append({"role": "user", "content": parts})
                parts = []
            converted.append(_tool_result(block, f"{where}.content.{index}"))
        else:
            raise MessagesInputError(
                f"{where}.content.{index}: a user message holds text and tool_result blocks, not {kind!r}.",
                f"{where}.content.{index}",
            )
    if parts or not converted:
        converted.append({"role": "user", "content": parts})
    return converted


def _tool_result(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str):
        raise MessagesInputError(f"{where}.tool_use_id must be a string.", f"{where}.tool_use_id")
    content = _text(block.get("content", ""), f"{where}.content")
    text = content if isinstance(content, str) else "".join(part["text"] for part in content)
    if block.get("is_error"):
        text = ERROR_PREFIX + text
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _assistant(blocks: list[Any], where: str) -> dict[str, Any]:
    """An assistant message's blocks: text as its content, tool_use blocks as its tool calls."""
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for index, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            parts.append(_text_part(block, f"{where}.content.{index}"))
        elif kind == "tool_use" and isinstance(block.get("input"), dict):
            arguments = json.dumps(block["input"], ensure_ascii=False)
            function = {"name": block.get("name"), "arguments": arguments}
            calls.append({"id": block.get("id"), "type": "function", "function": function})
        else:
            raise MessagesInputError(
                f"{where}.content.{index}: an assistant message holds text and tool_use blocks (with an "
                f"object as input), not {kind!r}.",
                f"{where}.content.{index}",
            )
    message: dict[str, Any] = {"role": "assistant", "content": parts or (None if calls else "")}
    if calls:
        message["tool_calls"] = calls
    return message


# --- tools --------------------------------------------------------------------------------------------
def chat_tools(tools: object) -> list[dict[str, Any]]:
    """Chat-format function tools for Messages `tools` (custom tools only)."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise MessagesInputError("tools must be a list.", "tools")
    converted = []
    for index, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else "?"
        if kind not in (None, "custom") or not isinstance(tool.get("name"), str):
            raise MessagesInputError(
                f"tools.{index} of type {kind!r} is not supported: send custom tools "
                "({name, description, input_schema}); server tools run on Anthropic's servers.",
                f"tools.{index}.type",
            )
        # The key order of a chat tool as clients send it: tools are rendered into the prompt as JSON, so
        # the order is part of the prompt's token ids (the same as the Responses API's tools).
        function: dict[str, Any] = {"name": tool["name"]}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        function["parameters"] = tool.get("input_schema") or {"type": "object", "properties": {}}
        if tool.get("strict") is not None:
            function["strict"] = tool["strict"]
        converted.append({"type": "function", "function": function})
    return converted


# --- the answer ---------------------------------------------------------------------------------------
def assistant_message(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """An answer's content blocks as a chat assistant message: text joined, `tool_use` as tool calls."""
    texts = [block.get("text") or "" for block in blocks if block.get("type") == "text"]
    tool_calls = [
        {
            "id": block.get("id"),
            "type": "function",
            "function": {
                "name": block.get("name"),
                "arguments": json.dumps(block.get("input") or {}, ensure_ascii=False),
            },
        }
        for block in blocks
        if block.get("type") == "tool_use"
    ]
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    elif message["content"] is None:
        message["content"] = ""
    return message
