"""The wire format of Anthropic's Messages API as this server speaks it: one pydantic model per body.

`POST /v1/messages` validates its body as `MessagesRequest` and `POST /v1/messages/count_tokens` as
`CountTokensRequest`; answers are built as `Message` (or the `StreamEvent`s of a stream) and
`TokenCount`; every refusal is an `ErrorResponse`. The request models describe what this server accepts,
not all of Anthropic's API: each forbids unknown keys, and the fields Anthropic defines that the policy
cannot honour are declared with the only value they may take (null, or a few strings), so that a request
using one is refused with a message naming it (`UNSUPPORTED`) rather than silently served otherwise.

Besides Anthropic's fields, the answers carry the token-level extras of our other APIs, under the same names:
`prompt_token_ids` (the prompt the engine attended to), `token_ids` (the sampled ids), `token_logprobs`
(their sampling logprobs) and `weight_version`. A `Message` carries all four; in a stream,
`message_start.message` carries `prompt_token_ids` and `weight_version`, and `message_delta` carries all four
for the whole message.

Of the package it imports only the error type of the conversation's conversion
(`lightning_sdk.tracing.formats.messages_items`), which the recording side shares: the body is validated
here, and converted to chat terms there, once for the server, the gateway's records and the anthropic
capture.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, model_validator

from lightning_sdk.tracing.formats.messages_items import MessagesInputError

__all__ = [
    "UNSUPPORTED",
    "ContentBlock",
    "ContentBlockDeltaEvent",
    "ContentBlockStartEvent",
    "ContentBlockStopEvent",
    "CountTokensRequest",
    "ErrorDetail",
    "ErrorResponse",
    "ErrorType",
    "InputJSONDelta",
    "Message",
    "MessageDelta",
    "MessageDeltaEvent",
    "MessageDeltaUsage",
    "MessageParam",
    "MessageStartEvent",
    "MessageStopEvent",
    "MessagesInputError",
    "MessagesRequest",
    "Metadata",
    "PingEvent",
    "StopReason",
    "StreamEvent",
    "TextBlock",
    "TextBlockParam",
    "TextDelta",
    "TokenCount",
    "ToolChoice",
    "ToolParam",
    "ToolResultBlockParam",
    "ToolUseBlock",
    "ToolUseBlockParam",
    "Usage",
    "parse_body",
]

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]
"""Why a message ended (the values this server sends; Anthropic defines a few more)."""
ErrorType = Literal[
    "invalid_request_error",
    "authentication_error",
    "billing_error",
    "permission_error",
    "not_found_error",
    "request_too_large",
    "rate_limit_error",
    "timeout_error",
    "api_error",
    "overloaded_error",
]
"""Anthropic's error types."""

UNSUPPORTED: Mapping[str, str] = {
    "thinking": "extended thinking is not supported by this model; leave thinking unset",
    "cache_control": "prompt caching is not supported by this server; remove cache_control",
    "citations": "citations are not supported by this server; remove citations",
    "container": "containers (code execution) are not supported by this server; leave container unset",
    "mcp_servers": "MCP servers are not supported by this server; call the tools yourself as custom tools",
    "output_config": "output_config is not supported by this server; leave it unset",
    "service_tier": "this server has one service tier: send 'auto' or 'standard_only', or leave it unset",
    "speed": "this server has one speed: send 'standard', or leave speed unset",
    "top_k": "top_k is not supported by this server's engine; use temperature or top_p",
    "tools.*.type": "server tools are not supported: send custom tools ({name, description, input_schema})",
}
"""Why a field is refused, by its name (or its path, indices as `*`): the refusal's message."""


# --- requests -----------------------------------------------------------------------------------------
class _Request(BaseModel):
    """A request body's part: unknown keys are refused, as Anthropic's API refuses them."""

    model_config = ConfigDict(extra="forbid")


class TextBlockParam(_Request):
    """A text block of a message, of `system`, or of a tool result."""

    type: Literal["text"]
    text: str
    cache_control: None = None
    citations: None = None


class ToolUseBlockParam(_Request):
    """A tool call the model made earlier (in an assistant message)."""

    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    cache_control: None = None


