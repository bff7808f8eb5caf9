"""credit="step": step groups, returns to go and advantages on small groups computed by hand."""

import json
import math
from typing import Any

import pytest

from lightning_sdk.tracing.episode import Episode, LLMCall
from lightning_sdk.tracing.store import EpisodeStore
from lightning_sdk.training.algorithm.advantages import group_advantages
from lightning_sdk.training.algorithm.call_credit import CALL_CREDIT_KEYS, call_credit
from lightning_sdk.training.algorithm.prepare import prepare_group, samples_from_groups
from lightning_sdk.training.algorithm.step_credit import (
    episode_total,
    prompt_state,
    step_credit,
    step_groups,
)
from lightning_sdk.training.config import TrainerConfig

ENDPOINT = "http://127.0.0.1:9000/v1"
P0, P1, P2, P3 = [1, 2], [1, 2, 7, 3], [1, 2, 8, 3], [1, 2, 7, 3, 9, 4]


def call(t: float, prompt: list[int], reward: float | None = None, **fields: Any) -> LLMCall:
    made = LLMCall(
        started_at=t,
        base_url=fields.pop("base_url", ENDPOINT),
        prompt_token_ids=list(prompt),
        completion_token_ids=[5, 6],
        logprobs=[-1.0, -1.0],
        **fields,
    )
    if reward is not None:
        made.add_reward(reward)
    return made


def episode(reward: float, calls: list[LLMCall], name: str = "agent") -> Episode:
    return Episode(name=name, calls=calls, rewards={"score": reward})


def flat(rows: Any) -> list[Any]:
    return [value for row in rows for value in row]


def test_step_groups_of_three_two_and_one_by_hand() -> None:
    # A and B share their second state (P1), C's second state (P2) is its own; every first call is P0.
    group = [
        episode(1.0, [call(1, P0), call(2, P1)]),  # A
        episode(0.0, [call(1, P0), call(2, P1)]),  # B
        episode(1.0, [call(1, P0), call(2, P2)]),  # C
    ]
    calls = [list(e.calls) for e in group]
    assert step_groups(group, calls) == [[0, 1], [0, 1], [0, 2]]
    result = step_credit(group, calls, scale=False)
    # Totals 1, 0, 1: mean 2/3, so the episode parts are 1/3, -2/3, 1/3 (no std scaling here).
    assert flat(result.parts.episode_part) == pytest.approx([1 / 3, 1 / 3, -2 / 3, -2 / 3, 1 / 3, 1 / 3])
    # Root group {A1, B1, C1}: return minus the mean of the two others: 1 - 1/2, 0 - 1, 1 - 1/2.
    # {A2, B2}: 1 - 0 and 0 - 1. C2 alone: 0.
    assert result.parts.step_part == [[0.5, 1.0], [-1.0, -1.0], [0.5, 0.0]]
    assert flat(result.advantages) == pytest.approx([5 / 6, 4 / 3, -5 / 3, -5 / 3, 5 / 6, 1 / 3])
    assert result.parts.group_sizes == [[3, 2], [3, 2], [3, 1]]
    # The root group is the episode group again: not counted as shared. Only {A2, B2} is.
    assert result.parts.shared == [[False, True], [False, True], [False, False]]

    half = step_credit(group, calls, scale=False, weight=0.5)
    assert flat(half.advantages) == pytest.approx([7 / 12, 5 / 6, -7 / 6, -7 / 6, 7 / 12, 1 / 3])


def test_step_rewards_are_compared_inside_step_groups_with_the_discount() -> None:
    group = [
        episode(1.0, [call(1, P0, reward=0.5), call(2, P1)]),  # A: T = 1.5, G = [0.5 + 0.5 * 1, 1]
        episode(0.0, [call(1, P0), call(2, P1, reward=0.2)]),  # B: T = 0.2, G = [0.5 * 0.2, 0.2]
        episode(0.0, [call(1, P0), call(2, P1), call(3, P3)]),  # C: T = 0, G = [0, 0, 0]
    ]
    calls = [list(e.calls) for e in group]
    assert [episode_total(e, c) for e, c in zip(group, calls)] == [1.5, 0.2, 0.0]
    result = step_credit(group, calls, gamma=0.5, scale=False)
    assert flat(result.rewards) == pytest.approx([1.0, 1.0, 0.1, 0.2, 0.0, 0.0, 0.0])
    mean_total = 1.7 / 3
    assert flat(result.parts.episode_part) == pytest.approx(
        [1.5 - mean_total] * 2 + [0.2 - mean_total] * 2 + [-mean_total] * 3
    )
    # P0 (root): 1 - (0.1 + 0) / 2, 0.1 - (1 + 0) / 2, 0 - (1 + 0.1) / 2; P1: 1 - 0.1, 0.2 - 0.5, 0 - 0.6.
    assert flat(result.parts.step_part) == pytest.approx([0.95, 0.9, -0.4, -0.3, -0.55, -0.6, 0.0])
    assert result.parts.shared == [[False, True], [False, True], [False, True, False]]


