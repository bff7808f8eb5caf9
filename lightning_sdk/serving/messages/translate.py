"""Anthropic's Messages API in Chat Completions terms, both ways, over plain JSON data.

A Messages request is served as the equivalent chat request, so that it goes through the same chat
template, tool prompt, grammar and parser as `/v1/chat/completions`, and the same conversation gives the
same prompt token ids through either API. The answer, read in chat terms (text and tool calls), is put
back into Anthropic's content blocks.

The conversation and the tools are converted by `lightning_sdk.tracing.formats.messages_items` (the recording
side needs the same conversion). Here: `tool_choice` `auto`, `any`, `tool` and `none` are chat's `auto`,
`required`, the named function and `none`, and `disable_parallel_tool_use` is the opposite of
`parallel_tool_calls`; the answer's text and tool calls become content blocks with Anthropic's stop reason.

Pure Python over plain data.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from lightning_sdk.serving.messages.schemas import StopReason
from lightning_sdk.tracing.formats.messages_items import MessagesInputError, chat_messages, chat_tools

__all__ = [
    "answer_parts",
    "chat_request",
    "chat_tool_choice",
    "content_blocks",
    "matched_stop_sequence",
    "new_id",
    "stop_reason",
    "tool_use_calls",
]


def new_id(prefix: str) -> str:
    """A fresh id in Anthropic's style: `msg_...`, `toolu_...`."""
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def chat_request(body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat completions body that asks the model what this Messages (or count_tokens) body asks."""
    tools = chat_tools(body.get("tools"))
    tool_choice, parallel = chat_tool_choice(body.get("tool_choice"), tools)
    chat = {
        "model": body.get("model"),
        "messages": chat_messages(body.get("messages"), body.get("system")),
        "tools": tools or None,
        "tool_choice": tool_choice,
        "parallel_tool_calls": parallel,
        "max_tokens": body.get("max_tokens"),
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "stop": body.get("stop_sequences") or None,
    }
    return {key: value for key, value in chat.items() if value is not None}


def chat_tool_choice(
    tool_choice: Any, tools: Sequence[Mapping[str, Any]]
) -> tuple[str | dict[str, Any] | None, bool | None]:
    """Chat's `(tool_choice, parallel_tool_calls)` for a Messages `tool_choice` (None: the defaults)."""
    if tool_choice is None:
        return None, None
    kind = tool_choice.get("type") if isinstance(tool_choice, dict) else None
    disable = tool_choice.get("disable_parallel_tool_use") if isinstance(tool_choice, dict) else None
    parallel = None if disable is None else not disable
    if kind in ("auto", "none"):
        return kind, parallel
    if kind not in ("any", "tool"):
        raise MessagesInputError(
            "tool_choice.type must be 'auto', 'any', 'tool' or 'none'.", "tool_choice.type"
        )
    if not tools:
        raise MessagesInputError(
            f"tool_choice {kind!r} needs tools: send the tools the model may call.", "tool_choice"
        )
    if kind == "any":
        return "required", parallel
    name = tool_choice.get("name")
    if name not in {tool["function"]["name"] for tool in tools}:
        raise MessagesInputError(f"tool_choice.name {name!r} is not one of the tools.", "tool_choice.name")
    return {"type": "function", "function": {"name": name}}, parallel


# --- the answer ---------------------------------------------------------------------------------------
def tool_use_calls(tool_calls: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]] | None:
    """Chat tool calls with fresh `toolu_` ids, or None when one's arguments are not a JSON object: a
    tool_use block's input must be one, so such an answer is served as the text the model wrote."""
    calls = []
    for call in tool_calls:
        try:
            arguments = json.loads(call["function"]["arguments"])
        except (json.JSONDecodeError, TypeError):
            return None
        if not isinstance(arguments, dict):
            return None
        calls.append({**call, "id": new_id("toolu")})
    return calls


def answer_parts(
    content: str | None, tool_calls: Sequence[Mapping[str, Any]], written: str
) -> tuple[str | None, list[dict[str, Any]]]:
    """The answer's text and tool calls (`tool_use_calls`) from a completion parsed in chat terms; when a
    call cannot be a tool_use block, `written` (what the model wrote, as text) and no calls."""
    calls = tool_use_calls(tool_calls)
    return (written, []) if calls is None else (content, calls)


def content_blocks(text: str | None, tool_calls: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The answer's content: its text (when there is any), then a tool_use block per call
    (calls from `tool_use_calls`)."""
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    for call in tool_calls:
        function = call["function"]
        blocks.append(
            {
                "type": "tool_use",
                "id": call["id"],
                "name": function["name"],
                "input": json.loads(function["arguments"]),
            }
        )
    return blocks


def stop_reason(finish_reason: str | None, tool_use: bool, stop_sequence: str | None) -> StopReason:
    """Anthropic's stop reason for the engine's finish reason (`stop`, `length`, ...)."""
    if finish_reason == "length":
        return "max_tokens"
    if tool_use:
        return "tool_use"
    return "stop_sequence" if stop_sequence is not None else "end_turn"


def matched_stop_sequence(sampled_text: str, text: str, stop_sequences: Sequence[str]) -> str | None:
    """The stop sequence that ended a completion, or None.

    `text` is the completion's text (the engine leaves a matched stop string out), `sampled_text` its
    token ids decoded (the stop string included): the stop sequence is the one found first after `text`.
    """
    if not stop_sequences:
        return None
    rest = sampled_text[len(text) :] if sampled_text.startswith(text) else sampled_text
    found = [(rest.find(stop), -len(stop), stop) for stop in stop_sequences if stop in rest]
    return min(found)[2] if found else None
