"""When the policy that samples and the policy that learns disagree: the threshold, and what to say.

Every step measures, over its trained tokens, how far the engine's sampling log-probability is from the
trainer's own (`logp_old`, before the step's update): the `mismatch_*` metrics of
`training/update/loss.py`. With both sides in float32 on a CPU the gap is rounding between two sets of
kernels, 2-3e-6 nats per token (no token off by more than 0.005%); an engine that serves in bfloat16
beside a float32 policy puts it at 0.01-0.05, with single tokens off by a factor of 9, and learning
stalls (issue 59). `MISMATCH_HIGH` sits
between the two (docs/engine.md, "The two policies agree", has the measured rows). A step over it shows
`gap=` on the progress line, and the run warns once with the cause it can see.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["MISMATCH_HIGH", "mismatch_is_expected", "mismatch_is_high", "mismatch_warning"]

MISMATCH_HIGH = 0.005
"""Mean |log(p_trainer / p_engine)| per trained token, in nats, above which a step's gap is high: over a
thousand times what float32 on both sides measured, half the lowest step of a bfloat16 engine beside a
float32 policy (`benchmarks/results/policy_gap.md`)."""


def mismatch_is_expected(engine_dtype: str | None, policy_dtype: str) -> bool:
    """Whether a high gap is what this pairing is known to give rather than a setup mistake: both sides in
    bfloat16 (a GPU's default), where different kernels round differently. The run then says so at INFO,
    with the setting that narrows it, instead of warning on every default GPU run (its size there is not
    measured yet)."""
    return engine_dtype == policy_dtype == "bfloat16"


def mismatch_is_high(metrics: Mapping[str, Any]) -> bool:
    """Whether a step's `mismatch_logratio_abs` is above `MISMATCH_HIGH` (False when not measured)."""
    value = metrics.get("mismatch_logratio_abs")
    return isinstance(value, int | float) and math.isfinite(value) and value > MISMATCH_HIGH


def mismatch_warning(
    step: int, metrics: Mapping[str, Any], engine_dtype: str | None, policy_dtype: str
) -> str:
    """The warning for a step whose gap is high: what was measured, the likeliest cause, and the setting
    that removes it."""
    measured = (
        f"step {step}: the engine's sampling log-probabilities differ from the trainer's own by "
        f"{metrics['mismatch_logratio_abs']:.3f} nats per trained token on average (float32 on both sides: "
        f"about 0.000003; warned above {MISMATCH_HIGH}), "
        f"{_share(metrics.get('mismatch_tail_share'))} of tokens by more than a factor of 2, and the "
        f"importance weights removed {_share(metrics.get('mismatch_signal_removed'))} of the update's "
        "signal. "
        "The engine samples from another policy than the one that learns, and learning slows or stalls "
        "(the mismatch_* metrics follow it every step; docs/engine.md, the two policies agree). "
    )
    if engine_dtype is not None and engine_dtype != policy_dtype:
        return measured + (
            f"Cause: the engine serves in {engine_dtype}, the policy trains in {policy_dtype}. Let the "
            "trainer start the engine (it serves in the policy's dtype), or build it with "
            f"dtype={policy_dtype!r}."
        )
    if policy_dtype == "bfloat16":
        return measured + (
            "Cause: both sides compute in bfloat16, whose rounding differs between the engine's kernels "
            "and the trainer's. On a GPU, TrainerConfig(dtype='float16') runs both in float16 (three more "
            "bits of mantissa), or dtype='float32' where memory allows."
        )
    return measured + (
        "Both sides compute in the same dtype, so look at what else changes the sampled distribution: an "
        "agent that sets top_p, top_k or penalties (the trainer scores the plain distribution at the "
        "call's temperature), or weights that reached the engine late or rounded (weight_sync)."
    )


def _share(value: object) -> str:
    return f"{value:.1%}" if isinstance(value, int | float) and math.isfinite(value) else "n/a"
