"""What every route of the app shares: the engine, the served name, the key check, request parsing,
sampling parameters, and the chat preparation the chat and Responses routes have in common."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import Request

from lightning_sdk.engine.types import (
    Engine,
    EngineError,
    PromptTooLongError,
    SamplingParams,
    check_prompt_fits,
)
from lightning_sdk.serving.chat.schemas import (
    ChatRequest,
    CompletionRequest,
    parse_request,
    requested_top_logprobs,
    sampling_params,
)
from lightning_sdk.serving.chat.template import longest_token_chars, render_chat, tool_choice_prefix
from lightning_sdk.serving.errors import APIError
from lightning_sdk.serving.keys import model_key, offered_keys, offers
from lightning_sdk.serving.limits import RequestLimits, read_json_body
from lightning_sdk.serving.options import SamplingPolicy
from lightning_sdk.serving.tools.calls import ParsedOutput, ToolTextFilter, validate_tools
from lightning_sdk.serving.tools.grammar import tool_grammar
from lightning_sdk.serving.tools.parsers import HERMES, HermesParser, ToolCallParser
from lightning_sdk.tracing.routing import ROLE_HEADER

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["MODEL_ALIASES", "PreparedChat", "ServingContext", "run_engine"]

log = logging.getLogger(__name__)
MODEL_ALIASES = ("default",)
"""Model names accepted besides the served name (many agent examples send `model="default"`)."""


@dataclass
class PreparedChat:
    """A chat request ready for the engine: prompt ids, the active tools and the sampling parameters."""

    prompt: list[int]
    tools: list[dict[str, Any]]
    prefix: str
    """Text forced at the start of the answer (a required tool call), already in the prompt."""
    params: SamplingParams
    want_logprobs: bool
    top: int
    parser: ToolCallParser = field(default_factory=HermesParser)
    """How the completion's tool calls are read (the server's `tool_parser`)."""

    def parse(self, text: str) -> ParsedOutput:
        """The completion's text split into content and tool calls."""
        return self.parser.parse(self.prefix + text, self.tools) if self.tools else ParsedOutput(text, [])

    def text_filter(self) -> ToolTextFilter:
        """A stream's filter that holds back tool calls, already fed the forced opening of a call."""
        text_filter = ToolTextFilter(lambda text: self.parser.parse(text, self.tools), self.parser.marker)
        text_filter.feed(self.prefix)
        return text_filter


