"""`@trace_agent`, `@reward` and `emit_reward`: the two decorators a user adds to an existing agent.

`trace_agent` does the costly work once, at decoration time (signature inspection, choosing one of
four thin wrappers for plain, async, generator and async-generator functions); each call then opens
an `_AgentRun` that owns one `Episode` and makes it current while the agent's own code runs.
"""

from __future__ import annotations

import functools
import inspect
import time
import traceback
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, cast, overload

from lightning_sdk.tracing.config import current_settings
from lightning_sdk.tracing.context import (
    current_episode,
    episode_scope,
    notify_finished,
    remember_finished,
)
from lightning_sdk.tracing.episode import Episode
from lightning_sdk.tracing.errors import never_break_the_agent
from lightning_sdk.tracing.jsonable import jsonable
from lightning_sdk.tracing.rewards.agent_rewards import emit_reward, reward

__all__ = ["emit_reward", "reward", "trace_agent"]

P = ParamSpec("P")
R = TypeVar("R")


@overload
def trace_agent(fn: Callable[P, R], /) -> Callable[P, R]: ...
@overload
def trace_agent(*, name: str | None = None) -> Callable[[Callable[P, R]], Callable[P, R]]: ...
def trace_agent(fn: Callable[P, R] | None = None, /, *, name: str | None = None) -> Any:
    """Record every call of an agent function as an `Episode`.

    Use bare (`@trace_agent`) or with a name (`@trace_agent(name="solver")`; the default is the
    function's qualified name). Works on plain, async, generator and async-generator functions.

    Each call makes a new episode current while the agent runs: the LLM calls it makes through
    openai (and the supported frameworks) are recorded into it, and `@reward` functions it calls
    score it. Its first argument (after `self`/`cls`) is recorded as the task, its return value as
    the output (for generators: the list of yielded items, or the return value if there is one).
    An exception is recorded with its
    traceback and re-raised unchanged. A traced agent called inside another becomes a child episode
    (`parent_id`, and appended to the parent's `children`). The first call switches openai capture
    on, and anthropic capture once the process has imported `anthropic` (see
    `configure(instrument_openai=...)`).
    """
    if fn is None:
        return functools.partial(_traced, name=name)
    return _traced(fn, name=name)


def _switch_client_capture_on() -> None:
    """Install the openai and anthropic capture at a traced agent's first call. The capture modules load
    here, not with the package, so `import lightning_sdk` does not pay for clients an agent may never use
    (after the first call these imports are dictionary look-ups)."""
    from lightning_sdk.tracing.capture.anthropic_client import ensure_anthropic_instrumented
    from lightning_sdk.tracing.capture.openai_client import ensure_openai_instrumented

    ensure_openai_instrumented()
    ensure_anthropic_instrumented()


def _traced(fn: Callable[P, R], name: str | None) -> Callable[P, R]:
    agent_name = name or getattr(fn, "__qualname__", None) or repr(fn)
    task_of = _task_reader(fn)

    def start(args: tuple[Any, ...], kwargs: dict[str, Any]) -> _AgentRun | None:
        with never_break_the_agent(f"starting an episode of {agent_name}"):
            if current_settings().instrument_openai:
                _switch_client_capture_on()
            return _AgentRun(agent_name, task_of(args, kwargs))
        return None

    # A callable object is an async/generator agent when its __call__ is one.
    kind = fn if inspect.isroutine(fn) or isinstance(fn, functools.partial) else type(fn).__call__
    if inspect.isasyncgenfunction(kind):
        wrapper = _async_generator_wrapper(fn, start)
    elif inspect.iscoroutinefunction(kind):
        wrapper = _coroutine_wrapper(fn, start)
    elif inspect.isgeneratorfunction(kind):
        wrapper = _generator_wrapper(fn, start)
    else:
        wrapper = _function_wrapper(fn, start)
    wrapped: Any = functools.wraps(fn)(wrapper)
    # Lets the trainer tell a traced agent from a plain function (which it then traces itself).
    wrapped.__lightning_sdk_agent__ = agent_name
    return cast(Callable[P, R], wrapped)


