"""The policy that samples and the policy that learns agree (issue 59): in the default configuration, the
engine's log-probabilities of the tokens it sampled match the trainer's own on the same weights.

The engine is the shared one, started as `Trainer.fit` starts it by default (`tests/fixtures/engine.py`);
the trainer's side is the policy `Trainer.fit` builds (`TrainerConfig()`'s dtype, LoRA settings and
forward pass), with its adapter moved off zero and pushed into the engine as a training step pushes it.
Measured on a CPU with bfloat16 arithmetic, an engine serving in bfloat16 (the default before) was 0.01-0.05
nats per token away, with tokens off by a factor of 9; float32 on both sides is 2-3e-6 apart.
"""

from __future__ import annotations

import pytest
import torch

from lightning_sdk.engine import SamplingParams
from lightning_sdk.engine.placement import plan_placement
from lightning_sdk.training.algorithm.samples import Sample
from lightning_sdk.training.config import TrainerConfig
from lightning_sdk.training.records.policy_gap import MISMATCH_HIGH
from lightning_sdk.training.update.forward.batching import collate
from lightning_sdk.training.update.forward.logprobs import token_logprobs
from lightning_sdk.training.update.lora import build_lora_model, load_base_model, save_adapter
from lightning_sdk.training.update.loss import LossStats, mismatch_sums

pytestmark = [
    pytest.mark.slow,
    # Its tolerance is float32's; a GPU's default pair (bfloat16 on both sides, other kernels) is
    # measured by benchmarks/policy_gap.py there, not held to it.
    pytest.mark.skipif(torch.cuda.is_available(), reason="float32's tolerance; a GPU trains in bfloat16"),
]

QUESTIONS = ["What is 12 + 7?", "Name three colors.", "Write a haiku about the sea.", "What is 3 * 14?"]


def trained_looking_policy(model_path):
    """The policy `Trainer.fit` builds by default, its LoRA `B` matrices drawn small and non-zero, as a few
    steps of training leave them (B starts at zero: the bare base model would test less)."""
    config = TrainerConfig()
    placement = plan_placement()
    base = load_base_model(model_path, placement.training_dtype(config.dtype), device=placement.device)
    policy = build_lora_model(base, config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 2e-3)
    return policy.eval()


def test_engine_and_trainer_log_probabilities_agree_in_the_default_configuration(
    vllm_engine, bundled_model, chat_prompt_ids, tmp_path
) -> None:
    policy = trained_looking_policy(bundled_model.path)
    adapter = save_adapter(policy, tmp_path / "adapter")
    vllm_engine.load_adapter(adapter, version=1)  # merged into the engine as a step's push does
    prompts = [chat_prompt_ids([{"role": "user", "content": question}]) for question in QUESTIONS]
    results = vllm_engine.generate(prompts, SamplingParams(temperature=1.0, max_tokens=32, n=4))
    samples = [
        Sample(
            prompt_ids=result.prompt_token_ids,
            completion_ids=completion.token_ids,
            loss_mask=[1] * len(completion.token_ids),
            sampling_logprobs=list(completion.logprobs),
            advantages=[1.0] * len(completion.token_ids),
        )
        for result in results
        for completion in result.completions
        if completion.token_ids
    ]
    batch = collate(samples)
    with torch.no_grad():
        trainer_logprobs, _ = token_logprobs(policy, batch, with_entropy=False)
    known = batch.has_sampling_logprobs
    stats = LossStats()
    mismatch_sums(
        stats, trainer_logprobs, batch.sampling_logprobs, known, batch.advantages, batch.loss_mask, None
    )
    gap = stats.summary()
    worst = float((trainer_logprobs - batch.sampling_logprobs)[known].abs().max())
    assert stats.mismatch_tokens >= 4 * len(QUESTIONS)  # every completion was compared, token by token
    # The tolerance is float32's: its mean gap is 2-3e-6 nats (MISMATCH_HIGH = 0.005 is a thousand
    # times that) and its worst token 5e-5; bfloat16 serving measured 0.01-0.05 and 2.2. No single
    # token may be off by 1%.
    assert gap["mismatch_logratio_abs"] < MISMATCH_HIGH, gap
    assert worst < 0.01, f"a token's log-probabilities differ by {worst:.4f} nats; {gap}"
    assert gap["mismatch_tail_share"] == 0.0
