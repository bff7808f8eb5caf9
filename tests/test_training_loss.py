"""The policy-gradient loss and token log-probabilities, checked against hand-computed numbers."""

import math

import pytest
import torch

from lightning_sdk.training.algorithm.samples import Sample
from lightning_sdk.training.update.forward.batching import collate
from lightning_sdk.training.update.forward.logprobs import token_logprobs
from lightning_sdk.training.update.loss import LossOptions, policy_loss, token_weights
from tests.fixtures.training import tiny_llama, tiny_lora_model

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


def test_a_stale_samples_tokens_are_weighted_by_the_same_capped_ratio_as_a_fresh_ones():
    # Row 0 was sampled one update ago, row 1 by the weights being updated; the same engine and trainer
    # probabilities in both: weights min(2, 1.5) = 1.5 and 0.5 in each row, whatever its age, so each row's
    # gradient is the fresh one of the test above. Each level counts its own capped token.
    logprobs = torch.tensor([[LOG(0.5), LOG(0.25)], [LOG(0.5), LOG(0.25)]], requires_grad=True)
    sampling = torch.tensor([[LOG(0.25), LOG(0.5)], [LOG(0.25), LOG(0.5)]])
    weights = token_weights(torch.ones(2, 2), "dapo", 2, 2)
    options = LossOptions(importance_sampling_cap=1.5, by_staleness=True)
    loss, stats = policy_loss(
        logprobs,
        logprobs.detach(),
        torch.ones(2, 2),
        weights,
        options,
        sampling_logprobs=sampling,
        staleness=torch.tensor([1, 0]),
    )
    loss.backward()
    assert logprobs.grad.tolist() == [pytest.approx([-0.75, -0.25])] * 2
    summary = stats.summary()
    assert summary["importance_capped_fraction_s1"] == summary["importance_capped_fraction_s0"] == 0.5


def test_tokens_without_engine_logprobs_get_weight_one():
    logprobs = torch.tensor([[LOG(0.5), LOG(0.5)]])
    sampling = torch.tensor([[LOG(0.25), 0.0]])
    known = torch.tensor([[True, False]])
    weights = token_weights(torch.ones(1, 2), "dapo", 1, 2)
    loss, stats = policy_loss(
        logprobs,
        logprobs,
        torch.ones(1, 2),
        weights,
        LossOptions(importance_sampling_cap=10.0),
        sampling_logprobs=sampling,
        has_sampling_logprobs=known,
    )
    assert loss.item() == pytest.approx(-(2.0 + 1.0) / 2)
    assert stats.is_weight_tokens == 1


def test_the_gap_between_engine_and_trainer_hand_computed():
    # Trainer p = 0.4, 0.25, 0.4; engine p = 0.25, 0.4 (unknown for the third token). Ratios r = 1.6 and
    # 0.625: |log r| = log 1.6 each; k3 = r - 1 - log r = 0.6 - log 1.6 and -0.375 + log 1.6; neither is
    # outside [1/2, 2]. Advantages 1 and -3 with dapo weights 1/3: |A|-weights 1/3 and 1; capped at 1.5
    # the weights are 1.5 and 0.625, so the second token loses 0.375 of its signal: 0.375 / (4/3).
    logprobs = torch.tensor([[LOG(0.4), LOG(0.25), LOG(0.4)]])
    sampling = torch.tensor([[LOG(0.25), LOG(0.4), 0.0]])
    known = torch.tensor([[True, True, False]])
    weights = token_weights(torch.ones(1, 3), "dapo", 1, 3)
    advantages = torch.tensor([[1.0, -3.0, 1.0]])
    for cap, removed in ((1.5, 0.375 / (4 / 3)), (None, 0.0)):  # measured with the weight off too
        _, stats = policy_loss(
            logprobs,
            logprobs,
            advantages,
            weights,
            LossOptions(importance_sampling_cap=cap),
            sampling_logprobs=sampling,
            has_sampling_logprobs=known,
        )
        summary = stats.summary()
        assert stats.mismatch_tokens == 2
        assert summary["mismatch_logratio_abs"] == pytest.approx(LOG(1.6))
        assert summary["mismatch_kl"] == pytest.approx((0.6 - 0.375) / 2)
        assert summary["mismatch_tail_share"] == 0.0
        assert summary["mismatch_signal_removed"] == pytest.approx(removed)
    # A factor of 2.5 counts in the tail; without any engine log-probability nothing is measured (NaN).
    _, stats = policy_loss(
        torch.tensor([[LOG(0.5)]]),
        torch.tensor([[LOG(0.5)]]),
        torch.ones(1, 1),
        torch.ones(1, 1),
        LossOptions(),
        sampling_logprobs=torch.tensor([[LOG(0.2)]]),
    )
    assert stats.summary()["mismatch_tail_share"] == 1.0
    _, stats = policy_loss(
        torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), LossOptions()
    )
    assert math.isnan(stats.summary()["mismatch_logratio_abs"])
    assert math.isnan(stats.summary()["mismatch_signal_removed"])


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


