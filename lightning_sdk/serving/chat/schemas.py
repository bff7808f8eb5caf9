"""Request bodies of the OpenAI-compatible API, validated into plain objects and `SamplingParams`.

Unknown fields are accepted and ignored, as OpenAI clients send many optional ones (`user`,
`metadata`, ...). Fields that would change the output in a way this server cannot honour are
rejected with a 400 instead of being silently ignored.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lightning_sdk.engine.types import MAX_TOP_LOGPROBS, SamplingParams
from lightning_sdk.serving.errors import APIError

__all__ = [
    "ChatRequest",
    "CompletionRequest",
    "parse_request",
    "requested_top_logprobs",
    "response_constraint",
    "sampling_params",
]


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None

    @property
    def include_usage(self) -> bool:
        """Whether a streamed response ends with a usage chunk."""
        return bool(self.stream_options and self.stream_options.get("include_usage"))


class ChatRequest(_Request):
    """`POST /v1/chat/completions`."""

    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None


class CompletionRequest(_Request):
    """`POST /v1/completions`."""

    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


def parse_request(cls: type[_Request], body: Any) -> Any:
    """Validate a JSON body, turning pydantic's complaint into a 400 that names the field."""
    if not isinstance(body, dict):
        raise APIError.bad_request("The request body must be a JSON object.", code="invalid_json")
    try:
        request = cls.model_validate(body)
    except ValidationError as error:
        first = error.errors()[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        raise APIError.bad_request(f"Invalid request: {param}: {first['msg']}.", param=param) from None
    _reject_unsupported(request)
    return request


def _reject_unsupported(request: _Request) -> None:
    if isinstance(request, ChatRequest):
        response_constraint(request.response_format)  # raises on a format this server cannot honour
        if request.top_logprobs and not request.logprobs:
            raise APIError.bad_request("top_logprobs requires logprobs=true.", param="top_logprobs")
    if isinstance(request, CompletionRequest):
        if request.echo:
            raise APIError.bad_request("echo=true is not supported.", param="echo")
        if request.suffix:
            raise APIError.bad_request("suffix is not supported.", param="suffix")
        if request.best_of not in (None, request.n):
            raise APIError.bad_request("best_of is not supported; use n.", param="best_of")


def response_constraint(response_format: dict[str, Any] | None) -> tuple[dict[str, Any] | None, bool]:
    """`(json_schema, json_object)` for a chat `response_format`: `text` (or none) constrains nothing,
    `json_object` asks for any JSON object, `json_schema` for JSON valid against `json_schema.schema`."""
    fmt = (response_format or {}).get("type", "text")
    if fmt == "text":
        return None, False
    if fmt == "json_object":
        return None, True
    if fmt == "json_schema":
        spec = response_format.get("json_schema") if response_format else None
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise APIError.bad_request(
                "response_format type 'json_schema' needs json_schema.schema, a JSON schema object.",
                param="response_format.json_schema.schema",
            )
        return schema, False
    raise APIError.bad_request(
        f"response_format type {fmt!r} is not supported; use 'text', 'json_object' or 'json_schema'.",
        param="response_format",
    )


def sampling_params(
    request: ChatRequest | CompletionRequest, max_tokens: int, top_logprobs: int, max_n: int
) -> SamplingParams:
    """The engine's sampling parameters for a request; bad values become a 400 naming the field."""
    stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    json_schema, json_object = (
        response_constraint(request.response_format) if isinstance(request, ChatRequest) else (None, False)
    )
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if request.temperature is None else request.temperature,
            top_p=1.0 if request.top_p is None else request.top_p,
            n=request.n,
            stop=tuple(stop),
            seed=request.seed,
            top_logprobs=top_logprobs,
            presence_penalty=request.presence_penalty or 0.0,
            frequency_penalty=request.frequency_penalty or 0.0,
            json_schema=json_schema,
            json_object=json_object,
            max_n=max_n,
        )
    except ValueError as error:
        param = str(error).split("=", 1)[0].removeprefix("Invalid ")
        raise APIError.bad_request(str(error), param=param) from None


def requested_top_logprobs(request: ChatRequest | CompletionRequest) -> tuple[bool, int]:
    """Whether standard `logprobs` go in the response, and how many alternatives per token."""
    if isinstance(request, ChatRequest):
        count = request.top_logprobs or 0
        if not 0 <= count <= MAX_TOP_LOGPROBS:
            raise APIError.bad_request(
                f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}.", "top_logprobs"
            )
        return request.logprobs, count
    if request.logprobs is None:
        return False, 0
    if not 0 <= request.logprobs <= 5:
        raise APIError.bad_request("logprobs must be between 0 and 5 for completions.", param="logprobs")
    return True, request.logprobs
