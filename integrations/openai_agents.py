"""OpenAI Agents SDK (`openai-agents`): attribute each model call to the `Agent` that made it, handoffs
and agents-as-tools included.

    from lightning_sdk.integrations.openai_agents import instrument_openai_agents
    instrument_openai_agents()

The integration is a tracing processor. The SDK opens an agent span for the agent whose turn it is and,
inside it, a generation span around each Chat Completions request (`OpenAIChatCompletionsModel`) or a
response span around each Responses request (the default `OpenAIResponsesModel`). When a
generation span starts, the processor opens a `call_attributes` scope in the model's context that links
the calls recorded inside it to the span; the openai capture records the request there, with the token
ids. When the span ends, the processor names the linked call after the nearest enclosing agent span, or,
when there is none (openai capture off, or a model that does not use the `openai` client), records the
call from the span's data (`source="openai_agents"`, no token ids).

Attribution does not depend on the SDK's trace export setting: with tracing switched off
(`set_tracing_disabled(True)`, `OPENAI_AGENTS_DISABLE_TRACING=1`, `RunConfig(tracing_disabled=True)`),
the spans are still made, for this processor only, and nothing is exported (`_agents_local_spans`).
A model call that runs outside any agent span cannot be named; the first one is warned about.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import warnings
import weakref
from dataclasses import dataclass
from typing import Any

from lightning_sdk.integrations._support import CallLink, check_version, missing_framework

try:
    from agents.tracing import (
        AgentSpanData,
        GenerationSpanData,
        ResponseSpanData,
        Span,
        Trace,
        TracingProcessor,
        add_trace_processor,
        get_trace_provider,
        set_trace_provider,
    )
except ImportError as error:  # pragma: no cover - depends on the environment
    raise missing_framework("the OpenAI Agents SDK (openai-agents)", "openai-agents") from error

from lightning_sdk.integrations._agents_local_spans import LocalSpansProvider
from lightning_sdk.tracing.capture.openai_responses import calls_from_responses_api, responses_request_record
from lightning_sdk.tracing.context import (
    current_episode,
    record_call,
)
from lightning_sdk.tracing.episode import Episode, LLMCall
from lightning_sdk.tracing.errors import never_break_the_agent

__all__ = [
    "SPAN_ID_KEY",
    "instrument_openai_agents",
    "is_openai_agents_instrumented",
    "uninstrument_openai_agents",
]

SPAN_ID_KEY = "openai_agents_span_id"
"""`LLMCall.metadata` key holding the id of the SDK's generation span for the call."""

_SUPPORTED = ("openai-agents", "0.20", "1")


@dataclass
class _OpenGeneration:
    episode: Episode
    agent_name: str | None
    link: CallLink
    started_at: float


class _AgentAttribution(TracingProcessor):
    """Names the openai capture's calls after the agent span they run in (see module doc)."""

    def __init__(self) -> None:
        self.enabled = False
        self.added = False  # whether we ever registered it (for SDKs whose processor list we cannot see)
        self._parents: dict[str, str | None] = {}
        self._agent_names: dict[str, str] = {}
        self._open: dict[str, _OpenGeneration] = {}
        self.warned_unattributed = False

    def on_trace_start(self, trace: Trace) -> None:
        if self.enabled:
            with never_break_the_agent("renewing the Agents SDK's HTTP client"):
                _fresh_http_client_per_loop()

    def on_trace_end(self, trace: Trace) -> None:
        return

    def on_span_start(self, span: Span[Any]) -> None:
        if not self.enabled:
            return
        with never_break_the_agent("starting an Agents SDK span"):
            self._start(span)

    def on_span_end(self, span: Span[Any]) -> None:
        with never_break_the_agent("ending an Agents SDK span"):
            self._end(span)

    def shutdown(self) -> None:
        return

    def force_flush(self) -> None:
        return

    def close_open_generations(self) -> None:
        """Make the scopes of model calls still running inert: their spans will not reach us any more."""
        for span_id in tuple(self._open):
            generation = self._open.pop(span_id, None)
            if generation is not None:
                generation.link.close()

    def _start(self, span: Span[Any]) -> None:
        data = span.span_data
        self._parents[span.span_id] = span.parent_id
        if isinstance(data, AgentSpanData):
            self._agent_names[span.span_id] = data.name
            return
        episode = current_episode()
        model_call = isinstance(data, GenerationSpanData | ResponseSpanData)
        if not model_call or episode is None or span.span_id in self._open:
            return
        # Span start and end run in the model's own context (a `with generation_span(...)` block around
        # the request), so the scope opened here is the one the openai request is made in.
        agent_name = self._agent_of(span.parent_id)
        if agent_name is None:
            self._warn_unattributed()
        link = CallLink(SPAN_ID_KEY, span.span_id, agent_name=agent_name).open()
        self._open[span.span_id] = _OpenGeneration(episode, agent_name, link, time.time())

    def _agent_of(self, span_id: str | None) -> str | None:
        """The name of the nearest enclosing agent span (a handoff starts a new agent span)."""
        while span_id is not None:
            if span_id in self._agent_names:
                return self._agent_names[span_id]
            span_id = self._parents.get(span_id)
        return None

    def _warn_unattributed(self) -> None:
        if self.warned_unattributed:
            return
        self.warned_unattributed = True
        warnings.warn(
            "lightning-sdk: an Agents SDK model call ran outside any agent span, so it is recorded under "
            "the episode's name instead of an agent's, and per-agent training will not count it as any "
            "agent's. Run models through Runner.run/run_streamed so that each turn has its agent span.",
            RuntimeWarning,
            stacklevel=2,
        )

    def _end(self, span: Span[Any]) -> None:
        self._parents.pop(span.span_id, None)
        self._agent_names.pop(span.span_id, None)
        generation = self._open.pop(span.span_id, None)
        if generation is None:
            return
        generation.link.close()
        calls = generation.link.calls(generation.episode)
        if not calls:  # the openai capture did not see this call: record the SDK's view of it
            calls = [_call_from_span(span, generation.started_at)]
            calls[0].metadata[SPAN_ID_KEY] = span.span_id
            record_call(calls[0], episode=generation.episode, attributes=generation.link.outer)
        for call in calls:
            if generation.agent_name is not None:
                call.agent_name = generation.agent_name


