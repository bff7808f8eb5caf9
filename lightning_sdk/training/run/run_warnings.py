"""The warnings a run gives once: each says what went unused or was left out, and how to fix it.

A run repeats the same situation every step (a long sample, a role no agent plays), so each warning is
given the first time it applies and never again; the step metrics keep counting (`samples_dropped_too_long`,
`calls/<role>`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lightning_sdk.tracing.routing import Router
from lightning_sdk.training.records.policy_gap import mismatch_is_expected, mismatch_is_high, mismatch_warning

__all__ = ["RunWarnings", "warn_if_dtypes_differ"]

log = logging.getLogger("lightning_sdk.training")

FEW_STEP_GROUPS = 0.02
"""A `step_group_share` below this counts as a step where `credit="step"` found no shared state."""
STEPS_BEFORE_WARNING = 3
"""How many such steps in a row before the warning: one step's groups may just have diverged early."""


@dataclass
class RunWarnings:
    """What a run has warned about already."""

    checked_routes: bool = False
    """`config.routes` was checked against the calls of the first rollouts."""
    warned_too_long: bool = False
    """Samples over `config.max_sample_tokens` were warned about."""
    warned_idle_roles: set[str] = field(default_factory=set)
    """Roles already warned about making no call in a step."""
    steps_without_step_groups: int = 0
    """Consecutive steps under `credit="step"` whose `step_group_share` was below `FEW_STEP_GROUPS`."""
    warned_step_groups: bool = False
    warned_policy_gap: bool = False
    """A step's engine and trainer policies were found apart (`mismatch_is_high`)."""

    def policy_gap(
        self, step: int, step_metrics: Mapping[str, Any], engine_dtype: str | None, policy_dtype: str
    ) -> None:
        """The first step whose gap between the engine's sampling log-probabilities and the trainer's is
        high: say what it measured, the cause it can see and the setting that removes it (once; the
        `mismatch_*` metrics and the progress line's `gap=` keep showing it)."""
        if self.warned_policy_gap or not mismatch_is_high(step_metrics):
            return
        self.warned_policy_gap = True
        level = logging.INFO if mismatch_is_expected(engine_dtype, policy_dtype) else logging.WARNING
        log.log(level, "%s", mismatch_warning(step, step_metrics, engine_dtype, policy_dtype))

    def unused_routes(self, routes: object, router: Router | None) -> None:
        """After the run's first rollouts: say which keys of `routes` selected no call, with the models the
        agent did call (a typo in a model name would otherwise train nothing, silently)."""
        if self.checked_routes or routes is None or router is None:
            return
        self.checked_routes = True
        unused = router.unused_keys()
        if unused:
            seen = ", ".join(repr(model) for model in router.models_seen()) or "none"
            log.warning(
                "routes: %s selected no call of the first rollouts; the agent called the models %s. "
                "Check the names in TrainerConfig(routes=...).",
                ", ".join(repr(key) for key in unused),
                seen,
            )

    def samples_too_long(self, dropped: int, max_sample_tokens: int | None) -> None:
        if dropped and not self.warned_too_long:
            self.warned_too_long = True
            log.warning(
                "%d training sample(s) are longer than max_sample_tokens=%d and were left out of the update "
                "(the metric samples_dropped_too_long counts them each step). Raise max_sample_tokens if "
                "memory allows, or shorten the agent's conversations (fewer turns, shorter tool output).",
                dropped,
                max_sample_tokens,
            )

    def idle_roles(self, idle: Iterable[str], step_metrics: Mapping[str, Any]) -> None:
        """A role whose calls were all in groups without a reward spread trains nothing this step, as any
        call would; a role no call was answered by is a name that matches no agent, or an agent whose
        name was not known when its request was made: say so, once."""
        silent = [role for role in idle if not step_metrics.get(f"calls/{role}")]
        new_silent = [role for role in silent if role not in self.warned_idle_roles]
        if new_silent:
            self.warned_idle_roles.update(new_silent)
            roles = [key.removeprefix("calls/") for key in step_metrics if key.startswith("calls/")]
            others = "no role trained" if set(roles) <= set(silent) else "the other roles trained"
            log.warning(
                "role(s) %s had no call answered by their adapter this step; %s. Check that an agent of "
                "that name calls the model and is named when the request is made (our integrations name "
                "a framework's calls as they start; a call named only afterwards is answered by the base "
                "model), or route its calls with TrainerConfig(routes={'agent:<name>': '<role>'}) (the "
                "metric calls/<role> counts each role's calls; warned once per role).",
                ", ".join(repr(role) for role in new_silent),
                others,
            )

    def few_step_groups(self, step_metrics: Mapping[str, Any]) -> None:
        """Under `credit="step"`: when, `STEPS_BEFORE_WARNING` steps in a row, almost no trained call shared
        its state with another sample's call (the root group of first calls aside), the rule is acting as
        `"equal"`; say so once, and point at `state_key`."""
        share = step_metrics.get("step_group_share")
        if not isinstance(share, (int, float)) or share != share:  # not under "step", or no call trained
            return
        self.steps_without_step_groups = self.steps_without_step_groups + 1 if share < FEW_STEP_GROUPS else 0
        if self.steps_without_step_groups < STEPS_BEFORE_WARNING or self.warned_step_groups:
            return
        self.warned_step_groups = True
        log.warning(
            'credit="step": for %d steps in a row, %.0f%% of trained calls shared their state with another '
            'sample\'s call beyond the first call, so the rule is acting as "equal" (each call is valued by '
            "its episode; only the first call is also compared). Exact prompt token ids rarely repeat "
            "when prompts carry a timestamp, a request id or earlier sampled text: give "
            "TrainerConfig(state_key=fn) a key of what decides a call's situation, such as its last tool "
            "result (docs/trainer.md, step-level credit; the metric step_group_share counts it each step).",
            self.steps_without_step_groups,
            100 * share,
        )


def warn_if_dtypes_differ(engine_dtype: object, policy_dtype: str, whose: str) -> None:
    """Say at the start, once, when the engine will sample in another dtype than the policy learns in:
    the gap between the two policies (metrics `mismatch_*`) then comes from rounding, not learning."""
    if engine_dtype is None or str(engine_dtype) == policy_dtype:
        return
    log.warning(
        "%s serves in %s while the policy trains in %s: the engine's sampling log-probabilities will differ "
        "from the trainer's by rounding (the mismatch_* metrics measure it), which slows learning (docs/"
        "engine.md, the two policies agree). Let the trainer start the engine (it serves in %s), or build it "
        "with dtype=%r.",
        whose,
        engine_dtype,
        policy_dtype,
        policy_dtype,
        policy_dtype,
    )
