"""Token-level clipped policy-gradient loss with truncated importance sampling and an optional KL term.

For every trained token `t` with advantage `A_t`:

    ratio_t = exp(logp_t - logp_old_t)                        (1 with a gradient, when fully on-policy)
    pg_t    = max(-A_t * ratio_t, -A_t * clip(ratio_t, 1 - eps_low, 1 + eps_high))
    w_t     = min(exp(logp_old_t - logp_engine_t), C)         (truncated importance sampling, no gradient)
    kl_t    = exp(logp_ref_t - logp_t) - (logp_ref_t - logp_t) - 1        (k3 estimator, >= 0)
    loss_t  = w_t * pg_t + beta * kl_t

`logp` is the model being trained, `logp_old` the same model before this step's first update (the
policy the importance ratio is measured against), `logp_engine` what the inference engine reported
when it sampled the token (it differs from `logp_old` through kernels, precision and weight-sync
lag), `logp_ref` the base model (adapter disabled). The token losses are then combined with weights
`weight_t` (see `token_weights`) into `loss = sum_t weight_t * loss_t`:

- `grpo`:    `1 / (n_i * N)`: mean over each sequence's `n_i` trained tokens, then over the `N` sequences;
- `dapo`:    `1 / T`: mean over all `T` trained tokens of the mini-batch;
- `dr_grpo`: `1 / (L * N)`: sum per sequence divided by a constant length `L`, mean over sequences.

`N` and `T` count the whole mini-batch (every micro-batch of one optimizer step), so gradient
accumulation gives the same update as one big batch.

The gap between the two policies (`logp_engine` against `logp_old`, the training-inference mismatch) is
measured on every trained token whose engine log-probability is known, whether or not the weight is on
(`mismatch_sums`): with `r_t = exp(logp_old_t - logp_engine_t)`, the mean `|log r_t|`, the k3 estimate
`E[r - 1 - log r]` of KL(engine || trainer) (the tokens were sampled by the engine, so it is unbiased),
the share of tokens with `r_t` outside [1/2, 2], and the share of the loss's `|A|` weight that the
importance weights took away (`sum weight_t |A_t| (1 - min(w_t, 1)) / sum weight_t |A_t|`). With rollouts
that run on through the update (`LossOptions.by_staleness`) the gap is measured on the samples drawn by the
weights being updated only: an older sample differs by the updates since as well, which the capped share
per staleness level (`importance_capped_fraction_s<k>`) shows instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from lightning_sdk.training.config import TrainerConfig

__all__ = [
    "MISMATCH_TAIL_RATIO",
    "LossOptions",
    "LossStats",
    "capped_by_staleness",
    "mismatch_sums",
    "policy_loss",
    "staleness_summary",
    "token_weights",
]

MISMATCH_TAIL_RATIO = 2.0
"""A token whose ratio `p_trainer / p_engine` is above this or below its inverse counts in
`mismatch_tail_share`: where the two policies disagree by a factor of two on what was sampled."""


@dataclass(frozen=True)
class LossOptions:
    """The loss settings (a subset of `TrainerConfig`)."""

    epsilon_low: float = 0.2
    """Lower clip range of the ratio."""
    epsilon_high: float = 0.28
    """Upper clip range of the ratio."""
    kl_coef: float = 0.0
    """Weight `beta` of the k3 KL term."""
    importance_sampling_cap: float | None = 2.0
    """Cap `C` of the truncated importance weight; `None` disables it."""
    normalization: str = "dapo"
    """`"grpo"`, `"dapo"` or `"dr_grpo"`."""
    dr_grpo_length: int = 256
    """The constant `L` of `dr_grpo`."""
    logit_chunk_tokens: int | None = 512
    """Tokens projected to the vocabulary at once (`update/forward/logprobs.py`)."""
    by_staleness: bool = False
    """Rollouts through the update: count the capped importance weights per sample staleness, and measure
    the `mismatch_*` gap on the samples of the weights being updated (staleness 0) only."""

    @classmethod
    def from_config(cls, config: TrainerConfig) -> LossOptions:
        """Build from a `TrainerConfig`."""
        return cls(
            epsilon_low=config.epsilon_low,
            epsilon_high=config.epsilon_high,
            kl_coef=config.kl_coef,
            importance_sampling_cap=config.importance_sampling_cap,
            normalization=config.loss_normalization,
            dr_grpo_length=config.dr_grpo_length or config.max_tokens,
            logit_chunk_tokens=config.logit_chunk_tokens,
            by_staleness=config.max_staleness >= 1,
        )


@dataclass
class LossStats:
    """Sums over trained tokens, accumulated over micro-batches; `summary()` turns them into metrics."""

    tokens: float = 0.0
    clipped: float = 0.0
    ratio_sum: float = 0.0
    is_weight_tokens: float = 0.0
    is_ratio_sum: float = 0.0
    is_ratio_max: float = 0.0
    is_capped: float = 0.0
    kl_sum: float = 0.0
    entropy_sum: float = 0.0
    loss: float = 0.0
    mismatch_tokens: float = 0.0
    mismatch_abs_sum: float = 0.0
    mismatch_kl_sum: float = 0.0
    mismatch_tail: float = 0.0
    signal_sum: float = 0.0
    signal_removed_sum: float = 0.0
    capped_by_staleness: dict[int, tuple[float, float]] = field(default_factory=dict)
    """Per sample staleness: (tokens whose importance weight was capped, tokens weighted)."""

    def add(self, other: LossStats) -> None:
        """Accumulate another micro-batch's sums."""
        for name in vars(self):
            if name == "is_ratio_max":
                self.is_ratio_max = max(self.is_ratio_max, other.is_ratio_max)
            elif name == "capped_by_staleness":
                for age, (capped, tokens) in other.capped_by_staleness.items():
                    before = self.capped_by_staleness.get(age, (0.0, 0.0))
                    self.capped_by_staleness[age] = (before[0] + capped, before[1] + tokens)
            else:
                setattr(self, name, getattr(self, name) + getattr(other, name))

    def summary(self) -> dict[str, float]:
        """Per-token means: clip fraction, PPO ratio, importance ratio (mean, max, capped fraction), KL,
        entropy, the gap between the engine's and the trainer's policy (`mismatch_*`, NaN when no token
        had an engine log-probability), and the summed loss."""
        tokens = max(self.tokens, 1.0)
        weighted = max(self.is_weight_tokens, 1.0)
        compared = self.mismatch_tokens or math.nan
        return {
            "loss": self.loss,
            "clip_fraction": self.clipped / tokens,
            "ratio_mean": self.ratio_sum / tokens,
            "importance_ratio_mean": self.is_ratio_sum / weighted if self.is_weight_tokens else 1.0,
            "importance_ratio_max": self.is_ratio_max if self.is_weight_tokens else 1.0,
            "importance_capped_fraction": self.is_capped / weighted,
            "kl": self.kl_sum / tokens,
            "entropy": self.entropy_sum / tokens,
            "trained_tokens": self.tokens,
            "mismatch_tokens": self.mismatch_tokens,
            "mismatch_logratio_abs": self.mismatch_abs_sum / compared,
            "mismatch_kl": self.mismatch_kl_sum / compared,
            "mismatch_tail_share": self.mismatch_tail / compared,
            "mismatch_signal_removed": (
                self.signal_removed_sum / self.signal_sum if self.signal_sum else 0.0 * compared
            ),
            **staleness_summary(self.capped_by_staleness),
        }


