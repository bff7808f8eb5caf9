"""A server's two keys: its own key, which opens every route (runners lease and upload with it), and the key
derived from it that opens model calls only (what a runner hands the agent it runs).

An agent's tools may read `OPENAI_API_KEY` (a code interpreter's subprocess inherits the environment, a
tool may log it): with the run's own key they could lease the trainer's rollouts, upload episodes for
them or end their leases. The model key opens the served APIs and the recording gateway, nothing else.
It is derived (an HMAC of a fixed label under the server's key), so runners compute it from the key they
hold and no protocol message carries it, and it does not lead back to the server's key.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from collections.abc import Iterable

__all__ = ["MODEL_KEY_PREFIX", "model_key", "offered_keys", "offers"]

MODEL_KEY_PREFIX = "lsm-"
"""How a model key starts: a key in a log or an environment says which kind it is."""
_LABEL = b"lightning-sdk model calls"


@functools.lru_cache(maxsize=8)  # asked on every request a server authorizes: derive once per key
def model_key(key: str) -> str:
    """The key for model calls only that a server whose own key is `key` accepts."""
    return MODEL_KEY_PREFIX + hmac.new(key.encode(), _LABEL, hashlib.sha256).hexdigest()


def offered_keys(authorization: str, api_key_headers: Iterable[str]) -> list[str]:
    """The keys a request offers: a bearer token (OpenAI's clients) and `x-api-key` values (Anthropic's)."""
    offered = [authorization[7:].strip()] if authorization.startswith("Bearer ") else []
    return offered + list(api_key_headers)


def offers(offered: Iterable[str], key: str) -> bool:
    """Whether one of `offered` is `key`, compared in constant time (as bytes: `compare_digest` refuses
    str with non-ASCII characters, which a header may hold). An empty `key` matches nothing: an empty
    header (`Bearer ` alone, `x-api-key:` with no value) must not open anything."""
    if not key:
        return False
    expected = key.encode()
    return any(hmac.compare_digest(given.encode(), expected) for given in offered)