def reference_logprobs(model, sample):
    """Straightforward: one unpadded sequence, full log-softmax, completion tokens picked."""
    logits = model(torch.tensor([sample.input_ids])).logits[0] / sample.temperature
    logprobs = torch.log_softmax(logits, dim=-1)
    start = len(sample.prompt_ids)
    return [logprobs[p - 1, token].item() for p, token in enumerate(sample.input_ids) if p >= start]


def padded_samples(temperature=0.7):
    # Two samples share a prompt, one has a shorter prompt (left padding) and a longer completion.
    return [
        Sample([5, 6, 7], [8, 9], [1, 1], [None] * 2, [1.0] * 2, temperature=temperature),
        Sample([11], [12, 13, 14], [1, 1, 1], [None] * 3, [1.0] * 3, temperature=temperature),
        Sample([5, 6, 7], [20], [1], [None], [1.0], temperature=temperature),
    ]


# Temperature 1 takes the path that skips dividing the logits (`Batch.unit_temperature`).
@pytest.mark.parametrize("temperature", [0.7, 1.0])
@pytest.mark.parametrize("layout", ["padded", "cached", "packed"])
def test_token_logprobs_match_unpadded_sequences(layout, temperature):
    model = tiny_llama()
    samples = padded_samples(temperature)
    batch = collate(samples)
    assert batch.unit_temperature == (temperature == 1.0)
    with torch.no_grad():
        logprobs, entropy = token_logprobs(model, batch, layout=layout)
        for row, sample in enumerate(samples):
            size = len(sample.completion_ids)
            assert logprobs[row, :size].tolist() == pytest.approx(reference_logprobs(model, sample), abs=1e-5)
        logits = model(torch.tensor([samples[1].input_ids])).logits[0]
        full = torch.log_softmax(logits / temperature, dim=-1)
    expected_entropy = -(full.exp() * full).sum(-1)[len(samples[1].prompt_ids) - 1 : -1]
    assert entropy[1].tolist() == pytest.approx(expected_entropy.tolist(), abs=1e-4)


def test_shared_prompt_gradients_equal_full_sequence_gradients():
    gradients = []
    for layout in ("padded", "cached"):
        model, _ = tiny_lora_model()
        logprobs, _ = token_logprobs(model, collate(padded_samples()), layout=layout)
        (logprobs * collate(padded_samples()).loss_mask).sum().backward()
        gradients.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert gradients[0].keys() == gradients[1].keys() and gradients[0]
    for name, gradient in gradients[0].items():
        assert torch.allclose(gradient, gradients[1][name], atol=1e-5), name


@pytest.mark.parametrize("layout", ["padded", "cached", "packed"])
def test_chunked_logprobs_equal_whole_logits_in_values_entropy_and_gradients(layout):
    results = []
    for chunk_tokens in (None, 2):  # None: the whole [B, Lc, V] logits at once; 2: one position per chunk
        model, _ = tiny_lora_model()
        batch = collate(padded_samples())
        logprobs, entropy = token_logprobs(model, batch, layout=layout, chunk_tokens=chunk_tokens)
        (logprobs * batch.loss_mask).sum().backward()
        gradients = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((logprobs.detach(), entropy, gradients))
    (whole, whole_entropy, whole_grads), (chunked, chunked_entropy, chunked_grads) = results
    assert torch.allclose(whole, chunked, atol=1e-6)
    assert torch.allclose(whole_entropy, chunked_entropy, atol=1e-6)
    assert whole_grads.keys() == chunked_grads.keys() and whole_grads
    for name, gradient in whole_grads.items():
        assert torch.allclose(gradient, chunked_grads[name], atol=1e-6), name


def test_chunked_logprobs_keep_no_whole_vocabulary_tensor_for_the_backward_pass():
    # What autograd keeps between forward and backward: with chunks under checkpointing, no tensor of the
    # shape [B, Lc, V] (the float32 logits) stays alive for the backward pass.
    model, _ = tiny_lora_model()
    batch = collate(padded_samples())
    vocabulary = model.get_base_model().config.vocab_size
    width = batch.completion_ids.shape[1]  # logits are [B, width (+1), V]; the MLP's are [B, whole length, .]
    for chunk_tokens, expect_logits in ((None, True), (2, False)):
        saved: list[torch.Size] = []

        def keep_shape(tensor: torch.Tensor, saved: list[torch.Size] = saved) -> torch.Tensor:
            saved.append(tensor.shape)
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(keep_shape, lambda tensor: tensor):
            token_logprobs(model, batch, with_entropy=False, layout="padded", chunk_tokens=chunk_tokens)
        kept_logits = [s for s in saved if len(s) == 3 and s[1] in (width, width + 1) and s[2] == vocabulary]
        assert bool(kept_logits) == expect_logits, (chunk_tokens, kept_logits)
