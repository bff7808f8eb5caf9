"""Chat messages (OpenAI format) to the exact prompt token ids the engine sees.

The server renders the model's own chat template and tokenizes the result once; the ids go to the engine
and back to the client as `prompt_token_ids`, so nothing is re-tokenized anywhere. Templates without tool
support (the bundled SmolLM2's) get the tools described in the system prompt and earlier tool calls and
results written in the Hermes `<tool_call>` / `<tool_response>` format (see
`lightning_sdk.serving.tools.calls`).
"""

from __future__ import annotations

import functools
import json
from typing import Any

from lightning_sdk.serving.errors import APIError
from lightning_sdk.serving.tools.calls import TOOL_CALL_END, TOOL_CALL_START, call_opening

__all__ = [
    "check_prompt_chars",
    "longest_token_chars",
    "render_chat",
    "template_supports_tools",
    "tool_choice_prefix",
    "tools_system_prompt",
]

_ROLES = {"system", "developer", "user", "assistant", "tool"}


def template_supports_tools(tokenizer: Any) -> bool:
    """True when the tokenizer's chat template reads a `tools` variable."""
    template = tokenizer.chat_template or ""
    return "tools" in template


def tools_system_prompt(tools: list[dict[str, Any]]) -> str:
    """Describe the tools and the call format, for templates that cannot render tools themselves."""
    signatures = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    return (
        "# Tools\n\nYou may call one or more functions to answer the user. The available functions, one JSON "
        f"object per line:\n<tools>\n{signatures}\n</tools>\n\n"
        "To call a function, reply with a JSON object holding its name and arguments between tags:\n"
        f'{TOOL_CALL_START}\n{{"name": <function-name>, "arguments": <arguments-json-object>}}\n'
        f"{TOOL_CALL_END}\n"
        "Each result comes back in <tool_response></tool_response> tags."
    )


def tool_choice_prefix(tool_choice: str | dict[str, Any] | None, tools: list[dict[str, Any]]) -> str:
    """Text that starts the assistant turn to force a call (`"required"` or a named function).

    The prefix becomes part of the prompt, so prompt ids plus completion ids stay exactly what the model
    attended to; the server puts it back in front of the completion text before parsing.
    """
    if tool_choice in (None, "auto", "none"):
        return ""
    if not tools:
        raise APIError.bad_request(
            f"tool_choice={tool_choice!r} needs `tools`: send the tools the model may call, "
            "or drop tool_choice.",
            param="tool_choice",
        )
    if tool_choice == "required":
        return call_opening()
    name = tool_choice.get("function", {}).get("name") if isinstance(tool_choice, dict) else None
    if not isinstance(name, str) or name not in {tool["function"]["name"] for tool in tools}:
        raise APIError.bad_request(
            "tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'function': {'name': N}} "
            "naming one of the tools.",
            param="tool_choice",
        )
    return call_opening(name)


@functools.lru_cache(maxsize=8)  # per tokenizer (hashed by identity): a server has one
def longest_token_chars(tokenizer: Any) -> int:
    """The most characters one token of `tokenizer` stands for (its longest vocabulary entry, counted in
    the vocabulary's spelling, which never has fewer characters than the text it stands for): a text of
    more than `max_model_len` times this many characters cannot fit the context, whatever it says."""
    return max((len(token) for token in tokenizer.get_vocab()), default=1)


def check_prompt_chars(text_chars: int, max_chars: int | None, param: str) -> None:
    """A 400 (`context_length_exceeded`) for a prompt of more than `max_chars` characters, before it is
    tokenized: tokenizing tens of megabytes takes the server's event loop for most of a minute."""
    if max_chars is not None and text_chars > max_chars:
        raise APIError.bad_request(
            f"The prompt is {text_chars} characters long; no prompt longer than {max_chars} characters fits "
            "this model's context window. Send a shorter prompt.",
            param=param,
            code="context_length_exceeded",
        )


def render_chat(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    assistant_prefix: str = "",
    max_chars: int | None = None,
) -> list[int]:
    """Prompt token ids for `messages` (+ tools) with the generation prompt and an optional prefix; a 400
    without tokenizing when the rendered prompt is longer than `max_chars` (`check_prompt_chars`)."""
    if not tokenizer.chat_template:
        raise APIError.bad_request("This model has no chat template; use /v1/completions.", param="messages")
    native_tools = template_supports_tools(tokenizer)
    converted = [_convert_message(m, i, native_tools) for i, m in enumerate(messages)]
    if tools and not native_tools:
        converted = _with_tools_in_system_prompt(converted, tools)
    try:
        text = tokenizer.apply_chat_template(
            converted,
            tools=tools if native_tools and tools else None,
            add_generation_prompt=True,
            tokenize=False,
        )
    except Exception as error:  # noqa: BLE001 - jinja raises for messages the template refuses
        raise APIError.bad_request(
            f"The chat template cannot render these messages: {error}", "messages"
        ) from None
    check_prompt_chars(len(text) + len(assistant_prefix), max_chars, "messages")
    ids: list[int] = tokenizer.encode(text + assistant_prefix, add_special_tokens=False)
    return ids


def _convert_message(message: Any, position: int, native_tools: bool) -> dict[str, Any]:
    if not isinstance(message, dict) or message.get("role") not in _ROLES:
        raise APIError.bad_request(
            f"messages[{position}] must be an object with a role in {sorted(_ROLES)}.",
            f"messages[{position}]",
        )
    role = "system" if message["role"] == "developer" else message["role"]
    content = _text_content(message.get("content"), position)
    if role == "assistant" and message.get("tool_calls"):
        calls = [_call_json(call, position) for call in message["tool_calls"]]
        if native_tools:
            return {
                "role": "assistant",
                "content": content,
                "tool_calls": [
                    {"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                    for c in calls
                ],
            }
        blocks = [f"{TOOL_CALL_START}\n{json.dumps(c, ensure_ascii=False)}\n{TOOL_CALL_END}" for c in calls]
        return {"role": "assistant", "content": "\n".join(([content] if content else []) + blocks)}
    if role == "tool" and not native_tools:
        # Not every template knows a "tool" role; a user turn with the result in tags works with all.
        return {"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"}
    converted = {"role": role, "content": content}
    if role == "tool" and message.get("tool_call_id"):
        converted["tool_call_id"] = message["tool_call_id"]
    return converted


def _text_content(content: Any, position: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in ("text", "input_text"):
                raise APIError.bad_request(
                    f"messages[{position}].content: only text parts are supported by this model.",
                    f"messages[{position}].content",
                )
            texts.append(str(part.get("text", "")))
        return "".join(texts)
    raise APIError.bad_request(
        f"messages[{position}].content must be a string or a list of text parts.",
        f"messages[{position}].content",
    )


def _call_json(call: Any, position: int) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise APIError.bad_request(
            f"messages[{position}].tool_calls has an unknown format.", f"messages[{position}].tool_calls"
        )
    arguments = function.get("arguments") or "{}"
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError:
        parsed = arguments  # keep what the client sent; the model saw it this way
    return {"name": function["name"], "arguments": parsed}


def _with_tools_in_system_prompt(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    description = tools_system_prompt(tools)
    if messages and messages[0]["role"] == "system":
        first = {**messages[0], "content": f"{messages[0]['content']}\n\n{description}".strip()}
        return [first, *messages[1:]]
    return [{"role": "system", "content": description}, *messages]