class ToolResultBlockParam(_Request):
    """The result of a tool call (in a user message); `is_error` tells the model the call failed."""

    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlockParam] = ""
    is_error: bool = False
    cache_control: None = None


_BLOCK_TAGS = {
    "text": "TextBlockParam",
    "tool_use": "ToolUseBlockParam",
    "tool_result": "ToolResultBlockParam",
}


def _block_tag(block: Any) -> Any:
    # Tags are class names, which are never a field name of the wire: `parse_body` drops them from paths.
    kind = block.get("type") if isinstance(block, dict) else getattr(block, "type", None)
    return _BLOCK_TAGS.get(kind, kind) if isinstance(kind, str) else None


InputBlock = Annotated[
    Annotated[TextBlockParam, Tag("TextBlockParam")]
    | Annotated[ToolUseBlockParam, Tag("ToolUseBlockParam")]
    | Annotated[ToolResultBlockParam, Tag("ToolResultBlockParam")],
    Discriminator(_block_tag),
]
"""A block of a message's content."""


class MessageParam(_Request):
    """One turn of the conversation."""

    role: Literal["user", "assistant"]
    content: str | list[InputBlock]


class ToolParam(_Request):
    """A custom tool: a function the caller runs. `strict` constrains the call's input to the schema."""

    type: Literal["custom"] | None = None
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,128}$")
    description: str | None = None
    input_schema: dict[str, Any]
    strict: bool | None = None
    cache_control: None = None


class ToolChoice(_Request):
    """How the model may use the tools: `auto`, `any` (some tool), `tool` (the one named) or `none`."""

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _named_when_tool(self) -> ToolChoice:
        if (self.type == "tool") != (self.name is not None):
            raise ValueError("name is required with type 'tool', and only there")
        return self


class Metadata(_Request):
    """Request metadata: `user_id` is accepted and not used."""

    user_id: str | None = None


class CountTokensRequest(_Request):
    """`POST /v1/messages/count_tokens`: the conversation whose prompt is counted."""

    model: str
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[TextBlockParam] | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoice | None = None
    thinking: None = None
    cache_control: None = None
    output_config: None = None
    mcp_servers: None = None
    speed: Literal["standard"] | None = None


class MessagesRequest(CountTokensRequest):
    """`POST /v1/messages`."""

    max_tokens: int = Field(ge=1)
    stream: bool = False
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: None = None
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
    container: None = None


# --- answers ------------------------------------------------------------------------------------------
class TextBlock(BaseModel):
    """Text the model wrote."""

    type: Literal["text"] = "text"
    text: str


class ToolUseBlock(BaseModel):
    """A tool call the model made; `id` starts with `toolu_`."""

    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


ContentBlock = Annotated[TextBlock | ToolUseBlock, Field(discriminator="type")]
"""A block of the answer's content."""


class Usage(BaseModel):
    """Token counts of the prompt and the answer."""

    input_tokens: int
    output_tokens: int


class Message(BaseModel):
    """The answer (`stop_reason` is null only in `message_start`), with our token-level extras."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[ContentBlock]
    stop_reason: StopReason | None
    stop_sequence: str | None
    usage: Usage
    prompt_token_ids: list[int]
    # Absent from `message_start` (nothing is sampled yet): its `message_delta` carries them.
    token_ids: list[int] | None = Field(default=None, exclude_if=lambda value: value is None)
    token_logprobs: list[float] | None = Field(default=None, exclude_if=lambda value: value is None)
    weight_version: int | str | None = None


class TokenCount(BaseModel):
    """The answer of `count_tokens`."""

    input_tokens: int


class MessageStartEvent(BaseModel):
    """A stream's first event: the message with no content yet."""

    type: Literal["message_start"] = "message_start"
    message: Message


class ContentBlockStartEvent(BaseModel):
    """A content block opens (a text block with empty text, a tool_use block with empty input)."""

    type: Literal["content_block_start"] = "content_block_start"
    index: int
    content_block: ContentBlock


class TextDelta(BaseModel):
    """More text of a text block."""

    type: Literal["text_delta"] = "text_delta"
    text: str


class InputJSONDelta(BaseModel):
    """More of a tool_use block's input, as a piece of its JSON text."""

    type: Literal["input_json_delta"] = "input_json_delta"
    partial_json: str


