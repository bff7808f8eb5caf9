"""The runner protocol's wire: one model per body, bounded where it must be, refusals that say what to send.

The routes and the runner import these same models; the HTTP round trip is in `test_runners.py`.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from pydantic import ValidationError

from lightning_sdk.rollouts import RolloutQueue, RolloutSpec
from lightning_sdk.rollouts.schemas import (
    MAX_LEASE_WAIT_S,
    EpisodeUpload,
    GrantedLease,
    Lease,
    LeaseRequest,
    RewardReport,
    WireBody,
    explain,
)
from lightning_sdk.runner import LeasedRollout
from lightning_sdk.tracing.episode import Episode


def refusal(model: type[WireBody], body: dict[str, Any]) -> Any:
    with pytest.raises(ValidationError) as caught:
        model.model_validate(body)
    return explain(caught.value, model)


def test_a_lease_request_has_defaults_and_a_bounded_long_poll() -> None:
    assert LeaseRequest.model_validate({}) == LeaseRequest(runner="runner", wait_s=0.0)
    assert LeaseRequest.model_validate({"runner": "a", "wait_s": 30}).wait_s == MAX_LEASE_WAIT_S
    too_long = refusal(LeaseRequest, {"wait_s": 999})
    assert (too_long.param, too_long.code) == ("wait_s", "invalid_value")
    assert "less than or equal to 30" in too_long.message  # what is wrong
    assert "from 0 to 30" in too_long.message  # and what to send instead
    for wrong in (True, "5", -1, math.nan):
        assert refusal(LeaseRequest, {"wait_s": wrong}).param == "wait_s"
    assert refusal(LeaseRequest, {"runner": ""}).param == "runner"
    assert refusal(LeaseRequest, {"runner": "r" * 201}).param == "runner"


def test_an_unknown_field_is_named_rather_than_ignored() -> None:
    misspelt = refusal(LeaseRequest, {"runner": "a", "wait": 5})
    assert misspelt.param == "wait"
    assert misspelt.message == "Unknown field 'wait': this body takes runner, wait_s."


def test_a_reward_report_is_finite_and_its_refusals_are_reward_errors() -> None:
    report = RewardReport.model_validate(
        {"lease_id": "l", "reward": 1, "step_rewards": [0.5, None], "output": {"a": [1]}, "name": "curl"}
    )
    assert (report.reward, report.step_rewards, report.error) == (1.0, [0.5, None], None)
    assert RewardReport.model_validate({"lease_id": "l", "reward": 0.0}).name == "gateway"
    high = refusal(RewardReport, {"lease_id": "l", "reward": "high"})
    assert (high.param, high.code) == ("reward", "invalid_reward")
    assert "finite number" in high.message
    # Python's json module reads NaN and Infinity: they are refused, wherever they are.
    for body, param in (
        (json.loads('{"lease_id": "l", "reward": NaN}'), "reward"),
        (json.loads('{"lease_id": "l", "reward": 1, "step_rewards": [1, Infinity]}'), "step_rewards[1]"),
        ({"lease_id": "l", "reward": 1, "step_rewards": [1, "x"]}, "step_rewards[1]"),
        ({"lease_id": "l", "reward": 1, "name": ""}, "name"),
        ({"lease_id": "l", "reward": 1, "error": 3}, "error"),
    ):
        refused = refusal(RewardReport, body)
        assert (refused.param, refused.code) == (param, "invalid_reward"), refused
    missing = refusal(RewardReport, {"reward": 1})
    assert (missing.param, missing.code) == ("lease_id", "invalid_value")
    assert "from POST /v1/rollouts/lease" in missing.message


def test_an_upload_holds_an_episode_as_the_trainer_will_load_it() -> None:
    recorded = Episode(name="solver", task={"q": 1}).to_dict()
    upload = EpisodeUpload.model_validate({"lease_id": "l", "episode": {"name": "solver", "task": {"q": 1}}})
    stored = upload.stored_episode()
    assert stored.keys() == recorded.keys() and stored["name"] == "solver"
    unknown = refusal(EpisodeUpload, {"lease_id": "l", "episode": {"surprise": 1}})
    assert (unknown.param, unknown.code) == ("episode.surprise", "invalid_episode")
    assert unknown.message.startswith("Unknown field 'episode.surprise': this body takes id, name,")
    no_list = refusal(EpisodeUpload, {"lease_id": "l", "episode": {"calls": "no"}})
    assert (no_list.param, no_list.code) == ("episode.calls", "invalid_episode")
    assert no_list.message.endswith("Send episode.calls: a list of LLMCall.to_dict() objects.")
    assert refusal(EpisodeUpload, {"lease_id": "l", "episode": []}).code == "invalid_episode"


@pytest.mark.parametrize(
    ("episode", "param"),
    [
        # The upload that used to end a run: stored, then `fit` failed on it.
        ({"rewards": {"r": "1"}, "metadata": []}, "episode.rewards.r"),
        ({"metadata": []}, "episode.metadata"),
        ({"rewards": {"r": True}}, "episode.rewards.r"),
        (json.loads('{"rewards": {"r": NaN}}'), "episode.rewards.r"),
        (json.loads('{"rewards": {"r": -Infinity}}'), "episode.rewards.r"),
        ({"rewards": {"r": 10**400}}, "episode.rewards.r"),
        ({"rewards": {"": 1}}, "episode.rewards"),
        ({"rewards": {f"r{i}": 1 for i in range(1001)}}, "episode.rewards"),
        ({"calls": [{"prompt_token_ids": ["1"]}]}, "episode.calls[0].prompt_token_ids[0]"),
        ({"calls": [{"completion_token_ids": [-1]}]}, "episode.calls[0].completion_token_ids[0]"),
        ({"calls": [{"logprobs": ["x"]}]}, "episode.calls[0].logprobs[0]"),
        ({"calls": [{"reward": "1"}]}, "episode.calls[0].reward"),
        ({"calls": [{"reward_components": {"c": False}}]}, "episode.calls[0].reward_components.c"),
        ({"calls": [{"metadata": "x"}]}, "episode.calls[0].metadata"),
        ({"calls": [{"surprise": 1}]}, "episode.calls[0].surprise"),
        ({"children": [{"rewards": {"r": "2"}}]}, "episode.children[0].rewards.r"),
        ({"metadata": {"base_url": 3}}, "episode.metadata"),
        ({"error": "boom"}, "episode.error"),
        ({"started_at": "now"}, "episode.started_at"),
        ({"id": "x" * 201}, "episode.id"),
    ],
)
def test_an_episode_is_checked_field_by_field_as_ls_feedback_checks_a_reward(
    episode: dict[str, Any], param: str
) -> None:
    refused = refusal(EpisodeUpload, {"lease_id": "l", "episode": episode})
    assert (refused.param, refused.code) == (param, "invalid_episode"), refused
    assert refused.message.startswith(f"{param}: ") or refused.message.startswith(f"Unknown field '{param}'")


def test_a_finite_reward_is_refused_under_the_same_rule_as_feedback() -> None:
    from lightning_sdk.tracing.rewards.feedback import feedback_problem

    for value in (True, "1", math.nan, math.inf, 10**400, None, [1]):
        upload = {"lease_id": "l", "episode": {"rewards": {"r": value}}}
        assert feedback_problem(value) is not None
        assert refusal(EpisodeUpload, upload).param == "episode.rewards.r"
    for value in (0, -3, 0.25, 10**6):
        assert feedback_problem(value) is None
        upload = EpisodeUpload.model_validate({"lease_id": "l", "episode": {"rewards": {"r": value}}})
        assert upload.stored_episode()["rewards"] == {"r": value}


def test_sub_agents_nest_a_bounded_number_of_levels() -> None:
    from lightning_sdk.rollouts.episode_body import MAX_EPISODE_DEPTH

    def nested(levels: int) -> dict[str, Any]:
        episode: dict[str, Any] = {"name": "leaf"}
        for _ in range(levels - 1):
            episode = {"name": "parent", "children": [episode]}
        return episode

    upload = EpisodeUpload.model_validate({"lease_id": "l", "episode": nested(MAX_EPISODE_DEPTH)})
    assert Episode.from_dict(upload.stored_episode()).children
    too_deep = refusal(EpisodeUpload, {"lease_id": "l", "episode": nested(MAX_EPISODE_DEPTH + 1)})
    assert too_deep.param == "episode" and "deeper than" in too_deep.message


def test_a_recorded_episode_uploads_as_it_was_recorded() -> None:
    from lightning_sdk.tracing.episode import LLMCall

    call = LLMCall(prompt_token_ids=[1, 2], completion_token_ids=[3], logprobs=[-0.5], reward=1)
    recorded = Episode(
        name="solver", calls=[call], rewards={"exact": 1.0}, metadata={"base_url": "http://x/v1"}
    )
    recorded.children.append(Episode(name="helper", rewards={"r": 0}))
    upload = EpisodeUpload.model_validate(
        json.loads(json.dumps({"lease_id": "l", "episode": recorded.to_dict()}))
    )
    assert Episode.from_dict(upload.stored_episode()) == recorded


def test_the_queue_grants_the_wire_lease_and_the_runner_reads_it_back() -> None:
    queue = RolloutQueue(lease_timeout_s=7)
    queue.submit([RolloutSpec("r0", {"question": "2 + 2?"}, policy_version=4)])
    lease = queue.lease("runner-a")
    assert isinstance(lease, Lease)
    granted = GrantedLease.of(lease, "http://10.0.0.5:8123")
    # Every field of the lease travels, whatever fields it has: a new one is added in schemas.py alone.
    assert granted.model_dump(include=set(Lease.model_fields)) == lease.model_dump()
    assert granted.base_url == "http://10.0.0.5:8123/v1"
    assert granted.gateway_base_url == f"http://10.0.0.5:8123/rollouts/r0/{lease.lease_id}/v1"
    read = LeasedRollout.model_validate_json(granted.model_dump_json())
    assert read == granted and read.renew_within_s == 7 and read.policy_version == 4
    # A newer trainer may send more: an older runner reads what it knows.
    assert LeasedRollout.model_validate({**granted.model_dump(), "priority": 3}) == granted


def test_a_lease_carries_the_run_s_roles_and_the_runner_routes_by_them() -> None:
    from lightning_sdk.rollouts.runner.worker import _router
    from lightning_sdk.tracing.routing import Roles

    queue = RolloutQueue(lease_timeout_s=7)
    queue.submit([RolloutSpec("r0", {"question": "2 + 2?"})])
    lease = queue.lease("runner-a")
    assert lease is not None
    roles = Roles(("writer", "checker"), "shared")
    granted = GrantedLease.of(lease, "http://10.0.0.5:8123", {"judge": "keep", ".*": "policy"}, roles)
    read = LeasedRollout.model_validate_json(granted.model_dump_json())
    assert read.roles is not None and read.roles.roles() == roles
    router = _router(read, "sk-run")
    assert router is not None
    assert router.route("gpt-4o", "writer") == ("policy", "writer")
    assert router.route("gpt-4o", "planner") == ("policy", "shared")
    assert router.route("judge", "writer") == ("keep", None)
    assert GrantedLease.of(lease, "http://10.0.0.5:8123").roles is None  # a run without roles
