"""The wrapper both client captures install: openai's and anthropic's clients are generated from the same
template, so every request of either goes through one `request(self, cast_to, options, ...)` method on
its sync and async base client.

The wrapper does nothing beyond two ContextVar lookups for a request made outside an episode and outside
a rollout. Otherwise `start` (the capture's own) reads the request, lets the router of a rollout redirect
it, and returns the request's arguments and its recording (None: the request is not one we record); the
recording then sees the result or the error.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from lightning_sdk.tracing.capture.openai_calls import failed_call
from lightning_sdk.tracing.context import current_episode, record_call
from lightning_sdk.tracing.episode import Episode, LLMCall
from lightning_sdk.tracing.errors import never_break_the_agent
from lightning_sdk.tracing.routing import Router, current_router

__all__ = [
    "CallRecording",
    "ClientPatch",
    "RequestRecording",
    "Start",
    "async_request",
    "base_url_text",
    "sync_request",
]


_base_urls: weakref.WeakKeyDictionary[Any, tuple[Any, str]] = weakref.WeakKeyDictionary()


def base_url_text(client: Any) -> str:
    """`str(client.base_url)` without its trailing slash, cached per client (httpx URLs print slowly)."""
    url = client.base_url
    cached = _base_urls.get(client)
    if cached is None or cached[0] is not url:
        cached = (url, str(url).rstrip("/"))
        _base_urls[client] = cached
    return cached[1]


class RequestRecording(Protocol):
    """One request's recording, as the wrapper drives it."""

    def guarded(self, step: Callable[..., Any], *args: Any) -> None: ...

    def record_error(self, error: BaseException) -> None: ...

    def handle_result(self, result: object) -> None: ...


Start = Callable[
    [Any, tuple[Any, ...], dict[str, Any], Episode | None, Router | None],
    tuple[tuple[Any, ...], dict[str, Any], RequestRecording | None],
]
"""`start(client, args, kwargs, episode, router) -> (args, kwargs, recording or None)`."""


def sync_request(original: Callable[..., Any], start: Start) -> Callable[..., Any]:
    """`original` (a sync client's `request`) recorded and routed by `start`."""

    @functools.wraps(original)
    def request(self: Any, *args: Any, **kwargs: Any) -> Any:
        episode, router = current_episode(), current_router()
        if episode is None and router is None:
            return original(self, *args, **kwargs)
        args, kwargs, recording = start(self, args, kwargs, episode, router)
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


def async_request(original: Callable[..., Any], start: Start) -> Callable[..., Any]:
    """The same for an async client's `request`."""

    @functools.wraps(original)
    async def request(self: Any, *args: Any, **kwargs: Any) -> Any:
        episode, router = current_episode(), current_router()
        if episode is None and router is None:
            return await original(self, *args, **kwargs)
        args, kwargs, recording = start(self, args, kwargs, episode, router)
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


class CallRecording:
    """What both captures' recordings share: the request's record (`template`), the episode and call
    attributes captured at its start, recording once, and reading what `.parse()` of a raw response gives
    the user. A capture's subclass says which results it reads (`handle_result`, `readable`)."""

    client_name = "a client"

    def __init__(self, template: LLMCall, episode: Episode, attributes: dict[str, Any]) -> None:
        self.template, self.episode, self.attributes = template, episode, attributes
        self.prompts: Any = None
        self.recorded = self.parsed = False

    def guarded(self, step: Callable[..., Any], *args: Any) -> None:
        with never_break_the_agent(f"recording {self.client_name} call"):
            step(*args)

    def record(self, calls: list[LLMCall]) -> None:
        if self.recorded:
            return
        self.recorded = True
        for call in calls:
            record_call(call, episode=self.episode, attributes=self.attributes)

    def record_error(self, error: BaseException) -> None:
        self.record([failed_call(self.template, error)])

    def handle_result(self, result: object) -> None:
        raise NotImplementedError

    def readable(self, result: object) -> bool:
        """Whether `handle_result` can read this parsed result (`parse(to=dict)` and the like: no)."""
        raise NotImplementedError

    def wrap_parse(self, raw: Any) -> None:
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

    def _after_parse(self, result: object) -> None:
        if self.parsed or not self.readable(result):
            return
        self.parsed = True
        self.guarded(self.handle_result, result)


class ClientPatch:
    """The capture of one client library (`openai` or `anthropic`): its two base clients' `request`
    wrapped by `start`, reversibly, and whether traced agents may install it by themselves.

    Args:
        library: the module name.
        start: the capture's `Start`.
        supported: the versions tested: at least the first (major, minor), below the second.
    """

    def __init__(
        self, library: str, start: Start, supported: tuple[tuple[int, int], tuple[int, int]]
    ) -> None:
        self.library, self.start, self.supported = library, start, supported
        self.auto = True
        """Whether traced agents install it at their first call (`configure(instrument_openai=...)`)."""
        self.originals: list[tuple[type, Callable[..., Any]]] = []
        self._lock = threading.Lock()

    @property
    def pip_spec(self) -> str:
        (low_major, low_minor), (high_major, _) = self.supported
        return f"{self.library}>={low_major}.{low_minor},<{high_major}"

    def install(self) -> bool:
        """Wrap the client's requests; True when this call installed it, False when it already was."""
        with self._lock:
            self.auto = True
            if self.originals:
                return False
            module = importlib.import_module(self.library)
            base_client = importlib.import_module(f"{self.library}._base_client")
            self.warn_if_unsupported(module.__version__)
            for owner, wrap in (
                (base_client.SyncAPIClient, sync_request),
                (base_client.AsyncAPIClient, async_request),
            ):
                original = owner.__dict__.get("request")
                if original is None:
                    raise RuntimeError(
                        f"{self.library} {module.__version__} has no {owner.__name__}.request to "
                        f"instrument; install a supported version: pip install '{self.pip_spec}'"
                    )
                owner.request = wrap(original, self.start)
                self.originals.append((owner, original))
            return True

    def uninstall(self) -> bool:
        """Restore the client's methods, and stop traced agents from installing the patch again (until
        `install`). True when something was restored."""
        with self._lock:
            self.auto = False
            restored = bool(self.originals)
            while self.originals:
                owner, original = self.originals.pop()
                owner.request = original  # type: ignore[attr-defined]
            return restored

    def warn_if_unsupported(self, version: str) -> None:
        parts = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
        low, high = self.supported
        if not low <= parts < high:
            warnings.warn(
                f"lightning-sdk's {self.library} capture is tested with {self.pip_spec}; found {version}. "
                f"Calls may go unrecorded; install a supported version (pip install '{self.pip_spec}').",
                RuntimeWarning,
                stacklevel=4,
            )
