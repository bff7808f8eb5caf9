"""Run the OpenAI-compatible app in a background thread (`serving.http.background`): `serve()` and
`start_server()`.

Example::

    server = ls.serve()                        # bundled model on 127.0.0.1, free port, random key
    client = server.endpoint.openai_client()
    client.chat.completions.create(model=server.endpoint.model, messages=[...])
    server.stop()
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Self

from lightning_sdk.engine.lora.folders import role_adapter_names
from lightning_sdk.engine.types import Engine
from lightning_sdk.serving.endpoint import LLMEndpoint
from lightning_sdk.serving.http.background import BackgroundServer, listening_socket
from lightning_sdk.serving.options import AppOptions, SamplingPolicy
from lightning_sdk.tracing.store import EpisodeStore

if TYPE_CHECKING:
    from lightning_sdk.serving.limits import RequestLimits
    from lightning_sdk.serving.passthrough.upstream import Upstream
    from lightning_sdk.serving.routes.installer import RouteInstaller

__all__ = ["ServerHandle", "serve", "serve_app", "start_server"]

log = logging.getLogger(__name__)


@dataclass
class ServerHandle:
    """A running server: its `endpoint`, its `engine`, and `stop()`."""

    endpoint: LLMEndpoint
    """Where to send requests (base URL, bearer key, model name)."""
    engine: Engine
    """The engine behind the server (push new weights into it with `load_adapter` / `update_weights`)."""
    owns_engine: bool = False
    """Whether `stop()` also shuts the engine down (true for `serve()`)."""
    _background: BackgroundServer | None = field(default=None, repr=False)
    _opened: ExitStack = field(default_factory=ExitStack, repr=False)
    """What `stop()` closes after the server: what `serve()` opened for it (an episode store)."""

    def stop(self) -> None:
        """Stop accepting requests, end the server thread, shut the engine down (if owned) and close
        what `serve()` opened for the server. Calling it again does nothing."""
        if self._background is not None:
            self._background.stop()
        if self.owns_engine:
            self.engine.shutdown()
            self.owns_engine = False
        self._opened.close()

    def wait(self) -> None:
        """Block until the server stops; Ctrl+C stops it."""
        try:
            if self._background is not None:
                self._background.wait()
        finally:
            self.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_server(
    engine: Engine,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    api_key: str | None = None,
    model_name: str | None = None,
    default_max_tokens: int | None = None,
    owns_engine: bool = False,
    startup_timeout: float = 30.0,
    sampling_policy: SamplingPolicy | None = None,
    routes: Sequence[RouteInstaller] = (),
    upstream: Upstream | None = None,
    upstream_setting: str | None = None,
    tool_parser: str = "hermes",
    roles: Sequence[str] = (),
    limits: RequestLimits | None = None,
) -> ServerHandle:
    """Serve an existing engine in a background thread and return once it accepts connections.

    Args:
        engine: Any `Engine`.
        host: Interface to listen on; the default keeps the server private to this machine.
        port: 0 picks a free port.
        owns_engine: Shut the engine down in `stop()`.
        startup_timeout: Seconds to wait for the server to come up.

    The other arguments are the app's settings, documented once as the fields of the same names of
    `AppOptions` (`lightning_sdk.serving.options`): `api_key` (a random one when not given), `model_name`,
    `default_max_tokens`, `sampling_policy`, `routes`, `upstream`, `upstream_setting`, `tool_parser`,
    `roles` and `limits`. They become one `AppOptions`, handed to `serve_app`.
    """
    options = AppOptions(
        api_key=api_key,
        model_name=model_name,
        default_max_tokens=default_max_tokens,
        sampling_policy=sampling_policy or SamplingPolicy(),
        routes=tuple(routes),
        upstream=upstream,
        upstream_setting=upstream_setting,
        tool_parser=tool_parser,
        roles=tuple(roles),
        limits=limits,
    )
    return serve_app(engine, options, host, port, owns_engine=owns_engine, startup_timeout=startup_timeout)


def serve_app(
    engine: Engine,
    options: AppOptions,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    owns_engine: bool = False,
    startup_timeout: float = 30.0,
) -> ServerHandle:
    """`start_server` with its app's settings as one `AppOptions` (a random key when it has none)."""
    from lightning_sdk.serving.app import create_app

    key = options.api_key or f"sk-local-{secrets.token_urlsafe(24)}"
    options = dataclasses.replace(options, api_key=key)
    background = BackgroundServer.start(
        create_app(engine, options),
        host=host,
        port=port,
        name="lightning-sdk-server",
        startup_timeout=startup_timeout,
        lifespan="off",
        timeout_graceful_shutdown=5,
        timeout_keep_alive=30,
    )
    endpoint = LLMEndpoint(f"{background.url}/v1", key, options.model_name or engine.model.name)
    log.info("serving %s at %s", endpoint.model, endpoint.base_url)
    return ServerHandle(endpoint, engine, owns_engine, background)