class ContentBlockDeltaEvent(BaseModel):
    """A content block grows."""

    type: Literal["content_block_delta"] = "content_block_delta"
    index: int
    delta: Annotated[TextDelta | InputJSONDelta, Field(discriminator="type")]


class ContentBlockStopEvent(BaseModel):
    """A content block is complete."""

    type: Literal["content_block_stop"] = "content_block_stop"
    index: int


class MessageDelta(BaseModel):
    """How the message ended."""

    stop_reason: StopReason
    stop_sequence: str | None


class MessageDeltaUsage(BaseModel):
    """The tokens the answer took (cumulative)."""

    output_tokens: int


class MessageDeltaEvent(BaseModel):
    """The message ended: why, its usage, and our token-level extras for the whole message."""

    type: Literal["message_delta"] = "message_delta"
    delta: MessageDelta
    usage: MessageDeltaUsage
    prompt_token_ids: list[int]
    token_ids: list[int]
    token_logprobs: list[float]
    weight_version: int | str | None = None


class MessageStopEvent(BaseModel):
    """A stream's last event."""

    type: Literal["message_stop"] = "message_stop"


class PingEvent(BaseModel):
    """Keeps a connection alive; clients skip it."""

    type: Literal["ping"] = "ping"


class ErrorDetail(BaseModel):
    """What went wrong."""

    type: ErrorType
    message: str


class ErrorResponse(BaseModel):
    """A refusal's body, and the `error` event of a stream that failed after it started."""

    type: Literal["error"] = "error"
    error: ErrorDetail


StreamEvent = Annotated[
    MessageStartEvent
    | ContentBlockStartEvent
    | ContentBlockDeltaEvent
    | ContentBlockStopEvent
    | MessageDeltaEvent
    | MessageStopEvent
    | PingEvent
    | ErrorResponse,
    Field(discriminator="type"),
]
"""One server-sent event of a stream (its SSE `event:` name is its `type`)."""


# --- reading a body -----------------------------------------------------------------------------------
_TYPE_LABELS = frozenset({"str", "int", "float", "bool", "none", "list", "dict"})
_RequestT = TypeVar("_RequestT", bound=BaseModel)


def parse_body(model: type[_RequestT], body: Any) -> _RequestT:
    """`body` (a JSON value) validated as `model`; a `MessagesInputError` naming the field otherwise.

    Of pydantic's complaints the one deepest in the body is told (a bad block, not "content is not a
    string"), as `path: reason`, the way Anthropic's API words them; refused fields say why (`UNSUPPORTED`).
    """
    if not isinstance(body, dict):
        raise MessagesInputError("The request body must be a JSON object.", None)
    try:
        return model.model_validate(body)
    except ValidationError as error:
        found = [(_path(issue["loc"]), issue) for issue in error.errors()]
        path, _ = max(found, key=lambda pair: len(pair[0]))
        reasons = dict.fromkeys(_reason(issue, path) for where, issue in found if where == path)
        param = ".".join(str(part) for part in path) or None
        raise MessagesInputError(f"{param or 'body'}: {' or '.join(reasons)}", param) from None


def _path(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """Pydantic's location without its union labels (`str`, `list[...]`, block tags): a path in the body."""
    return tuple(
        part
        for part in loc
        if isinstance(part, int) or (part.isidentifier() and part.islower() and part not in _TYPE_LABELS)
    )


def _reason(issue: Any, path: tuple[int | str, ...]) -> str:
    pattern = ".".join("*" if isinstance(part, int) else part for part in path)
    field = next((part for part in reversed(path) if isinstance(part, str)), "")
    refused = UNSUPPORTED.get(pattern) or UNSUPPORTED.get(field)
    if refused is not None:
        return refused
    if issue["type"] == "union_tag_invalid":
        return (
            f"blocks of type {issue['ctx']['tag']!r} are not supported by this server; it reads text, "
            "tool_use and tool_result blocks"
        )
    if issue["type"] == "union_tag_not_found":
        return "a content block needs a string `type`"
    message: str = issue["msg"]
    return message.removeprefix("Value error, ")
