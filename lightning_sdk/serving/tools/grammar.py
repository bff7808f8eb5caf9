"""Constrained tool calls: `strict` schemas, forced calls, and tools next to a JSON `response_format`.

A tool with `"strict": true` promises that a call's arguments validate against its `parameters` schema.
The server keeps that promise the way structured outputs keep theirs: the engine's grammar backend masks
the tokens that would break the Hermes call format or the schema. The grammar depends on what may come:

- `tool_choice="auto"` with free text: any text without `<tool_call>`, or text that ends in `<tool_call>`
  and a newline and goes on as calls: one of the tools' openings, arguments valid for that tool, the
  closing tag (the tag is plain text for most models, so the text before it is one lexeme that excludes it).
- `tool_choice="auto"` with a JSON `response_format`: that JSON, or calls. Without this the format would
  leave the model no way to call a tool (the Agents SDK sends both for an agent with tools and an
  `output_type`).
- `"required"` or a named function, strict or not: the call's opening is already in the prompt
  (`tool_choice_prefix`); the grammar makes the rest calls, or the named function's arguments and the
  closing tag. A forced call is always a well-formed call of a tool offered (vLLM's own server constrains
  a forced `tool_choice` the same way): without the grammar a small model may answer it with text.

Under a grammar, a call's arguments follow its tool's own `parameters` schema, strict or not, as vLLM's
named and required tool choice do: asked for `add(a: int, b: int)`, the model writes integers `a` and
`b`, not any object it likes. `strict` adds nothing to the schema: it only makes the server refuse a schema
that leaves an object open (`strict.py`), so a strict call cannot carry keys of its own. A tool without
`parameters` takes any object. A schema the grammar backend cannot compile (`compile_problem`) is refused
with a 400 for a strict tool, whose promise the server could not keep; a tool without `strict` is served
with "any JSON object" as its arguments instead, and one log line names the tool.

JSON is compact (no free whitespace), as for structured outputs. Grammars are in the Lark dialect of
llguidance, the vLLM backend that runs them.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Mapping
from typing import Any

from lightning_sdk.serving.errors import APIError
from lightning_sdk.serving.tools.calls import TOOL_CALL_END, TOOL_CALL_START, call_opening

__all__ = ["compile_problem", "tool_grammar"]

log = logging.getLogger(__name__)

_COMPACT = {"x-guidance": {"whitespace_flexible": False}}
_ANY_OBJECT: dict[str, Any] = {"type": "object"}
_CALL_END = f"}}\n{TOOL_CALL_END}"  # closes the call object, then the tag: the format the prompt teaches


def tool_grammar(
    tools: list[dict[str, Any]],
    tool_choice: str | dict[str, Any] | None,
    json_content: Mapping[str, Any] | None,
    parallel: bool = False,
) -> str | None:
    """The grammar for a chat request's tools, or `None` when decoding stays as it is.

    Args:
        tools: The request's validated tools (empty with `tool_choice="none"`).
        tool_choice: The request's `tool_choice`.
        json_content: The schema a JSON `response_format` asks for (`{"type": "object"}` for
            `json_object`), or `None` for free text.
        parallel: Allow several calls in one answer (the request's `parallel_tool_calls=true`). Otherwise
            one: a small model sampling at temperature 1 otherwise tends to chain calls until `max_tokens`.
    """
    strict = any(tool["function"].get("strict") for tool in tools)
    forced = tool_choice == "required" or isinstance(tool_choice, dict)
    if not tools or not (strict or forced or json_content is not None):
        return None
    calls = _call_rules(tools, parallel)
    if isinstance(tool_choice, dict):
        name = tool_choice["function"]["name"]
        tool = next(tool for tool in tools if tool["function"]["name"] == name)
        return _lark(f'args_0 "{_escape(_CALL_END)}"', [_json_rule("args_0", tool)])
    if tool_choice == "required":
        return _lark("calls", calls)
    if json_content is not None:
        content = f"content: %json {json.dumps({**json_content, **_COMPACT})}"
        return _lark(f'content | "{_escape(call_opening())}" calls', [content, *calls])
    return _lark("TEXT | OPEN calls", [_TEXT, _OPEN, *calls])


# Free text: a single lexeme each, since `<tool_call>` is plain text for most tokenizers. TEXT never holds
# the tag; OPEN is text that holds it once, at its end, followed by a newline.
_TAG = re.escape(TOOL_CALL_START)
_TEXT = f"TEXT: /(.|\\n)*/ & ~/(.|\\n)*{_TAG}(.|\\n)*/"
_OPEN = f"OPEN: /(.|\\n)*{_TAG}\\n/ & ~/(.|\\n)*{_TAG}(.|\\n)*{_TAG}\\n/"


def _arguments_schema(tool: dict[str, Any]) -> dict[str, Any]:
    """The schema a call's arguments are generated under: the tool's `parameters` (module docstring)."""
    function = tool["function"]
    schema = function.get("parameters")
    if not isinstance(schema, Mapping):
        return dict(_ANY_OBJECT)
    problem = compile_problem(json.dumps({**schema, **_COMPACT}, sort_keys=True))
    if problem is None:
        return dict(schema)
    if function.get("strict"):
        raise APIError.bad_request(
            f"The grammar backend cannot compile the parameters of the strict tool {function['name']!r}, so "
            f"the server cannot keep the promise of strict: {problem}. Simplify the schema, or drop 'strict' "
            "(the call's arguments are then any JSON object).",
            param="tools",
        )
    _log_fallback(function["name"], problem)
    return dict(_ANY_OBJECT)


@functools.lru_cache(maxsize=256)
def compile_problem(schema_json: str) -> str | None:
    """Why llguidance, the engine's grammar backend (`lightning_sdk.engine.vllm.args`), cannot compile the
    JSON schema `schema_json`; `None` when it can, or when llguidance is not installed (no engine here
    constrains decoding then). Cached: agents send the same tools with every request."""
    try:
        from llguidance import LLMatcher
    except ImportError:
        return None
    grammar = LLMatcher.grammar_from_lark(f"start: %json {schema_json}\n")
    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar)  # warnings compile all the same
    return (messages[0].strip().splitlines() or ["(no message)"])[0] if is_error else None


@functools.lru_cache(maxsize=256)
def _log_fallback(name: str, problem: str) -> None:
    """One log line per tool and problem, however many requests send it."""
    log.warning(
        "tool %r: the grammar backend cannot compile its parameters schema (%s); its calls' arguments are "
        "generated as any JSON object",
        name,
        problem,
    )


def _opening(tool: dict[str, Any]) -> str:
    """What a call writes before its arguments after the tag line: `call_opening`'s, which a forced call's
    prompt prefix also is."""
    return call_opening(tool["function"]["name"]).removeprefix(call_opening())


def _json_rule(rule: str, tool: dict[str, Any]) -> str:
    return f"{rule}: %json {json.dumps({**_arguments_schema(tool), **_COMPACT})}"


def _call_rules(tools: list[dict[str, Any]], parallel: bool) -> list[str]:
    """`calls`: one call (or, `parallel`, several) to any of the tools, opening to closing tag."""
    alternatives = [
        f'"{_escape(_opening(tool))}" args_{i} "{_escape(_CALL_END)}"' for i, tool in enumerate(tools)
    ]
    more = f' ("{_escape(chr(10) + call_opening())}" call)*' if parallel else ""
    return [
        f"calls: call{more}",
        "call: " + " | ".join(alternatives),
        *(_json_rule(f"args_{i}", tool) for i, tool in enumerate(tools)),
    ]


def _lark(start: str, rules: list[str]) -> str:
    return "\n".join([f"start: {start}", *rules]) + "\n"


def _escape(text: str) -> str:
    """`text` as the inside of a Lark string literal."""
    return json.dumps(text)[1:-1]
