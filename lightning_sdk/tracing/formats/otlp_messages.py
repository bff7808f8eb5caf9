"""The messages of a GenAI model call span, in OpenAI's chat format (for `otlp_import`, beside it).

Two ways of recording content on spans are read: the current semantic conventions
(`gen_ai.system_instructions`, `gen_ai.input.messages`, `gen_ai.output.messages`: messages of typed parts,
as JSON strings or structured values) and OpenLLMetry's indexed attributes (`gen_ai.prompt.<i>.role`,
`.content`, `.tool_calls.<j>.*`; `gen_ai.completion.<i>.*`). Text parts become the message content, tool
calls its `tool_calls`, a tool call response a `tool` message; reasoning parts are dropped, and any other
part (an image, a file) is refused by name: the policy is trained on text.

The tools the call offered (`span_tools`) come from `gen_ai.tool.definitions` (the current conventions) or
OpenLLMetry's `llm.request.functions.<i>.*`, in chat's tool format, so that a warm start renders the
tools block the model sees at rollout time.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["TraceImportError", "chat_tool_call", "otlp_list", "span_messages", "span_tools"]


class TraceImportError(ValueError):
    """A trace file, or a span in it, could not be read as episodes; the message says where and why."""


def span_messages(
    attributes: Mapping[str, Any], where: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A model call span's chat messages and its output messages, in OpenAI's chat format; `where` names
    the span in errors."""
    if "gen_ai.input.messages" in attributes or "gen_ai.output.messages" in attributes:
        instructions = _parsed(attributes, where, "gen_ai.system_instructions", [])
        system = [{"role": "system", "content": _text(instructions, where)}] if instructions else []
        inputs = [_message(item, where) for item in _parsed(attributes, where, "gen_ai.input.messages", [])]
        outputs = [_message(item, where) for item in _parsed(attributes, where, "gen_ai.output.messages", [])]
        return system + inputs, outputs
    return _indexed_messages(attributes, "gen_ai.prompt"), _indexed_messages(attributes, "gen_ai.completion")


def _parsed(attributes: Mapping[str, Any], where: str, name: str, default: object) -> Any:
    value = attributes.get(name, default)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            raise TraceImportError(f"{where}: {name} is not JSON ({error.msg}).") from None
    if not isinstance(value, list):
        raise TraceImportError(f"{where}: {name} must be a list of messages or parts.")
    return value


def _message(item: object, where: str) -> dict[str, Any]:
    """One message of the current conventions (`{"role", "parts": [...]}`, outputs with `finish_reason`)."""
    if not isinstance(item, Mapping) or not isinstance(item.get("parts"), list):
        raise TraceImportError(f"{where}: a message must be an object with a parts list: {item!r:.200}")
    role = str(item.get("role", "user"))
    parts = item["parts"]
    calls = [
        _tool_call(part) for part in parts if isinstance(part, Mapping) and part.get("type") == "tool_call"
    ]
    responses = [
        part for part in parts if isinstance(part, Mapping) and part.get("type") == "tool_call_response"
    ]
    message: dict[str, Any] = {"role": "tool" if responses else role, "content": _text(parts, where)}
    if responses:
        response = responses[0].get("response")
        message["content"] = response if isinstance(response, str) else json.dumps(response)
        message["tool_call_id"] = str(responses[0].get("id", ""))
    if calls:
        message["tool_calls"] = calls
    if item.get("finish_reason") is not None:
        message["finish_reason"] = str(item["finish_reason"])
    return message


_SKIPPED_PARTS = frozenset({"tool_call", "tool_call_response", "reasoning"})
"""Parts that are not message text: calls and responses become their own fields; reasoning is dropped
(the model's own chain of thought is not part of the chat it saw)."""


def _text(parts: list[Any], where: str) -> str | None:
    texts = []
    for part in parts:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text":
            texts.append(str(part.get("content", "")))
        elif kind not in _SKIPPED_PARTS:
            raise TraceImportError(
                f"{where}: a {kind!r} part cannot be imported (text, tool calls and tool responses "
                "can); leave such spans out with skip_invalid=True."
            )
    return "".join(texts) if texts else None


