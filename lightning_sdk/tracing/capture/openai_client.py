"""Reversible instrumentation of the `openai` client: every chat or text completion made inside an
episode is recorded as `LLMCall`s.

We patch the one method every openai request goes through, `SyncAPIClient.request` and
`AsyncAPIClient.request`, rather than `chat.completions.create`: that way `create`, `parse`,
`with_raw_response` (which LangChain uses), `with_streaming_response` and the `.stream()` helpers are
all recorded, even when a wrapper captured the `create` method before we patched it. Requests to
other endpoints, and every request made outside an episode and outside a rollout, pass straight through
after two ContextVar lookups. The request is never altered, except by the router a rollout sets (see
`lightning_sdk.tracing.routing`): we read it, and wrap what the client returns.
"""

from __future__ import annotations

import functools
import time
from typing import Any

from lightning_sdk.tracing.capture.openai_calls import calls_from_response, request_record
from lightning_sdk.tracing.capture.openai_responses import calls_from_responses_api, responses_request_record
from lightning_sdk.tracing.capture.patch import CallRecording, ClientPatch, base_url_text
from lightning_sdk.tracing.capture.route_options import route_options
from lightning_sdk.tracing.capture.streams import tap_async_stream, tap_stream
from lightning_sdk.tracing.context import current_call_attributes
from lightning_sdk.tracing.episode import Episode
from lightning_sdk.tracing.errors import never_break_the_agent
from lightning_sdk.tracing.routing import Router

__all__ = [
    "ensure_openai_instrumented",
    "instrument_openai",
    "is_openai_instrumented",
    "set_auto_instrument",
    "uninstrument_openai",
]

SUPPORTED_OPENAI = ((1, 40), (4, 0))
"""openai versions the capture is tested with: at least the first, below the second."""


def instrument_openai() -> bool:
    """Record openai chat and text completions made inside episodes. Idempotent.

    Returns True when this call installed the instrumentation, False when it was already installed.
    `@trace_agent` calls this at an agent's first call (unless `configure(instrument_openai=False)`).
    """
    return PATCH.install()


def uninstrument_openai() -> bool:
    """Restore openai's original methods. Idempotent.

    Traced agents do not switch capture back on afterwards, until `instrument_openai()` or
    `configure(instrument_openai=True)` is called. Returns True when something was restored.
    """
    return PATCH.uninstall()


def is_openai_instrumented() -> bool:
    """True while openai calls are being recorded."""
    return bool(PATCH.originals)


def set_auto_instrument(enabled: bool) -> None:
    """Whether traced agents switch capture on at their first call (see `configure`)."""
    PATCH.auto = enabled


def ensure_openai_instrumented() -> None:
    """Called by traced agents: instrument once, unless the user turned automatic capture off."""
    if PATCH.auto and not PATCH.originals:
        with never_break_the_agent("instrumenting openai"):
            instrument_openai()


@functools.cache
def _openai_types() -> tuple[type, type, tuple[type, ...]]:
    """openai's stream classes and raw-response classes (imported once, off the import path)."""
    from openai import AsyncStream, Stream
    from openai._legacy_response import LegacyAPIResponse
    from openai._response import BaseAPIResponse

    return Stream, AsyncStream, (LegacyAPIResponse, BaseAPIResponse)


def _endpoint_kind(options: object) -> str | None:
    """`"chat"`, `"completion"`, `"responses"` or None (an endpoint we do not record)."""
    if getattr(options, "method", "").lower() != "post":
        return None
    url = str(getattr(options, "url", ""))
    if url.endswith("/chat/completions"):
        return "chat"
    if url.endswith("/responses"):
        return "responses"
    return "completion" if url.endswith("/completions") else None


def _options_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return kwargs["options"] if "options" in kwargs else (args[1] if len(args) > 1 else None)


def _start(
    client: object,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    episode: Episode | None,
    router: Router | None,
) -> tuple[tuple[Any, ...], dict[str, Any], _Recording | None]:
    """The request's arguments as the router sends them, and its recording (None: not recorded)."""
    with never_break_the_agent("reading an openai request"):
        options = _options_of(args, kwargs)
        kind = _endpoint_kind(options)
        if kind is None:
            return args, kwargs, None
        base_url = base_url_text(client)
        attributes = current_call_attributes()
        adapter = None
        if router is not None:
            agent = attributes.get("agent_name") or (episode.name if episode is not None else None)
            _, base_url, adapter = route_options(router, client, options, kind, base_url, agent)
        if episode is None:
            return args, kwargs, None
        return args, kwargs, _Recording(kind, options, base_url, episode, attributes, adapter)
    return args, kwargs, None


class _Recording(CallRecording):
    """One openai request's recording (see `CallRecording`)."""

    client_name = "an openai"

    def __init__(
        self,
        kind: str,
        options: Any,
        base_url: str,
        episode: Episode,
        attributes: dict[str, Any],
        adapter: str | None = None,
    ) -> None:
        body = dict(options.json_data or {})
        body.update(getattr(options, "extra_json", None) or {})  # extra_body= values are sent too
        if kind == "responses":
            template = responses_request_record(body, base_url, time.time())
        else:
            template = request_record(kind, body, base_url, time.time())
        template.adapter = adapter
        super().__init__(template, episode, attributes)
        self.prompts = body.get("prompt")

    def handle_result(self, result: object) -> None:
        stream, async_stream, raw_responses = _openai_types()
        if isinstance(result, stream):
            tap_stream(result, self)
        elif isinstance(result, async_stream):
            tap_async_stream(result, self)
        elif isinstance(result, raw_responses):
            self.wrap_parse(result)
        elif hasattr(result, "choices"):
            self.record(calls_from_response(self.template, result, self.prompts))
        elif getattr(result, "object", None) == "response":
            self.record(calls_from_responses_api(self.template, result))

    def readable(self, result: object) -> bool:
        stream, async_stream, _ = _openai_types()
        answer = hasattr(result, "choices") or getattr(result, "object", None) == "response"
        return isinstance(result, stream | async_stream) or answer


PATCH = ClientPatch("openai", _start, SUPPORTED_OPENAI)
"""The openai client's capture (installed by `instrument_openai`)."""