def _call_from_span(span: Span[Any], started_at: float) -> LLMCall:
    """The SDK's own view of a model call the openai capture did not record (no token ids)."""
    if isinstance(span.span_data, ResponseSpanData):
        return _call_from_response_span(span, started_at)
    data: GenerationSpanData = span.span_data
    output = dict(data.output[0]) if data.output else None
    message = None
    if output is not None:
        message = {"role": "assistant", "content": output.get("content")}
        if output.get("tool_calls"):
            message["tool_calls"] = output["tool_calls"]
    usage = data.usage or {}
    error = span.error
    return LLMCall(
        source="openai_agents",
        model=data.model,
        base_url=(data.model_config or {}).get("base_url"),
        messages=[dict(item) for item in data.input] if data.input else None,
        response_message=message,
        text=message.get("content") if message else None,
        usage={"prompt_tokens": usage.get("input_tokens"), "completion_tokens": usage.get("output_tokens")}
        if usage
        else None,
        started_at=started_at,
        latency_s=time.time() - started_at,
        error=error.get("message") if error else None,
    )


def _call_from_response_span(span: Span[Any], started_at: float) -> LLMCall:
    """The SDK's view of a Responses call, in the same chat terms as the openai capture's records."""
    data: ResponseSpanData = span.span_data
    template = responses_request_record({"input": data.input}, None, started_at)
    template.source = "openai_agents"
    if data.response is None:
        error = span.error
        template.error = error.get("message") if error else "no response"
        template.latency_s = time.time() - started_at
        return template
    template.model = getattr(data.response, "model", None)
    (call,) = calls_from_responses_api(template, data.response)
    call.prompt_token_ids = call.completion_token_ids = call.logprobs = None  # the SDK's view has none
    return call


_processor = _AgentAttribution()
_lock = threading.Lock()


_loop_of_shared_client: weakref.ReferenceType[asyncio.AbstractEventLoop] | None = None


def _fresh_http_client_per_loop() -> None:
    """Give each event loop its own copy of the SDK's shared HTTP client.

    The SDK shares one httpx client among all its default models (`shared_http_client()`), and that
    client only works on the event loop it first ran on: a program that runs agents on a second loop
    (a training run after an evaluation with `asyncio.run`, a test after a test) gets "Event loop is
    closed" on every call. A run starts its trace in the loop it runs on, so this is the place to notice
    a new loop and let the SDK make a fresh client for it.
    """
    global _loop_of_shared_client
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return  # a synchronous run (Runner.run_sync) starts its own loop later; nothing shared yet
    provider = sys.modules.get("agents.models.openai_provider")
    previous = _loop_of_shared_client() if _loop_of_shared_client is not None else None
    if previous is not loop and provider is not None and getattr(provider, "_http_client", None) is not None:
        provider._http_client = None  # made again, on this loop, by the next shared_http_client()
    _loop_of_shared_client = weakref.ref(loop)


def _install_local_spans() -> None:
    """Wrap the SDK's trace provider so that spans exist, for us only, while its tracing is off."""
    provider = get_trace_provider()
    if not isinstance(provider, LocalSpansProvider):
        set_trace_provider(LocalSpansProvider(provider, _processor))


def _remove_local_spans() -> None:
    provider = get_trace_provider()
    if isinstance(provider, LocalSpansProvider):
        set_trace_provider(provider.inner)


def _registered_processors() -> tuple[Any, ...] | None:
    """The provider's processors, when this SDK version lets us see them (else None)."""
    multi = getattr(get_trace_provider(), "_multi_processor", None)
    processors = getattr(multi, "_processors", None)
    return tuple(processors) if isinstance(processors, tuple | list) else None


def instrument_openai_agents() -> bool:
    """Attribute every Agents SDK model call to its agent (and record it). Idempotent.

    Call it after any `set_trace_processors(...)`, which replaces all processors, ours included.
    Returns True when this call switched attribution on, False when it was already on.
    """
    with _lock:
        check_version(*_SUPPORTED, extra="openai-agents")
        registered = _registered_processors()
        if (_processor not in registered) if registered is not None else not _processor.added:
            add_trace_processor(_processor)
            _processor.added = True
        _install_local_spans()
        was_on, _processor.enabled = _processor.enabled, True
        return not was_on


def uninstrument_openai_agents() -> bool:
    """Stop attributing Agents SDK model calls and remove our processor. Idempotent."""
    with _lock:
        was_on, _processor.enabled = _processor.enabled, False
        _processor.close_open_generations()
        registered = _registered_processors()
        if registered is not None and _processor in registered:
            get_trace_provider().set_processors([p for p in registered if p is not _processor])
        _remove_local_spans()
        return was_on


def is_openai_agents_instrumented() -> bool:
    """True while `instrument_openai_agents()` is in effect."""
    return _processor.enabled