def staleness_summary(capped_by_staleness: dict[int, tuple[float, float]]) -> dict[str, float]:
    """`importance_capped_fraction_s<k>` (the share of weighted tokens of samples k updates old whose
    importance weight was capped) and `importance_tokens_s<k>` (those tokens), for each k seen."""
    metrics: dict[str, float] = {}
    for age, (capped, tokens) in sorted(capped_by_staleness.items()):
        metrics[f"importance_capped_fraction_s{age}"] = capped / tokens if tokens else math.nan
        metrics[f"importance_tokens_s{age}"] = tokens
    return metrics


def capped_by_staleness(
    raw: torch.Tensor, known: torch.Tensor, cap: float, staleness: torch.Tensor
) -> dict[int, tuple[float, float]]:
    """Per staleness level of the rows (`staleness` `[B]`): the tokens with a known engine log-probability
    whose raw importance ratio `raw` (`[B, W]`) is above `cap`, and those tokens."""
    capped_rows = ((raw > cap) & known).sum(dim=1)
    tokens_rows = known.sum(dim=1)
    counts = {
        int(age): (float(capped_rows[staleness == age].sum()), float(tokens_rows[staleness == age].sum()))
        for age in torch.unique(staleness).tolist()
    }
    return {age: (capped, tokens) for age, (capped, tokens) in counts.items() if tokens}


