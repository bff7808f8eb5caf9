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
import inspect
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any

from lightning_sdk.tracing.context import current_call_attributes, current_episode, record_call
from lightning_sdk.tracing.episode import Episode, LLMCall
from lightning_sdk.tracing.errors import never_break_the_agent
from lightning_sdk.tracing.openai_calls import calls_from_response, failed_call, request_record
from lightning_sdk.tracing.openai_responses import calls_from_responses_api, responses_request_record
from lightning_sdk.tracing.openai_routing import route_options
from lightning_sdk.tracing.openai_streams import tap_async_stream, tap_stream
from lightning_sdk.tracing.routing import Router, current_router

__all__ = [
    "ensure_openai_instrumented",
    "instrument_openai",
    "is_openai_instrumented",
    "set_auto_instrument",
    "uninstrument_openai",
]

SUPPORTED_OPENAI = ((1, 40), (4, 0))
"""openai versions the capture is tested with: at least the first, below the second."""

_lock = threading.Lock()
_originals: list[tuple[type, str, Callable[..., Any]]] = []
_auto_instrument = True


def instrument_openai() -> bool:
    """Record openai chat and text completions made inside episodes. Idempotent.

    Returns True when this call installed the instrumentation, False when it was already installed.
    `@trace_agent` calls this at an agent's first call (unless `configure(instrument_openai=False)`).
    """
    global _auto_instrument
    with _lock:
        _auto_instrument = True
        if _originals:
            return False
        import openai
        from openai import _base_client

        _warn_if_unsupported(openai.__version__)
        for owner, make_wrapper in (
            (_base_client.SyncAPIClient, _sync_request),
            (_base_client.AsyncAPIClient, _async_request),
        ):
            original = owner.__dict__.get("request")
            if original is None:
                raise RuntimeError(
                    f"openai {openai.__version__} has no {owner.__name__}.request to instrument; "
                    f"install a supported version: pip install 'openai>=1.40,<4'"
                )
            owner.request = make_wrapper(original)  # type: ignore[method-assign]  # the patch itself
            _originals.append((owner, "request", original))
        return True


def uninstrument_openai() -> bool:
    """Restore openai's original methods. Idempotent.

    Traced agents do not switch capture back on afterwards, until `instrument_openai()` or
    `configure(instrument_openai=True)` is called. Returns True when something was restored.
    """
    global _auto_instrument
    with _lock:
        _auto_instrument = False
        restored = bool(_originals)
        while _originals:
            owner, name, original = _originals.pop()
            setattr(owner, name, original)
        return restored


def is_openai_instrumented() -> bool:
    """True while openai calls are being recorded."""
    return bool(_originals)


def set_auto_instrument(enabled: bool) -> None:
    """Whether traced agents switch capture on at their first call (see `configure`)."""
    global _auto_instrument
    _auto_instrument = enabled


def ensure_openai_instrumented() -> None:
    """Called by traced agents: instrument once, unless the user turned automatic capture off."""
    if _auto_instrument and not _originals:
        with never_break_the_agent("instrumenting openai"):
            instrument_openai()


def _warn_if_unsupported(version: str) -> None:
    parts = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    low, high = SUPPORTED_OPENAI
    if not low <= parts < high:
        warnings.warn(
            f"lightning-sdk's openai capture is tested with openai >={low[0]}.{low[1]},<{high[0]}; "
            f"found {version}. Calls may go unrecorded; install a supported version "
            f"(pip install 'openai>=1.40,<4').",
            RuntimeWarning,
            stacklevel=3,
        )


_base_urls: weakref.WeakKeyDictionary[Any, tuple[Any, str]] = weakref.WeakKeyDictionary()


def _base_url_text(client: Any) -> str:
    """`str(client.base_url)` without its trailing slash, cached per client (httpx URLs print slowly)."""
    url = client.base_url
    cached = _base_urls.get(client)
    if cached is None or cached[0] is not url:
        cached = (url, str(url).rstrip("/"))
        _base_urls[client] = cached
    return cached[1]


@functools.cache
def _openai_types() -> tuple[type, type, tuple[type, ...]]:
    """openai's stream classes and raw-response classes (imported once, off the import path)."""
    from openai import AsyncStream, Stream
    from openai._legacy_response import LegacyAPIResponse
    from openai._response import BaseAPIResponse

    return Stream, AsyncStream, (LegacyAPIResponse, BaseAPIResponse)