def test_without_step_rewards_the_episode_part_is_todays_equal_advantage() -> None:
    group = [
        episode(1.0, [call(1, P0), call(2, P1), call(3, P3)]),
        episode(0.0, [call(1, P0)]),
        episode(0.0, [call(1, P0), call(2, P2)]),
        episode(1.0, [call(1, P0), call(2, P1)]),
    ]
    calls = [list(e.calls) for e in group]
    equal, _ = group_advantages([[e.reward] * len(c) for e, c in zip(group, calls)])
    result = step_credit(group, calls)
    assert equal is not None and flat(result.parts.episode_part) == pytest.approx(flat(equal))
    # Scaled runs divide the step part by the same group std (+ eps): the totals' std is 0.5.
    assert result.parts is not None
    assert result.parts.step_part[0][1] == pytest.approx((1 - 1) / (0.5 + 1e-4))  # P1: A and D both succeeded
    assert result.parts.step_part[0][0] == pytest.approx(
        (1 - 1 / 3) / (0.5 + 1e-4)
    )  # root: 1 - mean(0, 0, 1)


def test_state_value_credits_a_call_by_the_state_it_led_to() -> None:
    # Four samples: two reach state A (P1) and split there, one reaches B (P2), one C (P3 as a plain key).
    a, b, c = P1, P2, [1, 2, 9, 3]
    group = [
        episode(1.0, [call(1, P0), call(2, a)]),
        episode(0.0, [call(1, P0), call(2, a)]),
        episode(0.0, [call(1, P0), call(2, b)]),
        episode(1.0, [call(1, P0), call(2, c)]),
    ]
    calls = [list(e.calls) for e in group]
    result = step_credit(group, calls, scale=False, estimate="state_value")
    assert result.advantages is not None
    # First calls are valued by the state they led to: V(A) = (1 + 0) / 2, V(B) = 0, V(C) = 1, each against
    # the mean of the other three. The two that reached A did as well as the rest: 0, whatever came after.
    first = [row[0] for row in result.advantages]
    assert first == pytest.approx([0.0, 0.0, 0 - (0.5 + 0.5 + 1) / 3, 1 - (0.5 + 0.5 + 0) / 3])
    # In A the two second calls are compared with each other (no episode part); B and C are alone in their
    # states and keep the episode advantage (totals 1, 0, 0, 1: mean 0.5).
    assert [row[1] for row in result.advantages] == pytest.approx([1.0, -1.0, -0.5, 0.5])
    assert result.parts is not None and [row[1] for row in result.parts.episode_part] == [
        0.0,
        0.0,
        -0.5,
        0.5,
    ]
    with pytest.raises(ValueError, match="step_estimate='value'"):
        step_credit(group, calls, estimate="value")
    # The trainer's path: TrainerConfig(step_estimate=...) reaches the rule, and each episode keeps its
    # episode advantage in its metadata though the calls in shared states were not given it.
    config = TrainerConfig(credit="step", step_estimate="state_value", scale_advantages=False)
    assert flat(prepare_group(group, config, endpoint_base_url=ENDPOINT).advantages) == pytest.approx(
        flat(result.advantages)
    )
    assert [e.metadata["advantage"] for e in group] == pytest.approx([0.5, -0.5, -0.5, 0.5])
    assert group[0].calls[0].metadata["step_estimate"] == "state_value"


def test_state_value_keeps_the_episode_advantage_of_a_state_only_its_own_episode_reached() -> None:
    # Sample 1 met the same error twice (one state, two of its own calls; a step reward on the first)
    # and failed; the others solved.
    key = {7: "ok", 8: "error"}
    group = [
        episode(1.0, [call(1, P1)]),
        episode(0.0, [call(1, P2, reward=0.5), call(2, P2)]),
        episode(1.0, [call(1, P1)]),
    ]
    calls = [list(e.calls) for e in group]
    result = step_credit(
        group, calls, scale=False, estimate="state_value", state_key=lambda c: key[c.prompt_token_ids[2]]
    )
    # Its two calls are not compared with each other: both keep E = total 0.5 - mean(1, 0.5, 1).
    assert result.advantages is not None and result.advantages[1] == pytest.approx([-1 / 3, -1 / 3])
    assert result.advantages[0] == pytest.approx([0.0]) and result.advantages[2] == pytest.approx([0.0])


