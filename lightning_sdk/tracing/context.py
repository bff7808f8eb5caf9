"""Context-local state of the recording side: the current episode, collectors and call attribution.

Everything lives in `ContextVar`s, so concurrent asyncio tasks each see their own episode and child
tasks inherit their parent's. Worker threads from a plain `ThreadPoolExecutor` do not inherit a
context; `run_in_episode` and `ContextThreadPoolExecutor` carry it there explicitly.
"""

from __future__ import annotations

import bisect
import contextvars
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar

from lightning_sdk.tracing.episode import Episode, LLMCall

__all__ = [
    "ContextThreadPoolExecutor",
    "call_attributes",
    "capture",
    "collect_into",
    "current_call_attributes",
    "current_episode",
    "episode_scope",
    "last_episode",
    "notify_finished",
    "open_call_attributes",
    "record_call",
    "remember_finished",
    "run_in_episode",
]

P = ParamSpec("P")
R = TypeVar("R")

_episode: contextvars.ContextVar[Episode | None] = contextvars.ContextVar(
    "lightning_sdk_episode", default=None
)
_collectors: contextvars.ContextVar[tuple[list[Episode], ...]] = contextvars.ContextVar(
    "lightning_sdk_collectors", default=()
)
_call_attributes: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "lightning_sdk_call_attributes", default=None
)
_last_episode: contextvars.ContextVar[Episode | None] = contextvars.ContextVar(
    "lightning_sdk_last_episode", default=None
)
_finish_hooks: list[Callable[[Episode], None]] = []


def current_episode() -> Episode | None:
    """The episode being recorded in this context, or None outside any `@trace_agent` call."""
    return _episode.get()


def last_episode() -> Episode | None:
    """The episode of the traced agent call that finished last in this context (this thread, or this
    asyncio task), or None. After `answer = agent(question)`, `ls.last_episode().id` names the episode, to
    give it a reward later with `ls.feedback`. Agents run concurrently in other tasks (`asyncio.gather`)
    each set it in their own task: read `ls.current_episode().id` inside the agent there instead."""
    return _last_episode.get()


def remember_finished(episode: Episode) -> None:
    """Called in the caller's context as a traced agent call returns (see `last_episode`)."""
    _last_episode.set(episode)


@contextmanager
def episode_scope(episode: Episode) -> Iterator[Episode]:
    """Make `episode` the current episode inside the block (reset by token afterwards)."""
    token = _episode.set(episode)
    try:
        yield episode
    finally:
        _episode.reset(token)


def record_call(
    call: LLMCall, *, episode: Episode | None = None, attributes: dict[str, Any] | None = None
) -> bool:
    """Append `call` to the current episode, applying any `call_attributes` in scope.

    A call that finishes somewhere else than it started (a stream consumed later, a callback run in
    another thread) passes the `episode` and `attributes` (`current_call_attributes()`) captured
    when it started. Returns False (and records nothing) outside an episode.
    """
    episode = episode if episode is not None else _episode.get()
    if episode is None:
        return False
    attributes = attributes if attributes is not None else _call_attributes.get()
    if attributes:
        for key, value in attributes.items():
            if key == "metadata":
                call.metadata.update(value)
            elif getattr(call, key, None) is None:
                setattr(call, key, value)
    if call.agent_name is None:
        call.agent_name = episode.name
    # Streams and concurrent calls finish out of order; keep `calls` in the order they started.
    bisect.insort(episode.calls, call, key=_started_at)
    return True


def _started_at(call: LLMCall) -> float:
    return call.started_at


@contextmanager
def call_attributes(**attributes: Any) -> Iterator[None]:
    """Fill unset `LLMCall` fields (e.g. `agent_name`) of calls recorded inside the block.

    Integrations use this to attribute calls that the openai capture records to a framework's agent.
    Inner scopes override outer ones.
    """
    leave = open_call_attributes(**attributes)
    try:
        yield
    finally:
        leave()


def open_call_attributes(**attributes: Any) -> Callable[[], None]:
    """Enter a `call_attributes` scope now and return the function that leaves it, from any context.

    For frameworks that start a model call in one callback and end it in another, which may run in
    another context (LangChain gathers async end callbacks in child tasks). A ContextVar cannot be reset
    from another context; there the scope's attributes are set back in place to the ones it covered, so a
    scope left behind adds nothing to later calls. Leaving twice does nothing.
    """
    outer = dict(_call_attributes.get() or {})
    live = {**outer, **attributes}
    token = _call_attributes.set(live)
    left = False

    def leave() -> None:
        nonlocal left
        if left:
            return
        left = True
        try:
            _call_attributes.reset(token)
        except ValueError:  # created in another context: make the scope that stays there inert
            live.clear()
            live.update(outer)

    return leave


def current_call_attributes() -> dict[str, Any]:
    """The attributes set by enclosing `call_attributes` blocks."""
    return dict(_call_attributes.get() or {})


@contextmanager
def collect_into(sink: list[Episode]) -> Iterator[list[Episode]]:
    """Append every top-level episode that finishes in this context (and its tasks) to `sink`."""
    token = _collectors.set((*_collectors.get(), sink))
    try:
        yield sink
    finally:
        _collectors.reset(token)


@contextmanager
def capture() -> Iterator[list[Episode]]:
    """Collect the episodes finished inside the block.

    Top-level episodes are collected (sub-agents are reachable through `Episode.children`), including
    those finished in asyncio tasks started inside the block and in threads that carry the context
    (`run_in_episode`, `ContextThreadPoolExecutor`).

        with ls.capture() as episodes:
            agent(task)
        print(episodes[0].reward)
    """
    with collect_into([]) as sink:
        yield sink


def notify_finished(episode: Episode) -> None:
    """Called once when a top-level episode finishes: hand it to collectors and finish hooks."""
    for sink in _collectors.get():
        sink.append(episode)
    for hook in _finish_hooks:
        hook(episode)


def add_finish_hook(hook: Callable[[Episode], None]) -> None:
    """Register a process-wide callback run for every finished top-level episode (e.g. a store)."""
    if hook not in _finish_hooks:
        _finish_hooks.append(hook)


def remove_finish_hook(hook: Callable[[Episode], None]) -> None:
    """Undo `add_finish_hook`."""
    if hook in _finish_hooks:
        _finish_hooks.remove(hook)


def run_in_episode(fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> Callable[[], R]:
    """Bind `fn(*args, **kwargs)` to the current context, for running in another thread.

    The returned zero-argument callable runs `fn` inside a copy of the context captured now, so the
    LLM calls it makes land in the current episode:

        pool.submit(ls.run_in_episode(tool, query))
        threading.Thread(target=ls.run_in_episode(worker, item)).start()
    """
    context = contextvars.copy_context()

    def bound() -> R:
        # A Context cannot be entered by two threads at once; each run gets its own copy.
        return context.copy().run(fn, *args, **kwargs)

    return bound


class ContextThreadPoolExecutor(ThreadPoolExecutor):
    """A `ThreadPoolExecutor` whose `submit` and `map` carry the submitter's context (and episode)."""

    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Future[R]:
        return super().submit(run_in_episode(fn, *args, **kwargs))
