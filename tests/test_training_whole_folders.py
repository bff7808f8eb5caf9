"""Adapters written whole or not at all, a truncated adapter recognised, and export passing over one: real
files, a real LoRA model, the bundled model for the export."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import pytest

import lightning_sdk as ls
from lightning_sdk.training.records.run_dir import refuse_earlier_run
from lightning_sdk.training.run.best_adapter import BEST_FILE, BestAdapter, read_best, write_best
from lightning_sdk.training.update.folders.whole_folders import adapter_problem, staged_folder
from lightning_sdk.training.update.lora import save_adapter
from tests.fixtures.training import tiny_lora_model

WEIGHTS = "adapter_model.safetensors"


def _truncate(file: Path, keep: float = 0.5) -> None:
    data = file.read_bytes()
    file.write_bytes(data[: int(len(data) * keep)])


def test_a_staged_adapter_replaces_the_old_one_whole_or_leaves_it_as_it_was(tmp_path: Path) -> None:
    model, _ = tiny_lora_model()
    target = tmp_path / "adapter"
    with staged_folder(target) as staging:
        save_adapter(model, staging)
    first = (target / WEIGHTS).read_bytes()
    assert adapter_problem(target) is None

    # A save that fails part-way (a crash, a full disk) after writing half a file: the old adapter stays.
    with pytest.raises(OSError, match="disk full"), staged_folder(target) as staging:
        save_adapter(model, staging)
        _truncate(staging / WEIGHTS)
        raise OSError("disk full")
    assert (target / WEIGHTS).read_bytes() == first and adapter_problem(target) is None
    assert [child.name for child in tmp_path.iterdir()] == ["adapter"]  # nothing half-written left over

    model_two, _ = tiny_lora_model(seed=3)
    with staged_folder(target) as staging:
        save_adapter(model_two, staging)
    assert (target / WEIGHTS).read_bytes() != first and adapter_problem(target) is None
    assert [child.name for child in tmp_path.iterdir()] == ["adapter"]


def test_best_json_is_written_with_its_adapter_and_read_back(tmp_path: Path) -> None:
    model, _ = tiny_lora_model()
    best = BestAdapter(step=3, score=0.75, metrics={"reward": 0.75})
    with staged_folder(tmp_path / "best_adapter") as staging:
        save_adapter(model, staging)
        write_best(staging, best)
    assert read_best(tmp_path) == best
    assert json.loads((tmp_path / "best_adapter" / BEST_FILE).read_text())["step"] == 3
    assert adapter_problem(tmp_path / "best_adapter") is None
    assert [child.name for child in tmp_path.iterdir()] == ["best_adapter"]  # no staging name left over


def test_a_truncated_or_incomplete_adapter_folder_is_named_for_what_is_wrong(tmp_path: Path) -> None:
    model, _ = tiny_lora_model()
    for keep in (0.5, 0.999, 0.0):
        folder = tmp_path / f"cut-{keep}"
        save_adapter(model, folder)
        _truncate(folder / WEIGHTS, keep)
        problem = adapter_problem(folder)
        assert problem is not None and str(folder / WEIGHTS) in problem
    no_config = tmp_path / "no-config"
    save_adapter(model, no_config)
    (no_config / "adapter_config.json").unlink()
    assert "adapter_config.json is missing" in (adapter_problem(no_config) or "")
    roles = tmp_path / "roles"
    save_adapter(model, roles / "writer")
    save_adapter(model, roles / "checker")
    assert adapter_problem(roles) is None
    _truncate(roles / "checker" / WEIGHTS)
    assert str(roles / "checker" / WEIGHTS) in (adapter_problem(roles) or "")
    assert "not a folder" in (adapter_problem(tmp_path / "nowhere") or "")


def test_export_refuses_a_truncated_adapter_and_passes_over_a_truncated_best_one(
    bundled_model_path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from lightning_sdk.training.update.lora import build_lora_model, load_base_model

    config = ls.TrainerConfig(run_dir=str(tmp_path / "run"), lora_rank=4, lora_alpha=8)
    model = build_lora_model(load_base_model(bundled_model_path, "float32"), config)
    run_dir = tmp_path / "run"
    save_adapter(model, run_dir / "adapter")
    save_adapter(model, run_dir / "best_adapter")
    write_best(run_dir / "best_adapter", BestAdapter(step=1, score=0.5, metrics={"reward": 0.5}))
    _truncate(run_dir / "best_adapter" / WEIGHTS)  # as a run killed mid-save by an older release left it
    trainer = ls.Trainer(config=config)

    with pytest.raises(ValueError, match="not written whole"):
        trainer.export_merged(tmp_path / "merged", adapter=run_dir / "best_adapter")
    assert not (tmp_path / "merged").exists()

    caplog.set_level(logging.INFO, logger="lightning_sdk.training")
    merged = trainer.export_merged(tmp_path / "merged")
    said = caplog.text
    assert f"passing over {run_dir / 'best_adapter'}" in said
    assert f"exporting the last adapter of the run, in {run_dir / 'adapter'}" in said
    assert (merged / "config.json").is_file()


def test_a_cut_warm_start_is_refused_before_anything_starts(tmp_path: Path) -> None:
    from lightning_sdk.training.update.lora import save_adapter
    from tests.fixtures.training import tiny_lora_model

    model, _ = tiny_lora_model()
    save_adapter(model, tmp_path / "warm")
    weights = tmp_path / "warm" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8])
    config = ls.TrainerConfig(max_steps=1, run_dir=str(tmp_path / "run"), init_adapter=str(tmp_path / "warm"))
    before = {thread.ident for thread in threading.enumerate()}
    with pytest.raises(ValueError, match=r"is not a whole adapter: .* was not written whole"):
        ls.Trainer(config=config).fit(
            lambda task: "", [{"question": "?"}]
        )  # no engine was built: it would have taken seconds
    assert {thread.ident for thread in threading.enumerate()} <= before


def test_a_run_folder_that_holds_a_run_is_refused_without_resume(tmp_path: Path) -> None:
    import lightning_sdk as ls

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "teacher_traffic.sqlite").write_bytes(b"")  # other files are no run: accepted
    refuse_earlier_run(run_dir)
    (run_dir / "metrics.jsonl").write_text('{"step": 0, "time": 0.0, "val_reward": 0.5}\n')
    before = (run_dir / "metrics.jsonl").read_text()
    config = ls.TrainerConfig(max_steps=1, run_dir=str(run_dir))
    # Refused before a model or an engine loads (this test would otherwise take seconds), nothing written.
    with pytest.raises(ValueError, match=r"already holds a run \(metrics.jsonl\): pass resume=True"):
        ls.Trainer(config=config).fit(lambda task: "", [{"question": "?"}])
    with pytest.raises(ValueError, match="already holds a run"):
        ls.Trainer(config=config).fit_sft([])
    assert (run_dir / "metrics.jsonl").read_text() == before
    assert sorted(path.name for path in run_dir.iterdir()) == ["metrics.jsonl", "teacher_traffic.sqlite"]
