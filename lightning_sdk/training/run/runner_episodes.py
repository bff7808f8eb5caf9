"""Episodes from runners, checked against the policy before training: token ids the model does not have.

The runner protocol checks every uploaded field's type at the edge (`lightning_sdk.rollouts.episode_body`),
but only the trainer knows its model's vocabulary. A token id past the embedding table would fail the
training step's forward pass (an index error on a CPU, a device-side assert on a GPU) and end the run; an
episode that holds one is counted as a failed rollout instead, with a warning, and the step goes on.
"""

from __future__ import annotations

import logging

from lightning_sdk.rollouts.in_process import Rollout

__all__ = ["fail_unknown_tokens"]

log = logging.getLogger("lightning_sdk.training")


def fail_unknown_tokens(rollouts: list[Rollout], vocabulary_size: int) -> int:
    """Mark every rollout whose episode holds a token id outside `range(vocabulary_size)` as failed (its
    `error`); returns how many were."""
    failed = 0
    for rollout in rollouts:
        episode = rollout.episode
        if episode.error is not None:
            continue
        bad = next(
            (
                (call.id, token)
                for call in episode.all_calls()
                for token in (*(call.prompt_token_ids or ()), *(call.completion_token_ids or ()))
                if not 0 <= token < vocabulary_size
            ),
            None,
        )
        if bad is None:
            continue
        message = (
            f"call {bad[0]} holds token id {bad[1]}, outside the model's vocabulary of {vocabulary_size}: "
            "not an episode this model sampled"
        )
        episode.error = {"type": "RolloutFailed", "message": message, "traceback": ""}
        log.warning(
            "episode %s from runner %s: %s; counted as failed",
            episode.id,
            episode.metadata.get("runner"),
            message,
        )
        failed += 1
    return failed
