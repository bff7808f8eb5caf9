"""What passes through to the upstream: the inference routes an agent's model client calls, nothing else.

The upstream is called with the user's own key, and every process that holds the run's key (each runner,
each agent, each tool subprocess that inherits their environment) can send requests here. Passing any
`/v1/...` request through would lend that key for everything the user's account may do: delete files,
start fine-tuning jobs, read stored responses. So only the routes below pass, and each only with its method:

| route | why an agent sends it |
|---|---|
| `POST /v1/embeddings` | a retriever or a memory embeds text |
| `POST /v1/moderations` | a guardrail checks a message |
| `POST /v1/images/generations`, `/edits`, `/variations` | an agent with an image tool |
| `POST /v1/audio/speech`, `/transcriptions`, `/translations` | a voice agent |
| `GET /v1/models/*` | a client checks that a model exists (`client.models.retrieve(...)`): read only |

Each takes a request and answers it, and changes nothing stored in the account. The policy's own routes
(chat, completions, responses, messages, the model list, the policy's `GET /v1/models/<id>`) are served
here and never pass. A route is `"METHOD /v1/path"`, whose `*` segments match one path segment of letters,
digits and `-_.~:@+=,`; a user who needs another route lists it (`passthrough_routes`), and an empty list
switches pass-through off.

A request's path is normalised before it is matched: percent-escapes are already decoded by the server,
empty and `.` segments dropped and `..` resolved, and a path that leaves `/v1` (`/v1/%2e%2e/secret`) or
holds any other character (a `%` left from double encoding) matches nothing. The upstream is sent the
normalised path, so what was matched is what is called.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = [
    "PASSTHROUGH_ROUTES",
    "PASSTHROUGH_ROUTES_SETTING",
    "allowed_route",
    "check_passthrough_routes",
    "normalised_path",
]

PASSTHROUGH_ROUTES: tuple[str, ...] = (
    "POST /v1/embeddings",
    "POST /v1/moderations",
    "POST /v1/images/generations",
    "POST /v1/images/edits",
    "POST /v1/images/variations",
    "POST /v1/audio/speech",
    "POST /v1/audio/transcriptions",
    "POST /v1/audio/translations",
    "GET /v1/models/*",
)
"""The routes passed through by default (module docstring: why these and no others)."""

PASSTHROUGH_ROUTES_SETTING = (
    "To pass another route through, list it in passthrough_routes: "
    "TrainerConfig(passthrough_routes=(*ls.PASSTHROUGH_ROUTES, 'METHOD /v1/path')), "
    "ls.serve(passthrough_routes=...) or `lightning-sdk serve --passthrough-route 'METHOD /v1/path'`."
)
"""How a user passes another route through (ends the 404 of a route that is not)."""

_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
_SEGMENT = re.compile(r"[A-Za-z0-9\-_.~:@+=,]+")


def check_passthrough_routes(routes: Iterable[str]) -> tuple[str, ...]:
    """`routes` as a tuple, or a `ValueError` naming the first that is not `"METHOD /v1/path"`."""
    if isinstance(routes, str):
        raise ValueError(f"passthrough_routes must be a list of routes, not one string: [{routes!r}].")
    checked = []
    for route in routes:
        problem = _route_problem(route)
        if problem is not None:
            raise ValueError(
                f"passthrough_routes: {route!r} {problem}. A route is 'METHOD /v1/path' with METHOD one of "
                f"{', '.join(_METHODS)}, and '*' for one path segment, e.g. 'POST /v1/files'."
            )
        checked.append(route)
    return tuple(checked)


def _route_problem(route: object) -> str | None:
    if not isinstance(route, str):
        return "is not a string"
    method, _, path = route.partition(" ")
    if method not in _METHODS:
        return f"does not start with a method ({method!r})"
    if normalised_path(path) != path or path == "/v1":
        return "is not a normalised path under /v1/"
    if any(segment != "*" and not _SEGMENT.fullmatch(segment) for segment in path.split("/")[1:]):
        return "has a segment with another character than letters, digits, '-_.~:@+=,' or '*'"
    return None


def normalised_path(path: str) -> str | None:
    """`path` (decoded) without empty or `.` segments and with `..` resolved, or `None` when it is not
    inside `/v1/` afterwards."""
    segments: list[str] = []
    for segment in path.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if not segments:
                return None
            segments.pop()
            continue
        segments.append(segment)
    if not segments or segments[0] != "v1":
        return None
    return "/" + "/".join(segments)


def allowed_route(method: str, path: str, routes: Iterable[str]) -> str | None:
    """The normalised path of a request to `path` that one of `routes` passes through, or `None`."""
    normal = normalised_path(path)
    if normal is None:
        return None
    segments = normal.split("/")
    for route in routes:
        route_method, _, pattern = route.partition(" ")
        if route_method == method and _matches(pattern.split("/"), segments):
            return normal
    return None


def _matches(pattern: list[str], segments: list[str]) -> bool:
    if len(pattern) != len(segments):
        return False
    return all(
        want == got if want != "*" else bool(_SEGMENT.fullmatch(got)) and got not in (".", "..")
        for want, got in zip(pattern, segments, strict=True)
    )
