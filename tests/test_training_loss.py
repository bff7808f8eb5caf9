"""The policy-gradient loss and token log-probabilities, checked against hand-computed numbers."""

import math

import pytest
import torch

from lightning_sdk.training.batching import collate, token_logprobs
from lightning_sdk.training.loss import LossOptions, policy_loss, token_weights
from lightning_sdk.training.samples import Sample
from tests.fixtures.training import tiny_llama

LOG = math.log


def test_token_weights_for_each_normalisation():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    grpo = token_weights(mask, "grpo", num_sequences=2, num_tokens=3)
    assert grpo.tolist() == [[0.25, 0.25, 0.0], [0.5, 0.0, 0.0]]
    dapo = token_weights(mask, "dapo", num_sequences=2, num_tokens=3)
    assert torch.allclose(dapo, mask / 3)
    dr_grpo = token_weights(mask, "dr_grpo", num_sequences=2, num_tokens=3, length_constant=4)
    assert dr_grpo.tolist() == [[0.125, 0.125, 0.0], [0.125, 0.0, 0.0]]
    with pytest.raises(ValueError, match="normalization='sum' is unknown"):
        token_weights(mask, "sum", 2, 3)


def test_clipping_hand_computed():
    # ratios 1.5, 0.5, 1.1, 0.6 with advantages +1, +1, -1, -1; clip range [0.8, 1.28]:
    # token losses max(-A r, -A clip(r)) = -1.28 (clipped), -0.5, 1.1, 0.8 (clipped); dapo mean = 0.03.
    logprobs = torch.tensor([[LOG(1.5), LOG(0.5), LOG(1.1), LOG(0.6)]], requires_grad=True)
    old = torch.zeros(1, 4)
    advantages = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    weights = token_weights(torch.ones(1, 4), "dapo", 1, 4)
    options = LossOptions(epsilon_low=0.2, epsilon_high=0.28, importance_sampling_cap=None)
    loss, stats = policy_loss(logprobs, old, advantages, weights, options)
    assert loss.item() == pytest.approx(0.03)
    loss.backward()
    # d/dlogp of -A r is -A r; clipped tokens have no gradient.
    assert logprobs.grad.tolist()[0] == pytest.approx([0.0, -0.125, 0.275, 0.0])
    summary = stats.summary()
    assert summary["clip_fraction"] == 0.5
    assert summary["ratio_mean"] == pytest.approx((1.5 + 0.5 + 1.1 + 0.6) / 4)


def test_truncated_importance_sampling_hand_computed():
    # On-policy (ratio 1). Trainer p = 0.5 and 0.25, engine p = 0.25 and 0.5: raw weights 2 and 0.5,
    # capped at 1.5 -> 1.5 and 0.5. Loss = mean(-A * w) = -(1.5 + 0.5) / 2 = -1.
    logprobs = torch.tensor([[LOG(0.5), LOG(0.25)]], requires_grad=True)
    sampling = torch.tensor([[LOG(0.25), LOG(0.5)]])
    weights = token_weights(torch.ones(1, 2), "dapo", 1, 2)
    options = LossOptions(importance_sampling_cap=1.5)
    loss, stats = policy_loss(
        logprobs, logprobs.detach(), torch.ones(1, 2), weights, options, sampling_logprobs=sampling
    )
    assert loss.item() == pytest.approx(-1.0)
    loss.backward()
    assert logprobs.grad.tolist()[0] == pytest.approx([-0.75, -0.25])
    summary = stats.summary()
    assert summary["importance_ratio_mean"] == pytest.approx(1.25)
    assert summary["importance_ratio_max"] == pytest.approx(2.0)
    assert summary["importance_capped_fraction"] == 0.5


def test_tokens_without_engine_logprobs_get_weight_one():
    logprobs = torch.tensor([[LOG(0.5), LOG(0.5)]])
    sampling = torch.tensor([[LOG(0.25), 0.0]])
    known = torch.tensor([[True, False]])
    weights = token_weights(torch.ones(1, 2), "dapo", 1, 2)
    loss, stats = policy_loss(
        logprobs, logprobs, torch.ones(1, 2), weights, LossOptions(importance_sampling_cap=10.0),
        sampling_logprobs=sampling, has_sampling_logprobs=known,
    )  # fmt: skip
    assert loss.item() == pytest.approx(-(2.0 + 1.0) / 2)
    assert stats.is_weight_tokens == 1


