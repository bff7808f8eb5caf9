"""Where the trainer's endpoint sends the agent's requests that the policy does not serve.

An agent may call OpenAI routes besides chat (a retriever's embeddings); during training its clients point
at the trainer's endpoint, which passes such requests through to the agent's own API.
"""

from __future__ import annotations

import logging
import os

from lightning_sdk.serving.passthrough.upstream import Upstream
from lightning_sdk.training.config import TrainerConfig

__all__ = ["TRAINER_UPSTREAM_SETTING", "trainer_upstream"]

log = logging.getLogger("lightning_sdk.training")

TRAINER_UPSTREAM_SETTING = (
    "Set TrainerConfig(upstream_base_url=...) (its key is read from OPENAI_API_KEY), or start training where "
    "OPENAI_BASE_URL or OPENAI_API_KEY names the API the agent uses without the trainer."
)
"""What the endpoint's 404 for an unserved route tells the user to set."""


def trainer_upstream(config: TrainerConfig) -> Upstream | None:
    """The API that receives the agent's requests the policy does not serve (see `upstream_base_url`)."""
    routes = tuple(config.passthrough_routes)
    if config.upstream_base_url is not None:
        key = os.environ.get(config.upstream_api_key_env)
        return Upstream(config.upstream_base_url.rstrip("/"), key, routes)
    upstream = Upstream.from_environment(key_variable=config.upstream_api_key_env, routes=routes)
    if upstream is not None:
        log.info("the agent's requests for other OpenAI routes pass through to %s", upstream.base_url)
    return upstream
