"""Checkpoints on real files: round trip, keep-last-N, interrupted saves, RNG states; LR schedule."""

import random

import numpy
import pytest
import torch

from lightning_sdk.training.update.folders.checkpoint import (
    find_latest_checkpoint,
    latest_adapter,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from lightning_sdk.training.update.optim import build_optimizer, build_scheduler, lr_factor
from tests.fixtures.training import tiny_lora_model


def one_update(model, optimizer, scheduler):
    loss = model(torch.tensor([[1, 2, 3, 4]])).logits.square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    scheduler.step()


def lora_weights(model):
    return {name: p.detach().clone() for name, p in model.named_parameters() if "lora_" in name}


def test_round_trip_restores_adapter_optimizer_scheduler_state_and_rng(tmp_path):
    model, config = tiny_lora_model(learning_rate=1e-2, warmup_steps=3)
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config)
    one_update(model, optimizer, scheduler)
    path = save_checkpoint(tmp_path, 1, model, optimizer, scheduler, {"data_position": 7}, keep=2)
    assert path == tmp_path / "checkpoints" / "step-00000001"
    saved_weights, saved_lr = lora_weights(model), optimizer.param_groups[0]["lr"]
    draws = (random.random(), numpy.random.rand(), torch.rand(1).item())

    one_update(model, optimizer, scheduler)  # move everything on
    restored_model, _ = tiny_lora_model(seed=9)
    restored_optimizer = build_optimizer(restored_model, config)
    restored_scheduler = build_scheduler(restored_optimizer, config)
    state = load_checkpoint(path, restored_model, restored_optimizer, restored_scheduler)

    assert state == {"data_position": 7, "step": 1}
    assert all(
        torch.equal(saved_weights[name], value) for name, value in lora_weights(restored_model).items()
    )
    assert restored_scheduler.last_epoch == 1
    assert restored_optimizer.param_groups[0]["lr"] == pytest.approx(saved_lr)
    moments = restored_optimizer.state_dict()["state"]
    assert moments and all(int(entry["step"]) == 1 for entry in moments.values())
    assert (random.random(), numpy.random.rand(), torch.rand(1).item()) == draws


def test_keeps_the_newest_checkpoints_and_ignores_half_written_ones(tmp_path):
    model, _ = tiny_lora_model()
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, model, keep=2)
    assert [step for step, _ in list_checkpoints(tmp_path)] == [2, 3]
    # A save killed before its final rename leaves a hidden folder, and one killed before its state file
    # a folder without trainer_state.json: neither is taken for a checkpoint.
    (tmp_path / "checkpoints" / ".tmp-step-00000004-x" / "adapter").mkdir(parents=True)
    broken = tmp_path / "checkpoints" / "step-00000005"
    (broken / "adapter").mkdir(parents=True)
    assert find_latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step-00000003"
    assert latest_adapter(tmp_path) == tmp_path / "checkpoints" / "step-00000003" / "adapter"
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        load_checkpoint(broken, model)
    assert find_latest_checkpoint(tmp_path / "elsewhere") is None


def test_saving_the_same_step_again_replaces_it(tmp_path):
    model, _ = tiny_lora_model()
    save_checkpoint(tmp_path, 4, model, state={"data_position": 1})
    save_checkpoint(tmp_path, 4, model, state={"data_position": 2})
    assert load_checkpoint(find_latest_checkpoint(tmp_path), model)["data_position"] == 2
    assert [child.name for child in (tmp_path / "checkpoints").iterdir()] == ["step-00000004"]


def test_lr_schedule_hand_computed():
    assert [lr_factor(step, 3, 10, "constant") for step in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    assert lr_factor(3, 3, 11, "linear") == 1.0
    assert lr_factor(7, 3, 11, "linear") == 0.5
    assert lr_factor(11, 3, 11, "linear") == 0.0
    assert lr_factor(7, 3, 11, "cosine") == pytest.approx(0.5)
    assert lr_factor(0, 0, 10, "cosine") == 1.0