def _task_reader(fn: Callable[..., Any]) -> Callable[[tuple[Any, ...], dict[str, Any]], Any]:
    """Where the task is: the first parameter that is not `self`/`cls`, positional or by keyword."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # builtins and some callables have no signature
        parameters = []
    index = 1 if parameters and parameters[0].name in ("self", "cls") else 0
    keyword = parameters[index].name if len(parameters) > index else None

    def task_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if len(args) > index:
            return jsonable(args[index])
        return jsonable(kwargs[keyword]) if keyword in kwargs else None

    return task_of


class _AgentRun:
    """One call of a traced agent: its episode, made current while the agent's code runs."""

    def __init__(self, name: str, task: object) -> None:
        parent = current_episode()
        self.parent = parent
        self.episode = Episode(
            name=name,
            parent_id=parent.id if parent else None,
            run_id=parent.run_id if parent else current_settings().run_id,
            task=task,
        )
        if parent is not None:
            parent.children.append(self.episode)  # appended at start: children stay in call order

    def active(self) -> Any:
        return episode_scope(self.episode)

    def finish(
        self, output: object = None, error: BaseException | None = None, closed_early: bool = False
    ) -> None:
        with never_break_the_agent(f"finishing episode {self.episode.id}"):
            episode = self.episode
            episode.output = jsonable(output)
            if error is not None:
                episode.error = {
                    "type": type(error).__qualname__,
                    "message": str(error),
                    "traceback": "".join(traceback.format_exception(error)),
                }
            if closed_early:
                episode.metadata["closed_early"] = True
            episode.ended_at = time.time()
            remember_finished(episode)  # the caller's context: `ls.last_episode()` there
            if self.parent is None:
                notify_finished(episode)


Starter = Callable[[tuple[Any, ...], dict[str, Any]], _AgentRun | None]


def _function_wrapper(fn: Callable[..., Any], start: Starter) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        run = start(args, kwargs)
        if run is None:
            return fn(*args, **kwargs)
        try:
            with run.active():
                output = fn(*args, **kwargs)
        except BaseException as error:
            run.finish(error=error)
            raise
        run.finish(output)
        return output

    return wrapper


def _coroutine_wrapper(fn: Callable[..., Any], start: Starter) -> Callable[..., Any]:
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        run = start(args, kwargs)
        if run is None:
            return await fn(*args, **kwargs)
        try:
            with run.active():
                output = await fn(*args, **kwargs)
        except BaseException as error:
            run.finish(error=error)
            raise
        run.finish(output)
        return output

    return wrapper


def _generator_wrapper(fn: Callable[..., Any], start: Starter) -> Callable[..., Any]:
    """Drive the agent's generator step by step, making its episode current only while it runs,
    so that code the consumer runs between items is not recorded into the agent's episode."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        run = start(args, kwargs)
        if run is None:
            return (yield from fn(*args, **kwargs))
        generator, items = fn(*args, **kwargs), list[Any]()
        step, value = generator.send, None
        while True:
            try:
                with run.active():
                    item = step(value)
            except StopIteration as stop:
                run.finish(items if stop.value is None else stop.value)
                return stop.value
            except BaseException as error:
                run.finish(items, error=error)
                raise
            items.append(item)
            try:
                step, value = generator.send, (yield item)
            except GeneratorExit:
                with run.active():
                    generator.close()
                run.finish(items, closed_early=True)
                raise
            except BaseException as error:  # noqa: BLE001 - thrown in by the consumer: passed on to the agent
                step, value = generator.throw, error

    return wrapper


def _async_generator_wrapper(fn: Callable[..., Any], start: Starter) -> Callable[..., Any]:
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        run = start(args, kwargs)
        generator, items = fn(*args, **kwargs), list[Any]()
        if run is None:
            async for item in generator:
                yield item
            return
        step, value = generator.asend, None
        while True:
            try:
                with run.active():
                    item = await step(value)
            except StopAsyncIteration:
                run.finish(items)
                return
            except BaseException as error:
                run.finish(items, error=error)
                raise
            items.append(item)
            try:
                step, value = generator.asend, (yield item)
            except GeneratorExit:
                with run.active():
                    await generator.aclose()
                run.finish(items, closed_early=True)
                raise
            except BaseException as error:  # noqa: BLE001 - thrown in by the consumer: passed on to the agent
                step, value = generator.athrow, error

    return wrapper