def test_state_value_adds_a_calls_own_step_reward_to_the_value_of_its_next_state() -> None:
    group = [
        episode(1.0, [call(1, P0, reward=0.5), call(2, P1)]),
        episode(0.0, [call(1, P0), call(2, P1)]),
    ]
    calls = [list(e.calls) for e in group]
    result = step_credit(group, calls, gamma=0.5, scale=False, estimate="state_value")
    # Returns to go of the second calls: 1 and 0, so V(P1) = 0.5. First calls: 0.5 + 0.5 * 0.5 and 0 + 0.25.
    assert result.advantages is not None
    assert [row[0] for row in result.advantages] == pytest.approx([0.5, -0.5])
    assert [row[1] for row in result.advantages] == pytest.approx([1.0, -1.0])


def test_leave_one_out_episode_baseline() -> None:
    group = [episode(1.0, [call(1, P0)]), episode(0.0, [call(1, P0)]), episode(0.0, [call(1, P0)])]
    calls = [list(e.calls) for e in group]
    result = step_credit(group, calls, scale=False, baseline="leave_one_out", weight=0.0)
    assert flat(result.parts.episode_part) == pytest.approx([1.0, -0.5, -0.5])  # 1 - 0, 0 - (1 + 0) / 2
    with pytest.raises(ValueError, match="baseline='median' is unknown"):
        step_credit(group, calls, baseline="median")


def test_step_groups_never_mix_roles_or_agents() -> None:
    group = [
        episode(1.0, [call(1, P0, adapter="writer"), call(2, P1, adapter="checker")]),
        episode(0.0, [call(1, P0, adapter="writer"), call(2, P1, adapter="writer")]),
        episode(0.0, [call(1, P0, adapter="writer", agent_name="judge")]),
    ]
    calls = [list(e.calls) for e in group]
    # Same prompt ids, but P1 was answered by two roles, and the judge is another agent: four groups.
    assert step_groups(group, calls) == [[0, 1], [0, 2], [3]]
    keyed_alike = step_groups(group, calls, state_key=lambda c: "same")
    assert keyed_alike == [[0, 1], [0, 0], [2]]  # a custom key never merges across roles or agents


def test_prepare_group_leaves_untrained_calls_out_and_records_each_calls_credit(tmp_path: Any) -> None:
    config = TrainerConfig(credit="step", scale_advantages=False)
    other = "https://api.openai.com/v1"
    group = [
        episode(1.0, [call(1, P0), call(2, P1, base_url=other)]),  # its P1 call is not trained
        episode(0.0, [call(1, P0), call(2, P1)]),
    ]
    prepared = prepare_group(group, config, endpoint_base_url=ENDPOINT)
    assert [len(calls) for calls in prepared.calls] == [1, 2]
    assert prepared.step is not None and prepared.step.parts.group_sizes == [[2], [2, 1]]
    # Root: 1 - 0 and 0 - 1 on top of +-0.5; the lone P1 call keeps its episode part.
    assert flat(prepared.advantages) == pytest.approx([1.5, -1.5, -0.5])
    credit = {key: group[1].calls[0].metadata.get(key) for key in CALL_CREDIT_KEYS}
    assert credit == {
        "credit_rule": "step",
        "credited_reward": 0.0,
        "advantage": pytest.approx(-1.5),
        "trained": True,
        "untrained_reason": None,
        "episode_advantage": pytest.approx(-0.5),
        "step_advantage": pytest.approx(-1.0),
        "step_group_size": 2,
        "step_estimate": "return",
    }
    assert group[1].metadata["advantage"] == pytest.approx(-0.5)  # the episode part
    # One contract: every key the writer put on a call is one the explorer reads (CallCredit).
    written = {key for e in group for c in e.all_calls() for key in c.metadata}
    assert written <= set(CALL_CREDIT_KEYS) and call_credit(group[1].calls[0]) == {
        key: value for key, value in credit.items() if value is not None
    }
    untrained = group[0].calls[1].metadata
    assert untrained["trained"] is False and untrained["untrained_reason"] == "other_endpoint"
    assert "advantage" not in untrained and "step_advantage" not in untrained
    with EpisodeStore(tmp_path / "episodes.sqlite") as store:  # the run folder's store keeps it per call
        store.add_many(group)
        stored = {c.id: c.metadata for e in store.episodes() for c in e.all_calls()}
    assert stored[group[1].calls[0].id]["step_advantage"] == pytest.approx(-1.0)
    assert stored[group[0].calls[1].id]["untrained_reason"] == "other_endpoint"

    batch = samples_from_groups([prepared], config)
    assert [sample.advantages[0] for sample in batch.samples] == pytest.approx([1.5, -1.5, -0.5])
    metrics = batch.metrics
    assert metrics["step_group_share"] == 0.0  # only the root group: nothing shared beyond the start
    assert metrics["advantage_episode_abs_mean"] == pytest.approx(0.5)
    assert metrics["advantage_step_abs_mean"] == pytest.approx(2 / 3)


