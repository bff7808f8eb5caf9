"""`POST /v1/episodes/<id>/feedback`: a reward that arrives after its episode, over HTTP.

The route is the HTTP form of `ls.feedback` (`lightning_sdk.tracing.rewards.feedback`): it sets the reward
of a stored episode and records when and how it came. It sits behind the server's key like every `/v1`
route, and is installed on a server that has the episode store the agent records into
(`ls.serve(store=...)`, `lightning-sdk serve --store PATH`):

    curl -X POST $BASE/episodes/$EPISODE_ID/feedback -H "Authorization: Bearer $KEY" \\
         -H 'Content-Type: application/json' -d '{"reward": 1, "comment": "solved my problem"}'
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, ValidationError

from lightning_sdk.serving.errors import APIError
from lightning_sdk.serving.limits import read_json_body
from lightning_sdk.serving.routes.installer import Authorize, RouteInstaller
from lightning_sdk.tracing.rewards.feedback import Feedback, feedback_field_problem
from lightning_sdk.tracing.store import EpisodeStore, UnknownEpisode

__all__ = ["FEEDBACK_PATH", "FeedbackReply", "FeedbackRequest", "feedback_routes"]

FEEDBACK_PATH = "/v1/episodes/{episode_id}/feedback"
MAX_FEEDBACK_BYTES = 64 * 1024
"""A reward, a name and a comment: anything larger is not a feedback body."""


class FeedbackRequest(BaseModel):
    """The route's body. A field it does not know is refused by name."""

    model_config = ConfigDict(extra="forbid")

    # Checked by `feedback_field_problem`, the rule `ls.feedback` follows, rather than coerced by pydantic
    # (which would store `true` and `"1"` as 1.0).
    reward: Any
    """A finite number (within the server's range, when it has one): not a boolean, not a string."""
    name: Any = "feedback"
    """The reward's name, a non-empty string: the same name again replaces the reward, another adds a
    component."""
    comment: str | None = None
    """Free text kept with the record."""
    source: str = "http"
    """Who sent it (kept with the record)."""


class FeedbackReply(BaseModel):
    """What the route answers: the episode's rewards after the feedback."""

    episode_id: str
    rewards: dict[str, float]
    """Every named reward of the episode."""
    reward: float | None
    """The episode's return (the sum of its rewards): what training reads."""
    feedback_count: int
    """How many feedback records the episode has."""


def feedback_routes(store: EpisodeStore, reward_range: tuple[float, float] | None = None) -> RouteInstaller:
    """The installer of the feedback route on a server (`AppOptions.routes`), writing into `store`;
    `reward_range=(low, high)` refuses rewards outside it."""

    def install(app: FastAPI, authorize: Authorize) -> None:
        @app.post(FEEDBACK_PATH)
        async def give_feedback(episode_id: str, request: Request) -> dict[str, Any]:
            authorize(request)
            body = await _feedback_body(request)
            problem = feedback_field_problem(body.reward, body.name, reward_range)
            if problem is not None:
                field, message = problem
                raise APIError.bad_request(message, param=field)
            given = Feedback(body.reward, body.name, body.source, body.comment)
            try:
                episode = await run_in_threadpool(store.add_feedback, episode_id, given)
            except UnknownEpisode as unknown:
                raise APIError(404, str(unknown), param="episode_id", code="episode_not_found") from None
            records = episode.metadata.get("feedback", [])
            reply = FeedbackReply(
                episode_id=episode.id,
                rewards=episode.rewards,
                reward=episode.reward,
                feedback_count=len(records),
            )
            return reply.model_dump()

    return install


async def _feedback_body(request: Request) -> FeedbackRequest:
    body = await read_json_body(request, MAX_FEEDBACK_BYTES)  # 413 past the bound, 400 for bad JSON
    try:
        return FeedbackRequest.model_validate(body)
    except ValidationError as error:
        first = error.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "body"
        raise APIError.bad_request(f"{field}: {first['msg']}", param=field) from None
