"""The difference between two LoRA adapters as one adapter (`engine/lora/difference.py`): added to weights
with one adapter merged, it gives the weights with the other, written as a peft folder that reads back
as the same update. tests/test_engine_merge_pins.py checks the same through the real engine's answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lightning_sdk.engine.lora.difference import adapter_difference, read_pinnable_adapter, write_adapter
from lightning_sdk.engine.lora.merge import LoraFactors, LoraUpdate, add_lora, read_lora_adapter

SHAPES = {"model.layers.0.self_attn.q_proj.weight": (12, 10), "model.layers.0.mlp.down_proj.weight": (10, 14)}


def update(seed: int, rank: int, scale: float, names: tuple[str, ...] = tuple(SHAPES)) -> LoraUpdate:
    generator = torch.Generator().manual_seed(seed)
    factors = {}
    for name in names:
        rows, columns = SHAPES[name]
        b = torch.randn(rows, rank, generator=generator)
        a = torch.randn(rank, columns, generator=generator)
        factors[name] = LoraFactors(b=b, a=a, scale=scale)
    return LoraUpdate(factors=factors, replacements={})


def weights_with(base: dict[str, torch.Tensor], adapter: LoraUpdate | None) -> dict[str, torch.Tensor]:
    """`base + adapter`, in float64 so that the comparison sees the algebra, not the rounding."""
    result = {name: weight.double() for name, weight in base.items()}
    for name, factors in ({} if adapter is None else adapter.factors).items():
        result[name] = result[name] + factors.scale * factors.b.double() @ factors.a.double()
    return result


@pytest.fixture
def base() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    return {name: torch.randn(*shape, generator=generator) for name, shape in SHAPES.items()}


@pytest.mark.parametrize(
    ("target", "merged"),
    [
        (update(1, rank=4, scale=2.0), update(2, rank=4, scale=2.0)),  # the trainer's case: two steps
        (update(1, rank=4, scale=2.0), update(2, rank=2, scale=0.5, names=(next(iter(SHAPES)),))),
        (update(1, rank=4, scale=2.0), None),  # the base weights merged
        (None, update(2, rank=4, scale=2.0)),  # the base weights pinned
    ],
    ids=["two-steps", "other-rank-and-modules", "over-base", "pinned-base"],
)
def test_the_difference_takes_the_merged_weights_to_the_pinned_ones(
    base: dict[str, torch.Tensor], target: LoraUpdate | None, merged: LoraUpdate | None, tmp_path: Path
) -> None:
    difference = adapter_difference(target, merged)
    expected, served = weights_with(base, target), weights_with(base, merged)
    for name in SHAPES:
        factors = difference.get(name)
        got = served[name] if factors is None else served[name] + factors.b.double() @ factors.a.double()
        torch.testing.assert_close(got, expected[name], rtol=0, atol=1e-9)
    # As a peft folder: every module at one rank, the scale folded into B, read back as the same update.
    folder = write_adapter(difference, tmp_path / "difference")
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["r"] == config["lora_alpha"] == max(f.a.shape[0] for f in difference.values())
    read = read_lora_adapter(folder)
    assert read.factors.keys() == difference.keys() and not read.replacements
    for name, factors in read.factors.items():
        merged_again = add_lora(base[name], factors).double()
        direct = base[name].double() + difference[name].b.double() @ difference[name].a.double()
        torch.testing.assert_close(merged_again, direct, rtol=1e-6, atol=1e-5)  # float32 arithmetic


def test_an_adapter_pinned_while_it_is_the_merged_one_has_no_difference() -> None:
    adapter = update(1, rank=4, scale=2.0)
    assert adapter_difference(adapter, update(1, rank=4, scale=2.0)) == {}  # equal factors, fresh tensors
    assert adapter_difference(None, None) == {}
    with pytest.raises(ValueError, match="No weight differs"):
        write_adapter({}, Path("unused"))


def test_an_adapter_that_replaces_whole_weights_cannot_be_pinned_beside_merged_ones(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    folder = tmp_path / "with-modules-to-save"
    folder.mkdir()
    save_file(
        {
            "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(2, 10),
            "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.zeros(12, 2),
            "base_model.model.lm_head.modules_to_save.default.weight": torch.zeros(5, 10),
        },
        str(folder / "adapter_model.safetensors"),
    )
    (folder / "adapter_config.json").write_text(json.dumps({"r": 2, "lora_alpha": 2}))
    with pytest.raises(ValueError, match=r"modules_to_save.*weight_sync='lora'"):
        read_pinnable_adapter(folder)
