"""How old a group's samples are when it would be trained, and the rule that leaves too old ones out.

With rollouts that run on through the update (`TrainerConfig.max_staleness`), a group can hold calls
sampled by older weights than the ones being updated. Each recorded call carries the version of the weights
that answered it (`LLMCall.policy_version`: the step whose adapter was loaded, None for the base model or
the starting adapter). A group's staleness is how many updates its oldest trained call is behind the
weights the step updates; with `max_staleness=0` it is always 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning_sdk.training.algorithm.prepare import PreparedGroup
from lightning_sdk.training.algorithm.samples import Sample

__all__ = ["group_staleness", "staleness_metrics", "stamp_sample_staleness", "version_number"]


def version_number(version: Any) -> int:
    """A weight version as the step number it names: None (base model, starting adapter) is step 0."""
    if version is None:
        return 0
    if isinstance(version, bool):
        raise ValueError(f"Internal error: a weight version cannot be {version!r}.")
    if isinstance(version, int):
        return version
    if isinstance(version, str) and version.isdigit():
        return int(version)
    raise ValueError(
        f"A trained call reports weight version {version!r}, which is not a step number; rollouts that run "
        "on through the update need the trainer's own endpoint, which numbers its weights by step."
    )


def group_staleness(group: PreparedGroup, current_version: int) -> int:
    """Updates between the oldest weights that sampled one of the group's trained calls and
    `current_version` (the weights this step updates); 0 for a group without trained calls."""
    versions = [version_number(call.policy_version) for calls in group.calls for call in calls]
    return max(0, current_version - min(versions)) if versions else 0


def staleness_metrics(ages: Sequence[int], too_old: int, max_staleness: int) -> dict[str, float]:
    """The step's `groups_too_old`, the trained groups' mean and largest staleness, and how many trained
    groups were each number of updates old (`groups_staleness_<k>`, k = 0..max_staleness)."""
    metrics: dict[str, float] = {"groups_too_old": float(too_old)}
    if ages:
        metrics["staleness_mean"] = sum(ages) / len(ages)
        metrics["staleness_max"] = float(max(ages))
    for age in range(max_staleness + 1):
        metrics[f"groups_staleness_{age}"] = float(sum(1 for a in ages if a == age))
    return metrics


def stamp_sample_staleness(
    samples: Sequence[Sample], groups: Sequence[PreparedGroup], current_version: int
) -> None:
    """Set each sample's `staleness`: how many updates its oldest call (of `groups`, which it was built
    from) is behind `current_version`, the weights the step updates. The loss counts the capped importance
    weights per level with it, and measures the gap between the two policies on the fresh ones only."""
    calls = [call for group in groups for episode_calls in group.calls for call in episode_calls]
    versions = {call.id: version_number(call.policy_version) for call in calls}
    for sample in samples:
        sample.staleness = max(0, current_version - min(versions[call_id] for call_id in sample.call_ids))
