"""`@reward` (final rewards of an episode) and `emit_reward` (a step reward on an LLM call).

A reward problem never disturbs the agent: inside an episode, a reward function that raises or
returns something that is not a finite number gives no reward, and the problem is written to
`Episode.reward_errors` instead, where the trainer and the user can see it.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import traceback
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, cast, overload

from lightning_sdk.tracing.context import current_episode
from lightning_sdk.tracing.episode import Episode, LLMCall
from lightning_sdk.tracing.errors import logger

__all__ = ["emit_reward", "reward"]

P = ParamSpec("P")
R = TypeVar("R")


@overload
def reward(fn: Callable[P, R], /) -> Callable[P, R | None]: ...
@overload
def reward(*, name: str | None = None) -> Callable[[Callable[P, R]], Callable[P, R | None]]: ...
def reward(fn: Callable[P, R] | None = None, /, *, name: str | None = None) -> Any:
    """Record what a scoring function returns as a final reward of the current episode.

    Use bare (`@reward`, named after the function) or with a name (`@reward(name="accuracy")`).
    The function returns a number, stored as `episode.rewards[name]`, or a dict of numbers, whose
    keys are stored as separate components; `episode.reward` is the sum of all components. Calling
    it again in the same episode overwrites the components it set. Plain and async functions work.

    Inside an episode, a reward function that raises, or returns NaN, infinity or a non-number,
    adds no reward and appends an entry to `episode.reward_errors`; an exception is not re-raised
    (the call returns None), so a broken scorer never breaks the agent. Outside an episode the
    function behaves exactly as if it were not decorated.
    """
    if fn is None:
        return functools.partial(_rewarded, name=name)
    return _rewarded(fn, name=name)


def _rewarded(fn: Callable[P, R], name: str | None) -> Callable[P, R | None]:
    reward_name = name or getattr(fn, "__name__", None) or "reward"

    if inspect.iscoroutinefunction(fn):

        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            episode = current_episode()
            if episode is None:
                return await fn(*args, **kwargs)
            try:
                value = await fn(*args, **kwargs)
            except Exception as error:  # noqa: BLE001 - a broken scorer must not break the agent
                _record_error(episode, reward_name, error)
                return None
            _record_value(episode, reward_name, value)
            return value

        return cast(Callable[P, R | None], functools.wraps(fn)(async_wrapper))

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        episode = current_episode()
        if episode is None:
            return fn(*args, **kwargs)
        try:
            value = fn(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - a broken scorer must not break the agent
            _record_error(episode, reward_name, error)
            return None
        _record_value(episode, reward_name, value)
        return value

    return functools.wraps(fn)(wrapper)


def _as_finite(value: object) -> float | None:
    """The value as a float if it is a finite real number (bools count as 0 and 1), else None."""
    if not isinstance(value, numbers.Real):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _record_value(episode: Episode, name: str, value: object) -> None:
    components = value if isinstance(value, dict) else {name: value}
    numbers_by_name = {str(key): _as_finite(item) for key, item in components.items()}
    bad = sorted(key for key, number in numbers_by_name.items() if number is None)
    if bad or not components:
        message = f"returned {value!r}; expected a finite number or a non-empty dict of finite numbers"
        episode.reward_errors.append({"name": name, "type": "InvalidReward", "message": message})
        logger.warning(
            "lightning-sdk: reward %r of episode %s %s; no reward recorded", name, episode.id, message
        )
        return
    episode.rewards.update(numbers_by_name)  # type: ignore[arg-type]  # all finite, checked above


def _record_error(episode: Episode, name: str, error: BaseException) -> None:
    episode.reward_errors.append(
        {
            "name": name,
            "type": type(error).__qualname__,
            "message": str(error),
            "traceback": "".join(traceback.format_exception(error)),
        }
    )
    logger.warning(
        "lightning-sdk: reward %r raised %s: %s; no reward recorded for episode %s",
        name,
        type(error).__name__,
        error,
        episode.id,
    )


def emit_reward(value: float, name: str | None = None) -> LLMCall | None:
    """Attach a step reward to the most recent LLM call of the current episode.

    The call is the latest one started in the current episode or its sub-agents (a stream counts
    once the user has consumed or closed it). Rewards emitted on the same call add up; with a
    `name` they are also kept per name in `call.reward_components`.

    Returns the call the reward was attached to, or None when it could not be attached: outside an
    episode nothing happens; inside an episode with no LLM call yet, or with a value that is not a
    finite number, the reward is dropped and an entry is appended to `episode.reward_errors`.
    """
    episode = current_episode()
    if episode is None:
        return None
    label = name or "step"
    number = _as_finite(value)
    if number is None:
        _drop(episode, label, f"emit_reward got {value!r}; expected a finite number")
        return None
    calls = episode.all_calls()
    if not calls:
        _drop(
            episode,
            label,
            "emit_reward was called before any LLM call of this episode; "
            "emit step rewards after the call they score",
        )
        return None
    call = calls[-1]
    call.add_reward(number, name)
    return call


def _drop(episode: Episode, name: str, message: str) -> None:
    episode.reward_errors.append({"name": name, "type": "InvalidStepReward", "message": message})
    logger.warning("lightning-sdk: %s (episode %s); the reward is dropped", message, episode.id)
