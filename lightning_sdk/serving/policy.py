"""`SamplingPolicy`: server-side control of sampling while the trainer owns the endpoint.

Agents often ask for `temperature=0` or a short `max_tokens`; RL needs the rollouts to sample from the
policy at the temperature the loss assumes, and evaluation wants greedy decoding. The trainer sets the
policy between phases; the app applies it to every request. With no overrides set it changes nothing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from lightning_sdk.engine.types import SamplingParams

__all__ = ["SamplingPolicy"]


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

    def apply(self, params: SamplingParams) -> SamplingParams:
        """The request's parameters with the overrides applied."""
        changes: dict[str, Any] = {}
        if self.temperature is not None:
            changes["temperature"] = self.temperature
        if self.top_p is not None:
            changes["top_p"] = self.top_p
        if self.max_tokens is not None and params.max_tokens > self.max_tokens:
            changes["max_tokens"] = self.max_tokens
        if self.no_penalties and params.penalised:
            changes.update(presence_penalty=0.0, frequency_penalty=0.0)
        return dataclasses.replace(params, **changes) if changes else params

    def set(
        self,
        *,
        temperature: float | None = None,
        top_p: float | None = None,
        max_tokens: int | None = None,
        no_penalties: bool = False,
    ) -> None:
        """Replace the sampling overrides (fields not given are cleared)."""
        self.temperature, self.top_p, self.max_tokens = temperature, top_p, max_tokens
        self.no_penalties = no_penalties
