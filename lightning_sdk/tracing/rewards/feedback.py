"""Rewards that arrive after the episode: a thumbs up a minute later, a grader's score the next day.

An agent in production records its episodes into an `EpisodeStore` (`ls.configure(store=...)`) and
answers; the reward comes later, from the user or a reviewer, naming the episode by its id:

    answer = agent(question)
    episode_id = ls.last_episode().id          # or ls.current_episode().id inside the agent
    ...
    ls.feedback(episode_id, 1.0)               # later, in any process that can open the store

`feedback` sets the episode's reward of that name (`Episode.rewards[name]`, so the episode's return, which
training reads, includes it) and appends a record of when and how it came to
`Episode.metadata["feedback"]`. A second feedback of the same name replaces the reward and keeps both
records. The HTTP form is `POST /v1/episodes/<id>/feedback` on a server started with a store
(`lightning_sdk.serving`).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

from lightning_sdk.tracing.config import current_settings
from lightning_sdk.tracing.episode import FEEDBACK_KEY, Episode
from lightning_sdk.tracing.store import EpisodeStore, UnknownEpisode

__all__ = [
    "FEEDBACK_KEY",
    "Feedback",
    "UnknownEpisode",
    "feedback",
    "feedback_field_problem",
    "feedback_problem",
]


@dataclass(frozen=True)
class Feedback:
    """One reward that arrived after its episode finished, and where it came from."""

    reward: float
    """The reward; it becomes `Episode.rewards[name]`."""
    name: str = "feedback"
    """The reward's name: a different name adds a component, the same name replaces it."""
    source: str = "python"
    """Who sent it: `"python"` (`ls.feedback`), `"http"` (the feedback route), or your own label."""
    comment: str | None = None
    """Free text kept with the record (a user's note, a grader's reason)."""
    at: float = field(default_factory=time.time)
    """Unix time it arrived."""

    def __post_init__(self) -> None:
        problem = feedback_problem(self.reward, self.name)
        if problem:
            raise ValueError(problem)

    def apply_to(self, episode: Episode) -> Episode:
        """`episode` with this reward set and this record appended (changed in place and returned)."""
        episode.rewards[self.name] = float(self.reward)
        episode.metadata.setdefault(FEEDBACK_KEY, []).append(asdict(self))
        return episode


def feedback_problem(
    reward: object, name: object = "feedback", reward_range: tuple[float, float] | None = None
) -> str | None:
    """What is wrong with a feedback's reward or name (None: nothing)."""
    found = feedback_field_problem(reward, name, reward_range)
    return None if found is None else found[1]


def feedback_field_problem(
    reward: object, name: object = "feedback", reward_range: tuple[float, float] | None = None
) -> tuple[str, str] | None:
    """The field that is wrong (`"reward"` or `"name"`) and what is wrong with it, or None. The one rule
    for `ls.feedback` and the HTTP route: a reward is a finite number, not a boolean or a string that
    reads as one, so a client's `true` or `"1"` is refused on both paths rather than stored as 1.0."""
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not _finite(reward):
        return "reward", f"reward={reward!r:.80} must be a finite number."
    if reward_range is not None and not reward_range[0] <= reward <= reward_range[1]:
        low, high = reward_range
        return "reward", f"reward={reward!r} is outside the allowed range [{low:g}, {high:g}]."
    if not isinstance(name, str) or not name.strip():
        return "name", f"name={name!r} must be a non-empty string (the reward's name)."
    return None


def _finite(number: float) -> bool:
    try:
        return math.isfinite(number)
    except OverflowError:  # an integer past float's range (JSON allows any number of digits)
        return False


def feedback(
    episode_id: str,
    reward: float,
    *,
    name: str = "feedback",
    comment: str | None = None,
    source: str = "python",
    store: EpisodeStore | None = None,
    reward_range: tuple[float, float] | None = None,
) -> Episode:
    """Give a stored episode a reward that arrived after it finished; returns the updated episode.

    Args:
        episode_id: the top-level episode's id (`ls.last_episode().id`, `ls.current_episode().id`).
        reward: a finite number; it becomes `Episode.rewards[name]`.
        name: the reward's name (default `"feedback"`): the same name again replaces the reward.
        comment: free text kept with the record.
        source: who sent it (kept with the record).
        store: the store that holds the episode (default: the one set with `ls.configure(store=...)`).
        reward_range: refuse rewards outside `(low, high)`, e.g. `(0, 1)` for thumbs up/down.

    Raises:
        ValueError: a reward that is not a finite number or is outside `reward_range`, or no store.
        UnknownEpisode: no stored episode has this id (nothing is written).
    """
    store = store if store is not None else current_settings().store
    if store is None:
        raise ValueError(
            "ls.feedback needs the episode store the agent recorded into: pass store=EpisodeStore(path), or "
            "call ls.configure(store=path) first."
        )
    problem = feedback_problem(reward, name, reward_range)
    if problem:
        raise ValueError(f"feedback for episode {episode_id!r}: {problem}")
    return store.add_feedback(episode_id, Feedback(reward, name, source, comment))