def token_weights(
    loss_mask: torch.Tensor,
    normalization: str,
    num_sequences: int,
    num_tokens: int,
    length_constant: int = 256,
) -> torch.Tensor:
    """Weight of each token in the loss sum (see the module docstring); 0 where `loss_mask` is 0.

    Args:
        loss_mask: `[B, W]` 1 for trained tokens.
        normalization: `"grpo"`, `"dapo"` or `"dr_grpo"`.
        num_sequences: sequences with trained tokens in the whole mini-batch (`N`).
        num_tokens: trained tokens in the whole mini-batch (`T`).
        length_constant: `L` for `dr_grpo`.
    """
    mask = loss_mask.float()
    if normalization == "grpo":
        per_sequence = mask.sum(dim=1, keepdim=True).clamp(min=1.0)
        return mask / per_sequence / max(num_sequences, 1)
    if normalization == "dapo":
        return mask / max(num_tokens, 1)
    if normalization == "dr_grpo":
        return mask / (length_constant * max(num_sequences, 1))
    raise ValueError(f"normalization={normalization!r} is unknown; use 'grpo', 'dapo' or 'dr_grpo'.")


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    options: LossOptions,
    sampling_logprobs: torch.Tensor | None = None,
    has_sampling_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    staleness: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """The loss of one micro-batch (all tensors `[B, W]`, `staleness` `[B]`) and its statistics.

    `weights` come from `token_weights` and are 0 on untrained tokens. `old_logprobs` must not carry
    a gradient; pass `logprobs.detach()` when the samples were not used for an update yet. With
    `options.by_staleness` and `staleness`, the capped importance weights are also counted per level.
    """
    mask = weights > 0
    ratio = torch.exp(logprobs - old_logprobs)
    clipped_ratio = torch.clamp(ratio, 1.0 - options.epsilon_low, 1.0 + options.epsilon_high)
    unclipped_loss = -advantages * ratio
    clipped_loss = -advantages * clipped_ratio
    token_loss = torch.maximum(unclipped_loss, clipped_loss)
    stats = LossStats(tokens=float(mask.sum()))
    stats.clipped = float(((clipped_loss > unclipped_loss) & mask).sum())
    stats.ratio_sum = float(ratio.detach()[mask].sum())

    if sampling_logprobs is not None:
        known = mask if has_sampling_logprobs is None else mask & has_sampling_logprobs
        importance = None
        if options.importance_sampling_cap is not None:
            raw = torch.exp(old_logprobs.detach() - sampling_logprobs)
            importance = torch.where(
                known, raw.clamp(max=options.importance_sampling_cap), torch.ones_like(raw)
            )
            token_loss = token_loss * importance
            stats.is_weight_tokens = float(known.sum())
            if stats.is_weight_tokens:
                stats.is_ratio_sum = float(raw[known].sum())
                stats.is_ratio_max = float(raw[known].max())
                stats.is_capped = float((raw[known] > options.importance_sampling_cap).sum())
                if options.by_staleness and staleness is not None:
                    cap = options.importance_sampling_cap
                    stats.capped_by_staleness = capped_by_staleness(raw, known, cap, staleness)
        # The gap between the two policies is the numerics' alone on samples of the weights being updated;
        # an older sample also differs by the updates since (`importance_capped_fraction_s<k>` shows those).
        fresh = known & (staleness == 0)[:, None] if options.by_staleness and staleness is not None else known
        mismatch_sums(stats, old_logprobs.detach(), sampling_logprobs, fresh, advantages, weights, importance)

    if ref_logprobs is not None:
        log_ratio = ref_logprobs - logprobs
        kl = torch.exp(log_ratio) - log_ratio - 1.0
        stats.kl_sum = float(kl.detach()[mask].sum())
        if options.kl_coef:
            token_loss = token_loss + options.kl_coef * kl

    if entropy is not None:
        stats.entropy_sum = float(entropy.detach()[mask].sum())
    # where() rather than a product, so a non-finite value on a padding position cannot leak in (0 * inf).
    loss = torch.where(mask, token_loss * weights, torch.zeros_like(token_loss)).sum()
    stats.loss = float(loss.detach())
    return loss, stats


def mismatch_sums(
    stats: LossStats,
    old_logprobs: torch.Tensor,
    sampling_logprobs: torch.Tensor,
    known: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    importance: torch.Tensor | None,
) -> None:
    """Add one micro-batch's sums of the gap between the trainer's policy (`old_logprobs`, before this
    step's updates) and the engine's (`sampling_logprobs`) over the `known` tokens to `stats`; with
    `importance` (the truncated weights applied), also how much of the `weights * |advantages|` signal
    they took away. See the module docstring for the definitions."""
    if not bool(known.any()):
        return
    log_ratio = (old_logprobs - sampling_logprobs)[known].double()
    stats.mismatch_tokens += float(known.sum())
    stats.mismatch_abs_sum += float(log_ratio.abs().sum())
    # k3: r - 1 - log r >= 0 for every token (expm1 keeps the small gaps of float32 from cancelling).
    stats.mismatch_kl_sum += float((torch.expm1(log_ratio) - log_ratio).sum())
    stats.mismatch_tail += float((log_ratio.abs() > math.log(MISMATCH_TAIL_RATIO)).sum())
    signal = (weights * advantages.abs())[known].double()
    stats.signal_sum += float(signal.sum())
    if importance is not None:
        removed = (1.0 - importance[known].double()).clamp(min=0.0)
        stats.signal_removed_sum += float((signal * removed).sum())
