"""Episodes from runners checked against the policy before training (`training.run.runner_episodes`)."""

from __future__ import annotations

from lightning_sdk.rollouts.in_process import Rollout
from lightning_sdk.tracing.episode import Episode, LLMCall
from lightning_sdk.training.run.runner_episodes import fail_unknown_tokens


def test_a_runner_episode_with_token_ids_the_model_lacks_counts_as_failed(caplog) -> None:
    # The wire checks types; only the trainer knows its vocabulary. An id past it would end the training
    # step's forward pass, so the episode is a failed rollout instead.
    def rollout(prompt: list[int], completion: list[int]) -> Rollout:
        call = LLMCall(prompt_token_ids=prompt, completion_token_ids=completion)
        return Rollout(0, 0, Episode(calls=[call], rewards={"r": 1.0}, metadata={"runner": "r1"}))

    fine, past, negative = rollout([1, 2], [48, 49]), rollout([1, 2], [50]), rollout([-1], [3])
    assert fail_unknown_tokens([fine, past, negative], vocabulary_size=50) == 2
    assert fine.episode.error is None
    for failed, token in ((past, 50), (negative, -1)):
        assert failed.episode.error is not None and failed.episode.error["type"] == "RolloutFailed"
        assert f"token id {token}, outside the model's vocabulary of 50" in failed.episode.error["message"]
    assert "counted as failed" in caplog.text