def _endpoint_kind(options: Any) -> str | None:
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


def _sync_request(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def request(self: Any, *args: Any, **kwargs: Any) -> Any:
        episode, router = current_episode(), current_router()
        if episode is None and router is None:
            return original(self, *args, **kwargs)
        args, kwargs, recording = _start(self, args, kwargs, episode, router)
        if recording is None:
            return original(self, *args, **kwargs)
        try:
            result = original(self, *args, **kwargs)
        except Exception as error:
            recording.guarded(recording.record_error, error)
            raise
        recording.guarded(recording.handle_result, result)
        return result

    return request


def _async_request(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def request(self: Any, *args: Any, **kwargs: Any) -> Any:
        episode, router = current_episode(), current_router()
        if episode is None and router is None:
            return await original(self, *args, **kwargs)
        args, kwargs, recording = _start(self, args, kwargs, episode, router)
        if recording is None:
            return await original(self, *args, **kwargs)
        try:
            result = await original(self, *args, **kwargs)
        except Exception as error:
            recording.guarded(recording.record_error, error)
            raise
        recording.guarded(recording.handle_result, result)
        return result

    return request


def _start(
    client: Any, args: tuple[Any, ...], kwargs: dict[str, Any], episode: Episode | None, router: Router | None
) -> tuple[tuple[Any, ...], dict[str, Any], _Recording | None]:
    """The request's arguments as the router sends them, and its recording (None: not recorded)."""
    with never_break_the_agent("reading an openai request"):
        options = _options_of(args, kwargs)
        kind = _endpoint_kind(options)
        if kind is None:
            return args, kwargs, None
        base_url = _base_url_text(client)
        attributes = current_call_attributes()
        adapter = None
        if router is not None:
            agent = attributes.get("agent_name") or (episode.name if episode is not None else None)
            _, base_url, adapter = route_options(router, client, options, kind, base_url, agent)
        if episode is None:
            return args, kwargs, None
        return args, kwargs, _Recording(kind, options, base_url, episode, attributes, adapter)
    return args, kwargs, None


class _Recording:
    """One request's recording: the episode and attributes captured at its start, and its outcome."""

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
        self.prompts = body.get("prompt")
        self.episode = episode
        self.attributes = attributes
        if kind == "responses":
            self.template = responses_request_record(body, base_url, time.time())
        else:
            self.template = request_record(kind, body, base_url, time.time())
        self.template.adapter = adapter
        self.recorded = False
        self.parsed = False

    @staticmethod
    def guarded(step: Callable[..., Any], *args: Any) -> None:
        with never_break_the_agent("recording an openai call"):
            step(*args)

    def record(self, calls: list[LLMCall]) -> None:
        if self.recorded:
            return
        self.recorded = True
        for call in calls:
            record_call(call, episode=self.episode, attributes=self.attributes)

    def record_error(self, error: BaseException) -> None:
        self.record([failed_call(self.template, error)])

    def handle_result(self, result: Any) -> None:
        stream, async_stream, raw_responses = _openai_types()
        if isinstance(result, stream):
            tap_stream(result, self)
        elif isinstance(result, async_stream):
            tap_async_stream(result, self)
        elif isinstance(result, raw_responses):
            self._wrap_parse(result)
        elif hasattr(result, "choices"):
            self.record(calls_from_response(self.template, result, self.prompts))
        elif getattr(result, "object", None) == "response":
            self.record(calls_from_responses_api(self.template, result))

    def _wrap_parse(self, raw: Any) -> None:
        """`with_raw_response` / `with_streaming_response`: record what `.parse()` gives the user."""
        original_parse = raw.parse

        async def parse_async(*args: Any, **kwargs: Any) -> Any:
            result = await original_parse(*args, **kwargs)
            self._after_parse(result)
            return result

        def parse(*args: Any, **kwargs: Any) -> Any:
            result = original_parse(*args, **kwargs)
            self._after_parse(result)
            return result

        raw.parse = parse_async if inspect.iscoroutinefunction(original_parse) else parse

    def _after_parse(self, result: Any) -> None:
        stream, async_stream, _ = _openai_types()
        readable = hasattr(result, "choices") or getattr(result, "object", None) == "response"
        if self.parsed or not (isinstance(result, stream | async_stream) or readable):
            return  # parse(to=dict) and the like: nothing we can read
        self.parsed = True
        self.guarded(self.handle_result, result)