def test_other_rules_record_their_credit_and_report_no_step_metrics() -> None:
    config = TrainerConfig(credit="equal", scale_advantages=False, episode_baseline="leave_one_out")
    group = [episode(1.0, [call(1, P0)]), episode(0.0, [call(1, P0)]), episode(0.0, [call(1, P0)])]
    prepared = prepare_group(group, config, endpoint_base_url=ENDPOINT)
    assert flat(prepared.advantages) == pytest.approx([1.0, -0.5, -0.5])
    recorded = {key: group[0].calls[0].metadata.get(key) for key in CALL_CREDIT_KEYS}
    assert recorded == {
        "credit_rule": "equal",
        "credited_reward": 1.0,
        "advantage": 1.0,
        "trained": True,
        "untrained_reason": None,
        "episode_advantage": None,
        "step_advantage": None,
        "step_group_size": None,
        "step_estimate": None,
    }
    assert [e.metadata["advantage"] for e in group] == pytest.approx([1.0, -0.5, -0.5])
    assert "step_group_share" not in samples_from_groups([prepared], config).metrics


def test_a_group_with_equal_totals_is_skipped_and_records_no_advantage() -> None:
    config = TrainerConfig(credit="step")
    group = [episode(1.0, [call(1, P0), call(2, P1)]), episode(1.0, [call(1, P0), call(2, P2)])]
    prepared = prepare_group(group, config, endpoint_base_url=ENDPOINT)
    assert prepared.skipped == "no_spread" and prepared.advantages is None
    recorded = group[0].calls[1].metadata
    assert (recorded["credited_reward"], recorded["trained"], recorded["untrained_reason"]) == (
        1.0,
        False,
        "no_spread",
    )
    assert "advantage" not in recorded and "advantage" not in group[0].metadata
    metrics = samples_from_groups([prepared], config).metrics
    assert math.isnan(metrics["step_group_share"]) and metrics["samples"] == 0


def last_tool_result(c: LLMCall) -> str:
    """Key a call by the newest tool result it read (or the first user turn before any tool ran)."""
    messages = c.messages or []
    tools = [m["content"] for m in messages if m["role"] == "tool"]
    return tools[-1] if tools else messages[0]["content"]


def test_a_state_key_by_the_last_tool_result_groups_calls_whose_prompts_differ() -> None:
    def turn(t: float, ids: list[int], tool: str | None) -> LLMCall:
        stamp = [{"role": "system", "content": f"now: 12:0{int(t)}"}]  # noise that makes every prompt differ
        rest = [{"role": "tool", "content": tool}] if tool is not None else []
        return call(t, ids, messages=[{"role": "user", "content": "q"}, *rest, *stamp])

    group = [
        episode(1.0, [turn(1, [1, 1], None), turn(2, [1, 2], "rows: 3")]),
        episode(0.0, [turn(1, [2, 1], None), turn(2, [2, 2], "rows: 3")]),
        episode(0.0, [turn(1, [3, 1], None), turn(2, [3, 2], "error: no such table")]),
    ]
    calls = [list(e.calls) for e in group]
    assert step_groups(group, calls) == [[0, 1], [2, 3], [4, 5]]  # the exact ids: nothing is shared
    assert step_groups(group, calls, state_key=last_tool_result) == [[0, 1], [0, 1], [0, 2]]
    config = TrainerConfig(credit="step", state_key=last_tool_result)
    assert config.to_dict()["state_key"] == "last_tool_result"  # run.json names the function
    prepared = prepare_group(group, config, endpoint_base_url=ENDPOINT)
    assert prepared.step is not None and prepared.step.parts.shared == [
        [False, True],
        [False, True],
        [False, False],
    ]