def serve(
    model: str | Path | None = None,
    adapter: str | Path | None = None,
    *,
    engine: Literal["auto", "vllm", "transformers"] = "auto",
    host: str = "127.0.0.1",
    port: int = 0,
    api_key: str | None = None,
    block: bool = False,
    default_max_tokens: int | None = None,
    upstream: Upstream | str | None = None,
    tool_parser: str = "hermes",
    store: EpisodeStore | str | os.PathLike[str] | None = None,
    reward_range: tuple[float, float] | None = None,
    passthrough_routes: Sequence[str] | None = None,
    limits: RequestLimits | None = None,
    **engine_options: Any,
) -> ServerHandle:
    """Serve a model (and optionally a trained LoRA adapter) through an OpenAI-compatible endpoint; returns
    a `ServerHandle`, whose `stop()` shuts down the server and its engine (the module docstring has an
    example).

    Args:
        model: `None` (bundled SmolLM2-135M-Instruct), a local Hugging Face folder or a Hub id.
        adapter: A peft LoRA adapter folder (e.g. a training checkpoint) to serve on top of the model, or a
            folder of role adapters (a run with `TrainerConfig(roles=...)`): each role's adapter answers
            the requests with `model="<role>"`, the model's own name gets the base model.
        engine: "auto" (vLLM when installed), "vllm" or "transformers".
        host: Interface to listen on.
        port: Port; 0 picks a free one.
        api_key: Bearer key; random when not given (read it from `handle.endpoint.api_key`).
        block: Serve until Ctrl+C instead of returning the handle right away.
        default_max_tokens: Completion length when a request sets no `max_tokens`.
        upstream: An OpenAI-compatible API for the inference requests this server does not serve
            (`/v1/embeddings`, ...): an `Upstream`, or a base URL whose key is read from `OPENAI_API_KEY`.
            Without one such requests get a 404 that says so.
        tool_parser: The tool-call format the model writes: `"hermes"` (default; the bundled model's) or a
            vLLM `--tool-call-parser` name such as `"llama3_json"`, `"mistral"`, `"qwen3_xml"`.
        store: The episode store your agents record into (`ls.configure(store=...)`), an
            `EpisodeStore` or a path: the server then takes rewards that arrive later at
            `POST /v1/episodes/<id>/feedback` (`lightning_sdk.serving.routes.feedback`).
        reward_range: With `store`, refuse feedback rewards outside `(low, high)`.
        passthrough_routes: The requests passed through to `upstream`, as `"METHOD /v1/path"` (`*` for one
            segment); default `lightning_sdk.PASSTHROUGH_ROUTES`, the inference routes an agent's model
            client calls (`(*ls.PASSTHROUGH_ROUTES, "POST /v1/files")` adds one; `()` passes none). Any
            other request gets a 404 naming this setting.
        limits: What one request may ask: body size, JSON depth, sequences started
            (`lightning_sdk.serving.limits.RequestLimits`; default `RequestLimits()`).
        engine_options: Passed to the engine (`max_model_len`, `dtype`, ...).
    """
    from lightning_sdk.engine.factory import create_engine

    options = AppOptions(
        api_key=api_key,
        default_max_tokens=default_max_tokens,
        upstream=_upstream(upstream, passthrough_routes),
        tool_parser=tool_parser,
        roles=tuple(_roles_served(adapter, engine, engine_options)),
        limits=limits,
    )
    if port:  # a taken port should fail now, not after the model has loaded
        listening_socket(host, port).close()
    # Whoever opens, closes: what is opened goes on the stack as it comes up, so a failure part-way closes
    # it again, newest first; on success the handle owns it all.
    with ExitStack() as opened:
        options = dataclasses.replace(options, routes=_feedback_routes(store, reward_range, opened))
        built = create_engine(model, engine=engine, **engine_options)
        opened.callback(built.shutdown)
        if adapter is not None:
            _load_adapters(built, Path(adapter), list(options.roles))
        handle = serve_app(built, options, host, port)
        handle._opened = opened.pop_all()  # the engine's shutdown among them: the handle owns it
    if block:
        handle.wait()
    return handle


