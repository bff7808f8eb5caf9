"""What a served app is built with besides its engine: `AppOptions`, and the `SamplingPolicy` its owner
changes while it serves.

`serve()` and `start_server()` take their settings as keyword arguments, build one `AppOptions`, and hand it
on unchanged to `create_app` (`lightning_sdk.serving.app`), which reads every field: a new setting is added
in one place, not threaded through three signatures.

`SamplingPolicy` is server-side control of sampling while the trainer owns the endpoint. Agents often ask
for `temperature=0` or a short `max_tokens`; RL needs the rollouts to sample from the policy at the
temperature the loss assumes, and evaluation wants greedy decoding. The trainer sets the policy between
phases; the app applies it to every request. With no overrides set it changes nothing. A request that names
a lane (`lightning_sdk.tracing.routing.LANE_HEADER`) is sampled by that lane's policy in `lanes` instead,
which lets an evaluation and training rollouts share the engine at once.

Light to import (no FastAPI): the serving package imports it at `import lightning_sdk`.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lightning_sdk.engine.types import SamplingParams

if TYPE_CHECKING:
    from lightning_sdk.serving.limits import RequestLimits
    from lightning_sdk.serving.passthrough.upstream import Upstream
    from lightning_sdk.serving.routes.installer import RouteInstaller

__all__ = ["AppOptions", "SamplingPolicy"]


@dataclass
class SamplingPolicy:
    """Overrides applied to every request's sampling parameters (None: keep the request's value)."""

    temperature: float | None = None
    """Forced sampling temperature (0 is greedy)."""
    top_p: float | None = None
    """Forced nucleus sampling threshold."""
    max_tokens: int | None = None
    """Upper bound on `max_tokens` (a request asking for fewer keeps its value)."""
    no_penalties: bool = False
    """Drop requests' presence and frequency penalties: the trainer's loss models plain temperature
    sampling, so its rollouts must come from that distribution."""
    accept_any_model: bool = False
    """Serve requests whatever model name they ask for (agents with a hard-coded model name)."""
    lanes: dict[str, SamplingPolicy] = field(default_factory=dict)
    """The sampling of requests that name a lane (the trainer's `"train"` and `"eval"`); their sampling
    fields replace this policy's, `accept_any_model` stays this policy's."""

    calls_without_lane: int = 0
    """Requests sampled by this policy for naming no lane (or one not in `lanes`) while `lanes` is set: the
    trainer tells from it that an agent calls the endpoint with HTTP code of its own."""
    pinned_adapter: str | None = None
    """The engine adapter that answers every request of this policy's lane, whatever role it names (None:
    the one its role names): the trainer pins an evaluated step's adapter under a name of its own
    (`VLLMEngine.pin_adapter`) so that the evaluation runs on it while training loads newer ones."""

    def answer_with(self, adapter: str | None) -> None:
        """Answer this policy's requests with the pinned adapter `adapter` (None: as their role names)."""
        with self._lock:
            self.pinned_adapter = adapter

    def use_lane(self, lane: str) -> None:
        """Sample requests that name no lane as `lane`'s requests (`set` with that lane's sampling)."""
        chosen = self.lanes[lane]
        self.set(
            temperature=chosen.temperature,
            top_p=chosen.top_p,
            max_tokens=chosen.max_tokens,
            no_penalties=chosen.no_penalties,
        )

    def for_lane(self, lane: str | None) -> SamplingPolicy:
        """The policy that samples a request of `lane` (this one for no lane, or a lane not in `lanes`,
        which `calls_without_lane` counts where lanes are set)."""
        chosen = self.lanes.get(lane) if lane else None
        if chosen is not None:
            return chosen
        if self.lanes:
            with self._lock:
                self.calls_without_lane += 1
        return self

    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    """`set` runs in the owner's thread while requests are served: a request sees one setting whole."""

    def apply(self, params: SamplingParams) -> SamplingParams:
        """The request's parameters with the overrides applied."""
        with self._lock:
            temperature, top_p, max_tokens = self.temperature, self.top_p, self.max_tokens
            no_penalties = self.no_penalties
        changes: dict[str, Any] = {}
        if temperature is not None:
            changes["temperature"] = temperature
        if top_p is not None:
            changes["top_p"] = top_p
        if max_tokens is not None and params.max_tokens > max_tokens:
            changes["max_tokens"] = max_tokens
        if no_penalties and params.penalised:
            changes.update(presence_penalty=0.0, frequency_penalty=0.0)
        return dataclasses.replace(params, **changes) if changes else params

    def adapter_for(self, role_adapter: str | None) -> str | None:
        """The engine adapter that answers a request whose role names `role_adapter` (`pinned_adapter`)."""
        with self._lock:
            return self.pinned_adapter if self.pinned_adapter is not None else role_adapter

    def set(
        self,
        *,
        temperature: float | None = None,
        top_p: float | None = None,
        max_tokens: int | None = None,
        no_penalties: bool = False,
    ) -> None:
        """Replace the sampling overrides (fields not given are cleared)."""
        with self._lock:
            self.temperature, self.top_p, self.max_tokens = temperature, top_p, max_tokens
            self.no_penalties = no_penalties


@dataclass(frozen=True)
class AppOptions:
    """How an app serves its engine (`create_app`); each field is the keyword argument of `start_server`
    of the same name (`serve` takes those a served model needs: `api_key`, `default_max_tokens`,
    `upstream`, `tool_parser`, `limits`)."""

    api_key: str | None = None
    """Bearer key clients must send (`create_app`: None turns authentication off, for trusted local use
    only; `start_server` generates a random key instead)."""
    model_name: str | None = None
    """Name reported by `/v1/models` (default: the engine's model name)."""
    default_max_tokens: int | None = None
    """Completion length when a request sets no `max_tokens` (default: the rest of the context window)."""
    sampling_policy: SamplingPolicy = field(default_factory=lambda: SamplingPolicy())
    """Server-side sampling overrides, which the owner changes while the app serves (the trainer)."""
    routes: tuple[RouteInstaller, ...] = ()
    """More routes behind the same key (`lightning_sdk.serving.routes.installer.RouteInstaller`)."""
    upstream: Upstream | None = None
    """Where the requests of the pass-through routes go (`lightning_sdk.serving.Upstream`)."""
    upstream_setting: str | None = None
    """How the owner names an upstream, at the end of the 404 without one (default: `serve(upstream=...)`
    and `--upstream`)."""
    tool_parser: str = "hermes"
    """The tool-call format the model writes (`lightning_sdk.serving.tools.parsers`)."""
    roles: tuple[str, ...] = ()
    """Roles whose adapters the engine serves: a request picks one with `model="<role>"` (or the
    `x-lightning-role` header)."""
    limits: RequestLimits | None = None
    """What one request may ask on every route (default `RequestLimits()`)."""
