"""Tool calls in the Hermes format: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

This is the format of most open chat templates with tool support (Hermes, Qwen, SmolLM3). For models
whose template has no tool support (like the bundled SmolLM2), `lightning_sdk.serving.chat.template`
describes the tools and this format in the system prompt, and renders earlier calls and results the same way.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lightning_sdk.serving.errors import APIError
from lightning_sdk.serving.tools.strict import check_strict_tools

__all__ = [
    "TOOL_CALL_END",
    "TOOL_CALL_START",
    "ParsedOutput",
    "ToolTextFilter",
    "call_opening",
    "parse_tool_calls",
    "validate_tools",
]

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"


def call_opening(name: str | None = None) -> str:
    """The start of a call as the model writes it: the tag and a newline, and, given the function's
    `name`, the call object up to its arguments (`<tool_call>\n{"name": "add", "arguments": `).

    A forced call's prompt ends with one of these (`chat.template.tool_choice_prefix`), and the grammar
    that continues it (`tools.grammar`) writes the same openings: both take them from here, so the prompt
    and the grammar agree byte for byte.
    """
    tag = f"{TOOL_CALL_START}\n"
    return tag if name is None else f'{tag}{{"name": {json.dumps(name)}, "arguments": '


_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


@dataclass
class ParsedOutput:
    """A completion split into plain content and tool calls (OpenAI message shape)."""

    content: str | None
    tool_calls: list[dict[str, Any]]


def validate_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Check the `tools` field: a list of `{"type": "function", "function": {"name": ...}}`, in which a
    strict tool's schema closes every object (`strict.check_strict_tools`)."""
    for position, tool in enumerate(tools or []):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
            raise APIError.bad_request(
                f"tools[{position}] has an unknown format: expected "
                '{"type": "function", "function": {"name": ..., "parameters": {...}}}.',
                param=f"tools[{position}]",
            )
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise APIError.bad_request(
                f"tools[{position}].function.name must be a non-empty string.",
                param=f"tools[{position}].function.name",
            )
    check_strict_tools(list(tools or []))
    return list(tools or [])


def parse_tool_calls(text: str) -> ParsedOutput:
    """Split `text` into content before the first tool call and the well-formed calls.

    A call whose JSON does not parse, or has no name, is kept as content: the caller sees what the model
    wrote rather than a call that cannot be executed.
    """
    start = text.find(TOOL_CALL_START)
    if start < 0:
        return ParsedOutput(text, [])
    calls = []
    for body in _CALL.findall(text[start:]):
        try:
            data = json.loads(body)
        except json.JSONDecodeError:
            return ParsedOutput(text, [])
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            return ParsedOutput(text, [])
        arguments = data.get("arguments", data.get("parameters", {}))
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {
                    "name": data["name"],
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                },
            }
        )
    content = text[:start].strip()
    return ParsedOutput(content or None, calls)


class ToolTextFilter:
    """Streams the content part of a completion while holding back what may be a tool call.

    Text after `marker` (`<tool_call>`) is not streamed as content; the calls are parsed from the whole text
    at the end and sent in one delta. Without a marker (a format whose calls can start anywhere) nothing is
    streamed before the end. `parse` reads the calls (default: the Hermes format).
    """

    def __init__(
        self, parse: Callable[[str], ParsedOutput] | None = None, marker: str | None = TOOL_CALL_START
    ) -> None:
        self.text = ""
        self._sent = 0
        self._in_call = marker is None
        self._parse = parse or parse_tool_calls
        self._marker = marker or ""

    def feed(self, new_text: str) -> str:
        """Add new text; return the content that is safe to stream now."""
        self.text += new_text
        if self._in_call:
            return ""
        start = self.text.find(self._marker)
        if start >= 0:
            self._in_call = True
            return self._take(start)
        return self._take(len(self.text) - _partial_tag_length(self.text, self._marker))

    def _take(self, end: int) -> str:
        chunk, self._sent = self.text[self._sent : end], max(self._sent, end)
        return chunk

    def finish(self) -> tuple[str, ParsedOutput]:
        """At the end: content not yet streamed, and the parsed output of the whole text."""
        parsed = self._parse(self.text)
        if parsed.tool_calls:
            return "", parsed
        return self._take(len(self.text)), parsed


def _partial_tag_length(text: str, marker: str) -> int:
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:size]):
            return size
    return 0
