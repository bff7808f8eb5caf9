"""Tool-call formats (`tool_parser`): our Hermes parser and vLLM's maintained parsers for other families, on
recorded model text. The tokenizer is the bundled model's with each family's special tokens added (vLLM's
parsers look their markers up in the vocabulary; no other model can be downloaded here)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from lightning_sdk.serving.chat.schemas import ChatRequest
from lightning_sdk.serving.errors import APIError
from lightning_sdk.serving.tools.calls import ToolTextFilter
from lightning_sdk.serving.tools.parsers import make_tool_parser

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    },
}

# What models of each family write for "What is 12 + 7?" with the add tool, and their special tokens.
FORMATS = {
    "hermes": ('Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 12, "b": 7}}\n</tool_call>', []),
    "llama3_json": ('<|python_tag|>{"name": "add", "parameters": {"a": 12, "b": 7}}', ["<|python_tag|>"]),
    "mistral": ('[TOOL_CALLS][{"name": "add", "arguments": {"a": 12, "b": 7}}]', ["[TOOL_CALLS]"]),
    "qwen3_xml": (
        "<tool_call>\n<function=add>\n<parameter=a>\n12\n</parameter>\n<parameter=b>\n7\n</parameter>\n"
        "</function>\n</tool_call>",
        ["<tool_call>", "</tool_call>"],
    ),
}


def _tokenizer(bundled_model: Any, special_tokens: list[str]) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(bundled_model.path))
    if special_tokens:
        tokenizer.add_special_tokens({"additional_special_tokens": special_tokens})
    return tokenizer


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_each_format_reads_its_calls_and_leaves_plain_answers_alone(bundled_model: Any, name: str) -> None:
    text, special_tokens = FORMATS[name]
    parser = make_tool_parser(name, _tokenizer(bundled_model, special_tokens))
    parsed = parser.parse(text, [ADD])
    (call,) = parsed.tool_calls
    assert call["type"] == "function" and call["function"]["name"] == "add" and call["id"]
    assert json.loads(call["function"]["arguments"]) == {"a": 12, "b": 7}
    assert parsed.content in (None, "Let me add.")
    plain = parser.parse("The answer is 19.", [ADD])
    assert plain.tool_calls == [] and plain.content == "The answer is 19."


def test_an_unknown_name_lists_the_parsers_and_missing_tokens_fail_at_once(bundled_model: Any) -> None:
    with pytest.raises(ValueError, match=r"not one of vLLM's tool parsers:.*llama3_json"):
        make_tool_parser("no-such-format", _tokenizer(bundled_model, []))
    with pytest.raises(RuntimeError, match="python_tag"):  # the bundled tokenizer has no <|python_tag|>
        make_tool_parser("llama3_json", _tokenizer(bundled_model, []))


def test_a_stream_without_a_marker_holds_everything_back_and_parses_at_the_end(bundled_model: Any) -> None:
    text, special_tokens = FORMATS["mistral"]
    parser = make_tool_parser("mistral", _tokenizer(bundled_model, special_tokens))
    text_filter = ToolTextFilter(lambda whole: parser.parse(whole, [ADD]), parser.marker)
    assert [text_filter.feed(text[i : i + 5]) for i in range(0, len(text), 5)] == [""] * len(
        range(0, len(text), 5)
    )
    rest, parsed = text_filter.finish()
    assert rest == "" and parsed.tool_calls[0]["function"]["name"] == "add"


@pytest.mark.slow
def test_what_only_the_hermes_format_can_do_is_refused_clearly(vllm_engine: Any, bundled_model: Any) -> None:
    from lightning_sdk.serving import start_server
    from lightning_sdk.serving.context import ServingContext

    # The bundled template does not render tools: another format is refused when the server starts.
    with pytest.raises(ValueError, match="does not render tools"):
        start_server(vllm_engine, tool_parser="mistral")
    # With a parser of another format, forcing a call (which writes a Hermes opening) is a 400.
    # (The parser gets its own tokenizer with Mistral's token: the shared engine's tokenizer stays as it is.)
    mistral = make_tool_parser("mistral", _tokenizer(bundled_model, ["[TOOL_CALLS]"]))
    context = ServingContext(vllm_engine, None, "m", tool_parser=mistral)
    request = ChatRequest(
        model="m", messages=[{"role": "user", "content": "add"}], tools=[ADD], tool_choice="required"
    )
    with pytest.raises(APIError, match="needs the server's default tool format"):
        context.prepare_chat(request)
