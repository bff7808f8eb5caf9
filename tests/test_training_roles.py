"""One LoRA adapter per role on a tiny Llama: each role's samples move its own adapter only, with its own
optimizer state; checkpoints and adapter folders hold one subfolder per role."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from lightning_sdk.engine.lora.folders import is_adapter_folder, role_adapter_names
from lightning_sdk.training.algorithm.samples import Sample
from lightning_sdk.training.config import TrainerConfig
from lightning_sdk.training.update.folders.checkpoint import (
    find_latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from lightning_sdk.training.update.lora import (
    adapter_parameters,
    build_lora_model,
    load_adapter_weights,
    save_adapter,
)
from lightning_sdk.training.update.optim import build_optimizer, build_scheduler
from lightning_sdk.training.update.roles import train_each_role
from tests.fixtures.training import tiny_llama

ROLES = ("writer", "checker")


def role_model(seed: int = 0):
    config = TrainerConfig(lora_rank=4, lora_alpha=8, learning_rate=1e-2, roles=list(ROLES))
    model = build_lora_model(tiny_llama(seed), config, ROLES)
    optimizer = build_optimizer(model, config, ROLES)
    return model, config, optimizer, build_scheduler(optimizer, config)


def weights(model, role: str) -> list[torch.Tensor]:
    return [parameter.detach().clone() for parameter in adapter_parameters(model, role)]


def samples_of(role: str | None, advantage: float = 1.0) -> list[Sample]:
    return [
        Sample([1, 2, 3], [4, 5, 6], [1, 1, 1], [None] * 3, [advantage] * 3, adapter=role),
        Sample([1, 2], [7, 8], [1, 1], [None] * 2, [-advantage] * 2, adapter=role),
    ]


def changed(before: list[torch.Tensor], after: list[torch.Tensor]) -> bool:
    return any(not torch.equal(old, new) for old, new in zip(before, after, strict=True))


def test_each_role_has_its_own_matrices_and_parameter_group() -> None:
    model, _, optimizer, _ = role_model()
    writer, checker = (set(map(id, adapter_parameters(model, role))) for role in ROLES)
    assert writer and checker and not writer & checker
    assert [group["adapter"] for group in optimizer.param_groups] == list(ROLES)
    assert {id(p) for p in optimizer.param_groups[0]["params"]} == writer


def test_a_role_s_samples_move_only_its_adapter() -> None:
    model, config, optimizer, scheduler = role_model()
    before = {role: weights(model, role) for role in ROLES}
    update = train_each_role(model, optimizer, scheduler, samples_of("writer"), config, ROLES)
    assert update.changed == ["writer"] and update.idle == ["checker"]
    assert changed(before["writer"], weights(model, "writer"))
    assert not changed(before["checker"], weights(model, "checker"))
    # Adam's moments exist for the writer's matrices only: the checker's state is untouched.
    states = {role: [optimizer.state.get(p) for p in adapter_parameters(model, role)] for role in ROLES}
    assert all(state for state in states["writer"]) and not any(states["checker"])
    assert update.metrics["trained_sequences/writer"] == 2 and "loss/checker" not in update.metrics
    assert update.metrics["trained_sequences"] == 2 and scheduler.last_epoch == 1


def test_two_roles_in_one_step_train_as_if_each_were_alone() -> None:
    together, config, optimizer, scheduler = role_model()
    mixed = samples_of("writer") + samples_of("checker", advantage=-0.5)
    update = train_each_role(together, optimizer, scheduler, mixed, config, ROLES)
    assert sorted(update.changed) == ["checker", "writer"]
    assert update.metrics["trained_sequences"] == 4 and update.metrics["optimizer_steps"] == 2

    alone, _, optimizer, scheduler = role_model()
    train_each_role(alone, optimizer, scheduler, samples_of("checker", advantage=-0.5), config, ROLES)
    for mine, reference in zip(weights(together, "checker"), weights(alone, "checker"), strict=True):
        assert torch.allclose(mine, reference, atol=1e-6)  # the writer's samples did not reach it


def test_samples_of_the_base_model_train_nothing() -> None:
    model, config, optimizer, scheduler = role_model()
    before = {role: weights(model, role) for role in ROLES}
    update = train_each_role(model, optimizer, scheduler, samples_of(None), config, ROLES)
    assert update.changed == [] and sorted(update.idle) == sorted(ROLES)
    assert all(not changed(before[role], weights(model, role)) for role in ROLES)


def test_checkpoint_and_adapter_folders_hold_one_adapter_per_role(tmp_path: Path) -> None:
    model, config, optimizer, scheduler = role_model()
    train_each_role(model, optimizer, scheduler, samples_of("writer") + samples_of("checker"), config, ROLES)
    save_checkpoint(tmp_path, 1, model, optimizer, scheduler, {"data": {}})
    checkpoint = find_latest_checkpoint(tmp_path)
    assert checkpoint is not None and role_adapter_names(checkpoint / "adapter") == sorted(ROLES)

    fresh, _, fresh_optimizer, fresh_scheduler = role_model(seed=1)
    load_checkpoint(checkpoint, fresh, fresh_optimizer, fresh_scheduler)
    for role in ROLES:
        assert not changed(weights(model, role), weights(fresh, role))
    assert fresh_optimizer.state_dict()["state"].keys() == optimizer.state_dict()["state"].keys()

    folder = save_adapter(model, tmp_path / "adapter")
    assert is_adapter_folder(folder) and role_adapter_names(folder) == sorted(ROLES)


def test_a_folder_without_a_role_s_adapter_is_refused_by_name(tmp_path: Path) -> None:
    model, config, _, _ = role_model()
    save_adapter(model, tmp_path / "adapter")
    other = build_lora_model(tiny_llama(), config, ("writer", "rewriter"))
    with pytest.raises(FileNotFoundError, match=r"no adapter for role\(s\) rewriter .*checker, writer"):
        load_adapter_weights(other, tmp_path / "adapter")


def test_a_role_no_call_was_answered_by_is_warned_about_once(caplog: pytest.LogCaptureFixture) -> None:
    from lightning_sdk.training.run.run_warnings import RunWarnings

    warnings = RunWarnings()
    metrics = {"calls/writer": 6, "calls/checker": 0}
    with caplog.at_level(logging.WARNING, logger="lightning_sdk.training"):
        warnings.idle_roles(["checker"], metrics)
        warnings.idle_roles(["checker"], metrics)  # the same every step: said once
    [record] = caplog.records
    assert "'checker' had no call answered by their adapter" in record.getMessage()
    assert "the other roles trained" in record.getMessage()

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lightning_sdk.training"):
        RunWarnings().idle_roles(["writer", "checker"], {"calls/writer": 0, "calls/checker": 0})
    [record] = caplog.records
    assert (
        "no role trained" in record.getMessage() and "named when the request is made" in record.getMessage()
    )