def _upstream(upstream: Upstream | str | None, passthrough_routes: Sequence[str] | None) -> Upstream | None:
    """`serve(upstream=...)` as an `Upstream` (a base URL's key read from `OPENAI_API_KEY`), with the
    routes passed through to it."""
    from lightning_sdk.serving.passthrough.upstream import Upstream

    if isinstance(upstream, str):
        upstream = Upstream(upstream.rstrip("/"), os.environ.get("OPENAI_API_KEY"))
    if passthrough_routes is None:
        return upstream
    if upstream is None:
        raise ValueError(
            "passthrough_routes names routes passed through to an upstream API: name one with "
            "upstream=... (`--upstream URL`), or drop passthrough_routes."
        )
    return dataclasses.replace(upstream, routes=tuple(passthrough_routes))


def _roles_served(adapter: str | Path | None, engine: str, engine_options: dict[str, Any]) -> list[str]:
    """The roles of a folder of role adapters (a run with `TrainerConfig(roles=...)`), each served at once,
    which needs vLLM's LoRA hot-load (set in `engine_options`); `[]` for one adapter or none."""
    roles = role_adapter_names(adapter) if adapter is not None else []
    if roles:
        if engine == "transformers":
            raise ValueError(
                f"{adapter} holds one adapter per role ({', '.join(roles)}); serving them needs the vLLM "
                "engine (engine='vllm' or 'auto' with vLLM installed)."
            )
        engine_options.setdefault("weight_sync", "lora")
        engine_options.setdefault("max_adapters", len(roles))
    return roles


def _load_adapters(engine: Engine, adapter: Path, roles: list[str]) -> None:
    """The adapter (or each role's, from its subfolder) into the engine, versioned by the folder's name."""
    if roles:
        for role in roles:
            engine.load_adapter(adapter / role, version=adapter.name, role=role)
    else:
        engine.load_adapter(adapter, version=adapter.name)


def _feedback_routes(
    store: EpisodeStore | str | os.PathLike[str] | None,
    reward_range: tuple[float, float] | None,
    opened: ExitStack,
) -> tuple[RouteInstaller, ...]:
    """The feedback routes on `store`; a store opened here from a path is closed with `opened` (a store
    the caller passed stays the caller's to close)."""
    if store is None:
        if reward_range is not None:
            raise ValueError("reward_range applies to feedback, which needs store=...: pass both.")
        return ()
    from lightning_sdk.serving.routes.feedback import feedback_routes

    if isinstance(store, EpisodeStore):
        return (feedback_routes(store, reward_range),)
    episodes = EpisodeStore(store)
    opened.callback(episodes.close)
    return (feedback_routes(episodes, reward_range),)
