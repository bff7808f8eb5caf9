"""Which tool-call format the served model writes, and how its calls are read back (`tool_parser`).

The default, `"hermes"`, is ours (`calls.py`, beside this file): `<tool_call>{"name": ..., "arguments":
...}</tool_call>`, the format of the bundled model's system prompt and of most open templates (Hermes,
Qwen2.5, SmolLM3). It is the one format the server also writes itself: the system prompt for templates without
tool support, the forced opening of `tool_choice="required"` or a named function, and the grammar of strict
tools.

Models trained on another format (Llama 3.x JSON, Mistral's `[TOOL_CALLS]`, Qwen3's XML) render tools with
their own chat template and write calls their way. For those, name one of vLLM's maintained parsers (the
names of `vllm serve --tool-call-parser`: `"llama3_json"`, `"mistral"`, `"qwen3_xml"`, ...): the server
reads calls with it. It streams such answers whole at the end (the parsers' own streaming needs vLLM's
request state), and refuses what only the Hermes format supports with a 400 that says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

from lightning_sdk.serving.tools.calls import TOOL_CALL_START, ParsedOutput, parse_tool_calls

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase
    from vllm.tokenizers import TokenizerLike

__all__ = ["HERMES", "ToolCallParser", "make_tool_parser"]

HERMES = "hermes"
"""The default format, parsed by this package."""


class ToolCallParser(Protocol):
    """Reads the tool calls out of a completion's text."""

    @property
    def name(self) -> str:
        """The format's name (`tool_parser`)."""
        ...

    @property
    def marker(self) -> str | None:
        """Text that starts a call, so a stream can send the content before it; `None`: hold back all."""
        ...

    def parse(self, text: str, tools: list[dict[str, Any]]) -> ParsedOutput:
        """The completion split into content and OpenAI-shaped tool calls."""
        ...


@dataclass(frozen=True)
class HermesParser:
    """Our own parser of the Hermes format (`calls.parse_tool_calls`)."""

    name: str = HERMES
    marker: str | None = TOOL_CALL_START

    def parse(self, text: str, tools: list[dict[str, Any]]) -> ParsedOutput:
        return parse_tool_calls(text)


class VLLMToolParser:
    """One of vLLM's tool parsers, by its `--tool-call-parser` name, over the served model's tokenizer."""

    marker: str | None = None

    def __init__(self, name: str, tokenizer: PreTrainedTokenizerBase) -> None:
        from vllm.tool_parsers import ToolParserManager

        try:
            self._parser_class = ToolParserManager.get_tool_parser(name)
        except KeyError:
            known = ", ".join(sorted({*ToolParserManager.tool_parsers, *ToolParserManager.lazy_parsers}))
            raise ValueError(f"tool_parser={name!r} is not one of vLLM's tool parsers: {known}.") from None
        self.name = name
        # vLLM's parsers take its `TokenizerLike`, which a Hugging Face tokenizer serves at run time.
        self._tokenizer = cast("TokenizerLike", tokenizer)
        # Fails now, with the parser's reason, if the tokenizer lacks the format's special tokens.
        self._parser_class(self._tokenizer, None)

    def parse(self, text: str, tools: list[dict[str, Any]]) -> ParsedOutput:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        # The parsers keep per-request state and read the request's tools: a fresh one per answer.
        request = ChatCompletionRequest.model_validate(
            {"model": "m", "messages": [{"role": "user", "content": ""}], "tools": tools}
        )
        parser = self._parser_class(self._tokenizer, list(request.tools or []))
        found = parser.extract_tool_calls(text, request)
        if not found.tools_called:
            return ParsedOutput(text, [])
        calls = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.function.name, "arguments": call.function.arguments},
            }
            for call in found.tool_calls
        ]
        return ParsedOutput((found.content or "").strip() or None, calls)


def make_tool_parser(name: str, tokenizer: PreTrainedTokenizerBase) -> ToolCallParser:
    """The parser called `name`: `"hermes"` (ours) or a vLLM tool parser name."""
    return HermesParser() if name == HERMES else VLLMToolParser(name, tokenizer)