def test_bad_state_keys_and_calls_without_ids_are_refused_clearly() -> None:
    group = [episode(1.0, [call(1, P0)]), episode(0.0, [call(1, P0)])]
    calls = [list(e.calls) for e in group]
    with pytest.raises(TypeError, match=r"state_key .* returned list .* not hashable"):
        step_groups(group, calls, state_key=lambda c: list(c.prompt_token_ids or []))
    with pytest.raises(ValueError, match=r"state_key .*<lambda> raised KeyError on call .* the first ones"):
        step_groups(group, calls, state_key=lambda c: c.metadata["tool_result"])
    with pytest.raises(ValueError, match=r"no prompt token ids.*retokenize\.call_token_ids"):
        prompt_state(LLMCall(messages=[{"role": "user", "content": "q"}], text="a"))
    with pytest.raises(ValueError, match="state_key is set but credit='equal'"):
        TrainerConfig(state_key=last_tool_result)
    with pytest.raises(ValueError, match="step_advantage_weight=-1 is too small"):
        TrainerConfig(credit="step", step_advantage_weight=-1)
    with pytest.raises(ValueError, match=r"step_estimate='state_value' is set but credit='equal'"):
        TrainerConfig(step_estimate="state_value")
    with pytest.raises(ValueError, match=r"step_advantage_weight=0 with step_estimate=\"state_value\""):
        TrainerConfig(credit="step", step_estimate="state_value", step_advantage_weight=0)
    with pytest.raises(ValueError, match=r"step_estimate='value' is not one of \['return', 'state_value'\]"):
        TrainerConfig(credit="step", step_estimate="value")  # type: ignore[arg-type]


def test_the_key_survives_a_runner_upload() -> None:
    """Runners and the gateway upload `Episode.to_dict()` as JSON; the trainer rebuilds the calls from it,
    prompt token ids included, so their states key exactly as in-process calls do."""
    group = [episode(1.0, [call(1, P0), call(2, P1)]), episode(0.0, [call(1, P0), call(2, P1)])]
    uploaded = [Episode.from_dict(json.loads(json.dumps(e.to_dict()))) for e in group]
    assert step_groups(uploaded, [u.calls for u in uploaded]) == step_groups(group, [e.calls for e in group])
    assert [prompt_state(c) for c in uploaded[0].calls] == [prompt_state(c) for c in group[0].calls]


def test_imported_calls_are_keyed_after_retokenizing_as_a_rollout_would_be(bundled_model: Any) -> None:
    """Imported traces carry text, not ids: the key is computed on the ids `call_token_ids` renders, which are
    what the endpoint gives a rollout's prompt, so imported and served calls of one state key alike."""
    import dataclasses

    from transformers import AutoTokenizer

    from lightning_sdk.serving.chat.template import render_chat
    from lightning_sdk.training.algorithm.retokenize import CallTokens, call_token_ids

    tokenizer = AutoTokenizer.from_pretrained(bundled_model.path)

    def imported(question: str, reply: str) -> LLMCall:
        messages = [{"role": "user", "content": question}]
        return LLMCall(messages=messages, response_message={"role": "assistant", "content": reply})

    def retokenized(text_call: LLMCall) -> LLMCall:
        tokens = call_token_ids(text_call, tokenizer)
        assert isinstance(tokens, CallTokens) and tokens.origin == "text"
        ids = {"prompt_token_ids": tokens.prompt_ids, "completion_token_ids": tokens.completion_ids}
        return dataclasses.replace(text_call, **ids)

    group = [
        Episode(calls=[retokenized(imported("What is 2 + 2?", "4"))], rewards={"feedback": 1.0}),
        Episode(calls=[retokenized(imported("What is 2 + 2?", "5"))], rewards={"feedback": 0.0}),
        Episode(calls=[retokenized(imported("What is 3 + 3?", "6"))], rewards={"feedback": 1.0}),
    ]
    assert step_groups(group, [e.calls for e in group]) == [[0], [0], [1]]
    served = LLMCall(
        prompt_token_ids=render_chat(tokenizer, [{"role": "user", "content": "What is 2 + 2?"}], [])
    )
    assert prompt_state(group[0].calls[0]) == prompt_state(served)


def test_calls_left_untrained_say_why() -> None:
    config = TrainerConfig(credit="last")
    failed = episode(1.0, [call(1, P0)])
    failed.error = {"type": "RuntimeError", "message": "boom", "traceback": ""}
    group = [episode(1.0, [call(1, P0), call(2, P1)]), episode(0.0, [call(1, P0), call(2, P1)]), failed]
    prepare_group(group, config, endpoint_base_url=ENDPOINT)
    reasons = [[c.metadata.get("untrained_reason") for c in e.calls] for e in group]
    assert reasons == [["credit_none", None], ["credit_none", None], ["episode_dropped"]]
    assert [c.metadata["trained"] for c in group[0].calls] == [False, True]