@dataclass
class ServingContext:
    """The app's shared state and the steps every route takes."""

    engine: Engine
    api_key: str | None = field(repr=False)
    served: str
    default_max_tokens: int | None = None
    policy: SamplingPolicy = field(default_factory=SamplingPolicy)
    tool_parser: ToolCallParser = field(default_factory=HermesParser)
    roles: set[str] = field(default_factory=set)
    """Roles with an adapter of their own on this server: a request names one in the `ROLE_HEADER`
    header or as its `model`. Shared by the per-request copies (`for_request`), so an owner may add to it."""
    adapter: str | None = None
    """The role whose adapter answers the request at hand (set on a per-request copy)."""
    lane: str | None = None
    """The sampling lane the request at hand names (`LANE_HEADER`; set on a per-request copy)."""
    limits: RequestLimits = field(default_factory=RequestLimits)
    """What one request may ask (`lightning_sdk.serving.limits`)."""

    def for_request(self, role_header: str | None, body: Any, lane: str | None = None) -> ServingContext:
        """The context for one request: this one, or a copy that names the role whose adapter answers it
        (the role header, else a `model` that is a role's name; a role this server lacks is a 400) and the
        sampling `lane` it names (the `LANE_HEADER` header)."""
        if lane is not None:
            return dataclasses.replace(self, lane=lane).for_request(role_header, body)
        if role_header is not None:
            if role_header not in self.roles:
                served = ", ".join(sorted(self.roles)) or "none"
                raise APIError.bad_request(
                    f"Role {role_header!r} (header {ROLE_HEADER}) has no adapter on this server; its roles "
                    f"are: {served}.",
                    code="role_not_found",
                )
            return dataclasses.replace(self, adapter=role_header)
        model = body.get("model") if isinstance(body, dict) else None
        if isinstance(model, str) and model in self.roles:
            return dataclasses.replace(self, adapter=model)
        return self

    def answering_version(self, params: SamplingParams) -> Any:
        """The weights version that answers a request of `params`: a pinned adapter's own (an evaluation
        of an earlier step), else the engine's; read once the first tokens came (see `RequestGate`)."""
        version_for = getattr(self.engine, "weight_version_for", None)
        return version_for(params.adapter) if version_for is not None else self.engine.weight_version

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self.engine.tokenizer

    @property
    def max_prompt_chars(self) -> int:
        """Characters beyond which no prompt fits the context (`template.longest_token_chars`)."""
        return self.engine.max_model_len * longest_token_chars(self.tokenizer)

    def authorize(self, request: Request, *, owner: bool = False) -> None:
        """Raise unless the request carries a key: as a bearer token (OpenAI clients) or in `x-api-key`
        (Anthropic's clients). Model routes take the server's key or its model key (`serving/keys.py`);
        `owner=True` routes (the runner protocol) take the server's own key only: a model key there is a
        403, so an agent's tools cannot lease or upload with the key the agent was handed."""
        if self.api_key is None:
            return
        offered = offered_keys(request.headers.get("authorization", ""), request.headers.getlist("x-api-key"))
        if offers(offered, self.api_key):
            return
        if offers(offered, model_key(self.api_key)):
            if not owner:
                return
            raise APIError(
                403,
                "This key opens model calls only (it is the key a runner hands its agent); this route is the "
                "runner protocol's and needs the run's key (RUN_DIR/runner.key).",
                type="permission_error",
                code="model_key_only",
            )
        raise APIError.unauthorized(
            "Missing or incorrect API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'."
        )

    async def read_json(self, request: Request) -> Any:
        """The authorized request's JSON body, within the app's limits (`limits.read_json_body`)."""
        self.authorize(request)
        return await read_json_body(request)

    def parse(self, body: Any, cls: type) -> Any:
        """A JSON body validated as `cls`, for a model this server serves."""
        parsed = parse_request(cls, body)
        self.check_model(parsed.model)
        return parsed

    def check_model(self, model: str) -> None:
        """A 404 unless this server serves `model` (its name, an alias, a role, or any with the policy's
        `accept_any_model`)."""
        if (
            model != self.served
            and model not in MODEL_ALIASES
            and model not in self.roles
            and not self.policy.accept_any_model
        ):
            raise APIError.model_not_found(model, self.served, self.roles)

    def params_for(
        self,
        request: ChatRequest | CompletionRequest,
        prompt_len: int,
        top: int,
        asked: int | None,
        prompts: int = 1,
    ) -> SamplingParams:
        """The engine's sampling parameters for a request of `prompts` prompts, the longest `prompt_len`
        tokens long; a 400 when it would start more sequences than `limits.max_sequences`."""
        self.limits.check_sequences(prompts, request.n)
        engine = self.engine
        max_tokens = asked if asked is not None else max(1, engine.max_model_len - prompt_len)
        if asked is None and self.default_max_tokens is not None:
            max_tokens = min(max_tokens, self.default_max_tokens)
        asked_params = sampling_params(request, max_tokens, top, getattr(engine, "max_n", 16))
        policy = self.policy.for_lane(self.lane)
        params = policy.apply(asked_params)
        adapter = policy.adapter_for(self.adapter)
        if adapter is not None:
            params = dataclasses.replace(params, adapter=adapter)
        try:
            check_prompt_fits(prompt_len, params.max_tokens, engine.max_model_len)
        except PromptTooLongError as error:
            raise APIError.bad_request(str(error), param="messages", code="context_length_exceeded") from None
        except ValueError as error:
            raise APIError.bad_request(str(error), param="prompt") from None
        return params

    def render_prompt(self, req: ChatRequest) -> tuple[list[int], list[dict[str, Any]], str]:
        """A chat request's prompt token ids, the tools the model is told about, and the forced opening
        of a call (already at the end of the prompt)."""
        tools = validate_tools(req.tools)  # checked even when tool_choice="none", as OpenAI does
        if self.tool_parser.name != HERMES and tools and req.tool_choice not in (None, "auto", "none"):
            raise APIError.bad_request(
                f"tool_choice={req.tool_choice!r} needs the server's default tool format (hermes); this "
                f"server reads {self.tool_parser.name!r} calls. Send tool_choice 'auto' or 'none'.",
                param="tool_choice",
            )
        prefix = tool_choice_prefix(req.tool_choice, tools)
        if req.tool_choice == "none":
            tools = []  # the model is not told about them, so it cannot call one
        prompt = render_chat(self.tokenizer, req.messages, tools, prefix, self.max_prompt_chars)
        return prompt, tools, prefix

    def prepare_chat(self, req: ChatRequest) -> PreparedChat:
        prompt, tools, prefix = self.render_prompt(req)
        hermes = self.tool_parser.name == HERMES
        want_logprobs, top = requested_top_logprobs(req)
        limit = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        params = self.params_for(req, len(prompt), top, limit)
        if hermes:  # the grammar of strict tools writes the Hermes format
            params = self._constrain_tool_calls(params, tools, req)
        return PreparedChat(prompt, tools, prefix, params, want_logprobs, top, self.tool_parser)

    def _constrain_tool_calls(
        self, params: SamplingParams, tools: list[dict[str, Any]], req: ChatRequest
    ) -> SamplingParams:
        """`params` with the grammar of strict and forced tool calls (`lightning_sdk.serving.tools.grammar`),
        which also lets a call through next to a JSON `response_format`. An engine that cannot constrain
        decoding serves the calls as the model writes them: `strict` is a promise it cannot keep, but refusing
        would break every Agents SDK tool (strict by default)."""
        if not getattr(self.engine, "structured_outputs", False):
            return params
        content = dict(params.json_schema) if params.json_schema is not None else None
        if params.json_object:
            content = {"type": "object"}
        grammar = tool_grammar(tools, req.tool_choice, content, parallel=bool(req.parallel_tool_calls))
        if grammar is None:
            return params
        return dataclasses.replace(params, json_schema=None, json_object=False, grammar=grammar)


async def run_engine(awaitable: Any) -> Any:
    """Await an engine call, mapping its failures to OpenAI errors (400 for bad input, 500 otherwise)."""
    try:
        return await awaitable
    except APIError:
        raise
    except PromptTooLongError as error:
        raise APIError.bad_request(str(error), param="messages", code="context_length_exceeded") from None
    except StopAsyncIteration:
        raise APIError.server_error("The engine returned no output for this request.") from None
    except EngineError as error:
        raise APIError.server_error(str(error)) from None
    except ValueError as error:
        raise APIError.bad_request(str(error)) from None
    except Exception as error:
        log.exception("engine call failed")
        raise APIError.server_error(f"The engine failed: {error}") from None
