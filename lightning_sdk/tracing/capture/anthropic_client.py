"""Reversible instrumentation of the `anthropic` client: every Messages API call made inside an episode is
recorded as an `LLMCall`, like an openai chat call.

The anthropic client is generated from the same template as openai's, so the capture patches the same
place (`SyncAPIClient.request` and `AsyncAPIClient.request` of `anthropic._base_client`, through
`lightning_sdk.tracing.capture.patch`): `messages.create` (whole or `stream=True`), `messages.stream()`,
`with_raw_response` and `with_streaming_response` are all recorded, on `Anthropic` and `AsyncAnthropic`
alike. Only `POST .../v1/messages` is recorded (`count_tokens`, batches and the rest pass through).

The call's `base_url` is recorded as the API root the path hangs from (the client's base URL and `/v1`),
the same form as an openai call's, so a call to our endpoint is recognised as one (and trained) whichever
client made it. During a rollout the router sends calls of clients built elsewhere (at import time, against
Anthropic's API) to the policy's endpoint, as it does openai's (`lightning_sdk.tracing.routing`).
"""

from __future__ import annotations

import functools
import sys
import time
from typing import Any

from lightning_sdk.tracing.capture.anthropic_calls import calls_from_message, messages_request_record
from lightning_sdk.tracing.capture.patch import CallRecording, ClientPatch, base_url_text
from lightning_sdk.tracing.capture.route_options import route_options
from lightning_sdk.tracing.capture.streams import tap_async_stream, tap_stream
from lightning_sdk.tracing.context import current_call_attributes
from lightning_sdk.tracing.episode import Episode
from lightning_sdk.tracing.errors import never_break_the_agent
from lightning_sdk.tracing.routing import Router

__all__ = [
    "ensure_anthropic_instrumented",
    "instrument_anthropic",
    "is_anthropic_instrumented",
    "set_auto_instrument",
    "uninstrument_anthropic",
]

SUPPORTED_ANTHROPIC = ((0, 40), (3, 0))
"""anthropic versions the capture is tested with: at least the first, below the second."""
MESSAGES_PATH = "/messages"


def instrument_anthropic() -> bool:
    """Record `anthropic` Messages API calls made inside episodes. Idempotent.

    Returns True when this call installed the instrumentation, False when it was already installed.
    `@trace_agent` calls this at an agent's call once the process has imported `anthropic` (unless
    `configure(instrument_openai=False)`, which stops automatic capture of both clients).

    Raises:
        ImportError: when `anthropic` is not installed.
    """
    return PATCH.install()


def uninstrument_anthropic() -> bool:
    """Restore anthropic's original methods. Idempotent; True when something was restored. Traced agents
    do not switch capture back on afterwards, until `instrument_anthropic()` is called."""
    return PATCH.uninstall()


def is_anthropic_instrumented() -> bool:
    """True while anthropic calls are being recorded."""
    return bool(PATCH.originals)


def set_auto_instrument(enabled: bool) -> None:
    """Whether traced agents switch capture on at their first call (see `configure`)."""
    PATCH.auto = enabled


def ensure_anthropic_instrumented() -> None:
    """Called by traced agents at each call: instrument once the agent's process has imported
    `anthropic` (a process that never did makes no anthropic call, and does not pay for the import),
    unless turned off. An agent that imports it only inside its first call is recorded from its second
    call on; `instrument_anthropic()` at start-up records the first one too."""
    if PATCH.auto and not PATCH.originals and "anthropic" in sys.modules:
        with never_break_the_agent("instrumenting anthropic"):
            instrument_anthropic()


@functools.cache
def _anthropic_types() -> tuple[type, type, tuple[type, ...], type, tuple[type, ...]]:
    """anthropic's stream, raw-response and message classes, and its markers of an argument not given
    (imported once, off the import path)."""
    import importlib

    from anthropic import AsyncStream, NotGiven, Omit, Stream
    from anthropic._response import BaseAPIResponse
    from anthropic.types import Message

    raw: tuple[type, ...] = (BaseAPIResponse,)
    try:  # releases before 2 also have the legacy `with_raw_response` class
        raw += (importlib.import_module("anthropic._legacy_response").LegacyAPIResponse,)
    except ImportError:
        pass
    return Stream, AsyncStream, raw, Message, (Omit, NotGiven)


def _omit() -> Any:
    """anthropic's marker that removes a header the client would otherwise send."""
    from anthropic import Omit

    return Omit()


def messages_path(options: object) -> str | None:
    """The request's URL when it is a Messages call (`POST .../messages`), else None."""
    if getattr(options, "method", "").lower() != "post":
        return None
    url = str(getattr(options, "url", "")).partition("?")[0]  # the beta client adds `?beta=true`
    return url if url.endswith(MESSAGES_PATH) else None


def recorded_base_url(client_base_url: str, url: str) -> str:
    """The API root a Messages call was made to: `http://host/v1` for the client's `http://host` and the
    path `/v1/messages` (an absolute URL, as a routed request has, stands on its own)."""
    full = url if "://" in url else client_base_url.rstrip("/") + "/" + url.lstrip("/")
    return full[: -len(MESSAGES_PATH)]


def _start(
    client: object,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    episode: Episode | None,
    router: Router | None,
) -> tuple[tuple[Any, ...], dict[str, Any], _Recording | None]:
    """The request's arguments as the router sends them, and its recording (None: not recorded)."""
    with never_break_the_agent("reading an anthropic request"):
        options = kwargs["options"] if "options" in kwargs else (args[1] if len(args) > 1 else None)
        url = messages_path(options)
        if url is None:
            return args, kwargs, None
        base_url = recorded_base_url(base_url_text(client), url)
        attributes = current_call_attributes()
        adapter = None
        if router is not None:
            agent = attributes.get("agent_name") or (episode.name if episode is not None else None)
            _, base_url, adapter = route_options(router, client, options, "messages", base_url, agent, _omit)
        if episode is None:
            return args, kwargs, None
        return args, kwargs, _Recording(options, base_url, episode, attributes, adapter)
    return args, kwargs, None


class _Recording(CallRecording):
    """One anthropic request's recording (see `CallRecording`)."""

    client_name = "an anthropic"

    def __init__(
        self, options: Any, base_url: str, episode: Episode, attributes: dict[str, Any], adapter: str | None
    ) -> None:
        # The client leaves a marker (`omit`) for every argument not given: its request drops them, and
        # so does the record.
        unset = _anthropic_types()[4]
        sent = (options.json_data or {}).items()
        body = {key: value for key, value in sent if not isinstance(value, unset)}
        body.update(getattr(options, "extra_json", None) or {})  # extra_body= values are sent too
        template = messages_request_record(body, base_url, time.time())
        template.adapter = adapter
        super().__init__(template, episode, attributes)

    def handle_result(self, result: object) -> None:
        stream, async_stream, raw_responses, message, _ = _anthropic_types()
        if isinstance(result, stream):
            tap_stream(result, self)
        elif isinstance(result, async_stream):
            tap_async_stream(result, self)
        elif isinstance(result, raw_responses):
            self.wrap_parse(result)
        elif isinstance(result, message):
            self.record(calls_from_message(self.template, result))

    def readable(self, result: object) -> bool:
        stream, async_stream, _, message, _ = _anthropic_types()
        return isinstance(result, stream | async_stream | message)


PATCH = ClientPatch("anthropic", _start, SUPPORTED_ANTHROPIC)
"""The anthropic client's capture (installed by `instrument_anthropic`)."""
