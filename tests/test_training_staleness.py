"""How old a group is when it would be trained: its oldest trained call's weights against the step's."""

from __future__ import annotations

import pytest

from lightning_sdk.tracing.episode import Episode, LLMCall
from lightning_sdk.training.algorithm.prepare import prepare_group
from lightning_sdk.training.algorithm.staleness import group_staleness, staleness_metrics, version_number
from lightning_sdk.training.config import TrainerConfig

ENDPOINT = "http://127.0.0.1:9000/v1"


def call(version: object, base_url: str = ENDPOINT) -> LLMCall:
    return LLMCall(
        base_url=base_url,
        prompt_token_ids=[1, 2],
        completion_token_ids=[5, 6],
        logprobs=[-1.0, -1.0],
        policy_version=version,  # type: ignore[arg-type]
    )


def group(*episodes_calls: list[LLMCall]) -> object:
    episodes = [Episode(calls=calls, rewards={"r": float(i)}) for i, calls in enumerate(episodes_calls)]
    return prepare_group(episodes, TrainerConfig(group_size=len(episodes)), endpoint_base_url=ENDPOINT)


def test_a_group_is_as_old_as_its_oldest_trained_call() -> None:
    # Step 5 updates the weights of step 4. One episode began on step 2's weights and ended on step 4's.
    prepared = group([call(2), call(4)], [call(4)])
    assert group_staleness(prepared, current_version=4) == 2  # type: ignore[arg-type]
    fresh = group([call(4)], [call(4)])
    assert group_staleness(fresh, current_version=4) == 0  # type: ignore[arg-type]
    # A call to another server is not trained, so its (absent) version does not age the group.
    mixed = group([call(4), call(None, base_url="https://api.example.com/v1")], [call(4)])
    assert group_staleness(mixed, current_version=4) == 0  # type: ignore[arg-type]


def test_versions_read_as_steps_and_a_foreign_one_is_refused_clearly() -> None:
    assert [version_number(v) for v in (None, 0, 7, "12")] == [0, 0, 7, 12]
    with pytest.raises(ValueError, match="not a step number"):
        version_number("gpt-4o-2024")


def test_the_metrics_count_groups_by_age_and_those_left_out() -> None:
    metrics = staleness_metrics([0, 1, 1, 0], too_old=2, max_staleness=2)
    assert metrics == {
        "groups_too_old": 2.0,
        "staleness_mean": 0.5,
        "staleness_max": 1.0,
        "groups_staleness_0": 2.0,
        "groups_staleness_1": 2.0,
        "groups_staleness_2": 0.0,
    }


def test_a_sample_drawn_by_an_older_adapter_is_weighted_by_the_two_policies_ratio_capped() -> None:
    """The decoupled objective: the engine's recorded log-probabilities come from the adapter that sampled
    (an older one), `logp_old` from the adapter being updated; each token's weight is their ratio, capped."""
    import torch

    from lightning_sdk.training.algorithm.samples import Sample
    from lightning_sdk.training.update.forward.batching import collate
    from lightning_sdk.training.update.forward.logprobs import token_logprobs
    from lightning_sdk.training.update.optim import build_optimizer, build_scheduler
    from lightning_sdk.training.update.step import train_on_samples
    from tests.fixtures.training import tiny_lora_model

    model, config = tiny_lora_model(learning_rate=1e-2, importance_sampling_cap=1.02, max_staleness=1)
    prompt, completion = [1, 2, 3], [4, 5, 6, 7, 8]
    bare = Sample(prompt, completion, [1] * 5, [None] * 5, [1.0] * 5)

    def completion_logprobs() -> torch.Tensor:
        with torch.no_grad():
            values, _ = token_logprobs(model, collate([bare]), with_entropy=False)
        return values[0, : len(completion)].double()

    current = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_B" in n}
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():  # the older adapter: other B matrices on the same base
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 1.0)
    older = completion_logprobs()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name in current:
                parameter.copy_(current[name])
    ratio = torch.exp(completion_logprobs() - older)
    assert ratio.max() > 1.02 and ratio.min() < 1.02  # some tokens are capped, some are not

    stale = Sample(prompt, completion, [1] * 5, [float(v) for v in older], [1.0] * 5, staleness=1)
    # Beside it, a sample drawn by the adapter being updated: weight 1, never capped.
    fresh = Sample(prompt, completion, [1] * 5, [float(v) for v in completion_logprobs()], [1.0] * 5)
    optimizer = build_optimizer(model, config)
    stats = train_on_samples(model, optimizer, build_scheduler(optimizer, config), [stale, fresh], config)
    capped = float((ratio > 1.02).double().sum())
    assert stats["importance_ratio_max"] == pytest.approx(float(ratio.max()), rel=1e-4)
    assert stats["importance_capped_fraction"] == pytest.approx(capped / 10)
    # The gap between engine and trainer is measured on the fresh sample only: the stale one's distance is
    # the update's, not the numerics'.
    assert stats["mismatch_tokens"] == 5 and stats["mismatch_logratio_abs"] < 1e-4
    # The capped share per staleness level: all of it on the sample one update old.
    assert stats["importance_capped_fraction_s1"] == pytest.approx(capped / 5)
    assert stats["importance_capped_fraction_s0"] == 0.0
    assert stats["importance_tokens_s0"] == stats["importance_tokens_s1"] == 5