def test_k3_kl_to_the_base_model_hand_computed():
    # p = 0.5, p_ref = 0.25: kl = p_ref/p - log(p_ref/p) - 1 = 0.5 + log 2 - 1; gradient (1 - p_ref/p) * beta.
    logprobs = torch.tensor([[LOG(0.5)]], requires_grad=True)
    reference = torch.tensor([[LOG(0.25)]])
    weights = torch.ones(1, 1)
    options = LossOptions(kl_coef=0.1, importance_sampling_cap=None)
    loss, stats = policy_loss(
        logprobs, logprobs.detach(), torch.zeros(1, 1), weights, options, ref_logprobs=reference
    )
    expected_kl = 0.5 + math.log(2) - 1
    assert loss.item() == pytest.approx(0.1 * expected_kl)
    assert stats.summary()["kl"] == pytest.approx(expected_kl)
    loss.backward()
    assert logprobs.grad.item() == pytest.approx(0.05)


def test_each_normalisation_end_to_end():
    logprobs = torch.zeros(2, 2)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    options = LossOptions(importance_sampling_cap=None)
    expected = {"grpo": -1.0, "dapo": -1.0, "dr_grpo": -3 / 8}
    for mode, value in expected.items():
        weights = token_weights(mask, mode, num_sequences=2, num_tokens=3, length_constant=4)
        loss, _ = policy_loss(logprobs, logprobs, torch.ones(2, 2), weights, options)
        assert loss.item() == pytest.approx(value), mode
    # grpo differs from dapo when advantages differ by sequence: (1 + 1)/2/2 + (-1)/2 = 0 vs (2 - 1)/3.
    advantages = torch.tensor([[-1.0, -1.0], [1.0, 0.0]])
    grpo, _ = policy_loss(logprobs, logprobs, advantages, token_weights(mask, "grpo", 2, 3), options)
    dapo, _ = policy_loss(logprobs, logprobs, advantages, token_weights(mask, "dapo", 2, 3), options)
    assert (grpo.item(), dapo.item()) == (pytest.approx(0.0), pytest.approx(1 / 3))


def test_micro_batches_with_global_counts_add_up_to_the_full_batch():
    torch.manual_seed(0)
    logprobs = -torch.rand(3, 4)
    old = logprobs + 0.1 * torch.randn(3, 4)
    advantages = torch.randn(3, 1).expand(3, 4)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.float32)
    options = LossOptions(importance_sampling_cap=None)
    for mode in ("grpo", "dapo", "dr_grpo"):
        full, _ = policy_loss(logprobs, old, advantages, token_weights(mask, mode, 3, 6, 4), options)
        parts = [
            policy_loss(
                logprobs[rows], old[rows], advantages[rows], token_weights(mask[rows], mode, 3, 6, 4), options
            )[0]
            for rows in (slice(0, 2), slice(2, 3))
        ]
        assert full.item() == pytest.approx(sum(part.item() for part in parts)), mode


def test_token_logprobs_match_a_full_log_softmax_and_ignore_padding():
    model = tiny_llama()
    long = Sample([5, 6, 7], [8, 9, 10], [1, 1, 1], [None] * 3, [1.0] * 3, temperature=0.7)
    short = Sample([11], [12, 13], [1, 1], [None] * 2, [1.0] * 2, temperature=0.7)
    batch = collate([long, short])
    with torch.no_grad():
        logprobs, entropy = token_logprobs(model, batch)
        full = torch.log_softmax(model(torch.tensor([long.input_ids])).logits[0] / 0.7, dim=-1)
        alone, _ = token_logprobs(model, collate([short]))
    # long: targets from position start=1 on; token at position p is predicted by logits at p - 1.
    expected = [full[p - 1, token].item() for p, token in enumerate(long.input_ids) if p >= 1]
    assert logprobs[0].tolist() == pytest.approx(expected, abs=1e-5)
    # short alone vs padded in a batch: same values on its own tokens.
    assert logprobs[1, :2].tolist() == pytest.approx(alone[0].tolist(), abs=1e-5)
    probabilities = full.exp()
    expected_entropy = -(probabilities * full).sum(-1)[:-1]
    assert entropy[0].tolist() == pytest.approx(expected_entropy.tolist(), abs=1e-4)
