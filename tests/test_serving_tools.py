"""Tool calls: Hermes-format parsing, streaming hold-back, and rendering tools into the prompt."""

from __future__ import annotations

import json

import pytest

from lightning_sdk.serving.chat.template import render_chat, tool_choice_prefix
from lightning_sdk.serving.errors import APIError
from lightning_sdk.serving.tools.calls import ToolTextFilter, parse_tool_calls, validate_tools

ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    },
}


def test_parse_calls_and_leading_content() -> None:
    text = (
        'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
        '<tool_call>{"name": "add", "arguments": {"a": 3, "b": 4}}</tool_call>'
    )
    parsed = parse_tool_calls(text)
    assert parsed.content == "Let me add."
    assert [json.loads(c["function"]["arguments"]) for c in parsed.tool_calls] == [
        {"a": 1, "b": 2},
        {"a": 3, "b": 4},
    ]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in parsed.tool_calls)


def test_unclosed_call_at_the_end_still_parses() -> None:
    parsed = parse_tool_calls('<tool_call>\n{"name": "add", "arguments": {"a": 1}}')
    assert parsed.content is None
    assert parsed.tool_calls[0]["function"]["name"] == "add"


@pytest.mark.parametrize(
    "text", ["no call here", "<tool_call>{not json}</tool_call>", '<tool_call>{"arguments": {}}</tool_call>']
)
def test_text_without_a_valid_call_stays_content(text: str) -> None:
    parsed = parse_tool_calls(text)
    assert parsed.content == text
    assert parsed.tool_calls == []


def test_stream_filter_holds_back_a_call() -> None:
    pieces = ["Sure", ". <tool", '_call>{"name": "add", ', '"arguments": {"a": 1}}</tool_call>']
    text_filter = ToolTextFilter()
    streamed = "".join(text_filter.feed(piece) for piece in pieces)
    rest, parsed = text_filter.finish()
    assert streamed == "Sure. "
    assert rest == ""
    assert parsed.tool_calls[0]["function"]["name"] == "add"


def test_stream_filter_releases_a_false_alarm() -> None:
    text_filter = ToolTextFilter()
    streamed = text_filter.feed("a <to") + text_filter.feed("p> b")
    rest, parsed = text_filter.finish()
    assert streamed + rest == "a <top> b"
    assert parsed.tool_calls == []


@pytest.mark.parametrize(
    "tools",
    [
        [{"type": "web_search"}],
        [{"type": "function"}],
        [{"type": "function", "function": {"name": ""}}],
        ["add"],
    ],
)
def test_unknown_tool_formats_are_rejected(tools: list) -> None:
    with pytest.raises(APIError) as raised:
        validate_tools(tools)
    assert raised.value.status == 400


def test_tool_choice_prefixes() -> None:
    assert tool_choice_prefix("auto", [ADD_TOOL]) == ""
    assert tool_choice_prefix("required", [ADD_TOOL]) == "<tool_call>\n"
    named = tool_choice_prefix({"type": "function", "function": {"name": "add"}}, [ADD_TOOL])
    assert named == '<tool_call>\n{"name": "add", "arguments": '
    with pytest.raises(APIError):
        tool_choice_prefix({"type": "function", "function": {"name": "nope"}}, [ADD_TOOL])


@pytest.mark.slow
def test_tools_and_tool_turns_render_into_the_bundled_template(bundled_model) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(bundled_model.path)
    messages = [
        {"role": "user", "content": "Add 1 and 2."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
    ]
    text = tokenizer.decode(render_chat(tokenizer, messages, [ADD_TOOL]))
    assert text.startswith("<|im_start|>system\n# Tools")
    assert '"name": "add"' in text and "Add two integers." in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
        in text
    )
    assert "<tool_response>\n3\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")