def _tool_call(part: Mapping[str, Any]) -> dict[str, Any]:
    return chat_tool_call(part.get("id"), part.get("name"), part.get("arguments"))


def otlp_list(holder: object, key: str) -> list[Any]:
    """The list under `key` of an OTLP JSON object (`resourceSpans`, `scopeLogs`, ...), or `[]` where the
    holder is no object or the key holds no list: a file of another exporter may leave either out."""
    value = holder.get(key) if isinstance(holder, Mapping) else None
    return value if isinstance(value, list) else []


def chat_tool_call(call_id: object, name: object, arguments: object) -> dict[str, Any]:
    """A tool call in chat's format; arguments that are not text yet are written as JSON."""
    return {
        "id": str(call_id or ""),
        "type": "function",
        "function": {
            "name": str(name or ""),
            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments or {}),
        },
    }


def _indexed_messages(attributes: Mapping[str, Any], prefix: str) -> list[dict[str, Any]]:
    """OpenLLMetry's `gen_ai.prompt.<i>.role` / `.content` (and `.tool_calls.<j>.*`) as messages."""
    messages = []
    index = 0
    while f"{prefix}.{index}.role" in attributes or f"{prefix}.{index}.content" in attributes:
        key = f"{prefix}.{index}"
        message: dict[str, Any] = {
            "role": str(attributes.get(f"{key}.role", "user")),
            "content": attributes.get(f"{key}.content"),
        }
        calls: list[dict[str, Any]] = []
        while f"{key}.tool_calls.{len(calls)}.name" in attributes:
            call_key = f"{key}.tool_calls.{len(calls)}"
            calls.append(
                {
                    "id": str(attributes.get(f"{call_key}.id", "")),
                    "type": "function",
                    "function": {
                        "name": str(attributes[f"{call_key}.name"]),
                        "arguments": str(attributes.get(f"{call_key}.arguments", "{}")),
                    },
                }
            )
        if calls:
            message["tool_calls"] = calls
        for extra in ("tool_call_id", "finish_reason"):
            if attributes.get(f"{key}.{extra}") is not None:
                message[extra] = str(attributes[f"{key}.{extra}"])
        messages.append(message)
        index += 1
    return messages


def span_tools(attributes: Mapping[str, Any], where: str) -> list[dict[str, Any]]:
    """The tools a model call span offered, as chat tools (`{"type": "function", "function": {...}}`);
    empty when the span records none."""
    if "gen_ai.tool.definitions" in attributes:
        return [_chat_tool(item, where) for item in _parsed(attributes, where, "gen_ai.tool.definitions", [])]
    tools: list[dict[str, Any]] = []
    while f"llm.request.functions.{len(tools)}.name" in attributes:
        key = f"llm.request.functions.{len(tools)}"
        parameters = attributes.get(f"{key}.parameters")
        if isinstance(parameters, str):
            try:
                parameters = json.loads(parameters)
            except json.JSONDecodeError as error:
                raise TraceImportError(f"{where}: {key}.parameters is not JSON ({error.msg}).") from None
        function = {
            "name": str(attributes[f"{key}.name"]),
            "description": attributes.get(f"{key}.description"),
        }
        tools.append(_chat_tool({**function, "parameters": parameters}, where))
    return tools


def _chat_tool(item: object, where: str) -> dict[str, Any]:
    """A tool definition, flat (`{"type": "function", "name", ...}`, as the conventions record it) or in
    chat's nested form, as a chat tool; fields without a value are left out."""
    if not isinstance(item, Mapping):
        raise TraceImportError(f"{where}: a tool definition must be an object: {item!r:.200}")
    nested = item.get("function")
    function: Mapping[str, Any] = nested if isinstance(nested, Mapping) else item
    if not isinstance(function.get("name"), str) or not function["name"]:
        raise TraceImportError(f"{where}: a tool definition without a name: {item!r:.200}")
    kept = {
        key: function[key] for key in ("name", "description", "parameters") if function.get(key) is not None
    }
    return {"type": "function", "function": kept}
