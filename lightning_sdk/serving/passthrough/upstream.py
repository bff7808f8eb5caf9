"""`Upstream`: the OpenAI-compatible API that receives the requests the policy does not serve.

Plain data with no heavy imports (the route that forwards to it is
`lightning_sdk.serving.passthrough.forward`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from lightning_sdk.serving.passthrough.routes import PASSTHROUGH_ROUTES, check_passthrough_routes

__all__ = ["OPENAI_API_BASE", "Upstream"]

OPENAI_API_BASE = "https://api.openai.com/v1"
"""Where the openai client sends requests when `OPENAI_BASE_URL` is not set."""


@dataclass(frozen=True)
class Upstream:
    """An OpenAI-compatible API that receives the requests the policy does not serve.

    Args:
        base_url: Its base URL with the `/v1` suffix, e.g. `https://api.openai.com/v1`.
        api_key: Bearer key sent to it (in place of the key the agent sent to us); `None` sends none.
        routes: The requests passed through to it, as `"METHOD /v1/path"` (`*` for one segment): by
            default `PASSTHROUGH_ROUTES`, the inference routes an agent's model client calls
            (`lightning_sdk.serving.passthrough.routes` says why these); `()` passes nothing through.
    """

    base_url: str
    api_key: str | None = None
    routes: tuple[str, ...] = PASSTHROUGH_ROUTES

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"Upstream base_url must be an http(s) URL ending in /v1, got {self.base_url!r}."
            )
        object.__setattr__(self, "routes", check_passthrough_routes(self.routes))

    def __repr__(self) -> str:  # never print the key
        key = "***" if self.api_key else None
        return f"Upstream(base_url={self.base_url!r}, api_key={key}, routes={self.routes!r})"

    @classmethod
    def from_environment(
        cls,
        environ: Mapping[str, str] | None = None,
        key_variable: str = "OPENAI_API_KEY",
        routes: tuple[str, ...] = PASSTHROUGH_ROUTES,
    ) -> Upstream | None:
        """The API an openai client built in this environment would call: `OPENAI_BASE_URL` (or
        api.openai.com when only a key is set), with the key in `key_variable`, passed `routes`; `None` when
        neither is set."""
        environ = os.environ if environ is None else environ
        base_url, api_key = environ.get("OPENAI_BASE_URL"), environ.get(key_variable)
        if base_url:
            return cls(base_url.rstrip("/"), api_key or None, routes)
        return cls(OPENAI_API_BASE, api_key, routes) if api_key else None

    def url_for(self, path: str) -> str:
        """The upstream URL of one of our normalised `/v1/...` paths (`routes.normalised_path`)."""
        return f"{self.base_url.rstrip('/')}/{path.removeprefix('/v1/').lstrip('/')}"
