"""OpenAI-compatible serving over any engine: `serve()`, `start_server()` (or `serve_app()` with the
app's settings as one `AppOptions`), `LLMEndpoint`.

The app renders chat templates into prompt token ids itself and returns the exact prompt and completion
token ids with their logprobs, so recorded calls are trainable without re-tokenizing anything.
Importing this package is light; FastAPI, uvicorn and the engine load when a server starts.
"""

from lightning_sdk.serving.endpoint import LLMEndpoint
from lightning_sdk.serving.limits import RequestLimits
from lightning_sdk.serving.options import AppOptions, SamplingPolicy
from lightning_sdk.serving.passthrough.routes import PASSTHROUGH_ROUTES
from lightning_sdk.serving.passthrough.upstream import Upstream
from lightning_sdk.serving.server import ServerHandle, serve, serve_app, start_server

__all__ = [
    "PASSTHROUGH_ROUTES",
    "AppOptions",
    "LLMEndpoint",
    "RequestLimits",
    "SamplingPolicy",
    "ServerHandle",
    "Upstream",
    "serve",
    "serve_app",
    "start_server",
]
