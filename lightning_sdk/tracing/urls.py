"""`same_endpoint`: the one rule for "was this call made to that server".

Credit assignment trains only calls that reached the trainer's endpoint, the step diagnostics say when none
did, and runner episodes are re-filed under the trainer's URL; all three ask the same question, so they
share this answer. Two base URLs name the same endpoint when they agree after trimming white space and
trailing slashes, ignoring case, and taking `localhost` and `[::1]` for `127.0.0.1` (a client may name the
loopback interface any of these ways; the server listens on it once).
"""

from __future__ import annotations

__all__ = ["normalise_endpoint", "same_endpoint"]

_LOOPBACK_NAMES = ("://localhost", "://[::1]")


def normalise_endpoint(url: str) -> str:
    """The form of a base URL that `same_endpoint` compares."""
    url = url.strip().rstrip("/").lower()
    for name in _LOOPBACK_NAMES:
        url = url.replace(name, "://127.0.0.1")
    return url


def same_endpoint(url: str | None, other: str | None) -> bool:
    """True when both URLs are given and name the same endpoint (see the module docstring)."""
    return url is not None and other is not None and normalise_endpoint(url) == normalise_endpoint(other)
