"""The GPU path, for the first machine with CUDA GPUs: `scripts/gpu_smoke.sh` runs exactly these.

Skipped without CUDA (CI has no GPU). Each check runs in its own processes, as a user's run would (vLLM
supports one engine per process, and torchrun needs its own processes):

- one GPU, both weight-sync modes: the engine and its stepping thread on `cuda:0`, sleep frees GPU memory,
  an adapter pushed into the sleeping engine changes the greedy output and survives another sleep and wake;
- one GPU, both weight-sync modes: `Trainer.fit` stopped by its time budget after step 1 and resumed to
  step 2 (two processes, the same step numbering), the policy on the GPU with bfloat16 base weights;
- two GPUs under torchrun: each rank's engine and policy on its own GPU, identical adapters at the end; and
  the time-budget stop decided over NCCL by both ranks together, then resumed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_sdk.training.records.run_dir import read_rank_info
from tests.fixtures.resume import stop_and_resume
from tests.fixtures.runs import check_two_rank_run, run_script

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(GPUS == 0, reason="needs a CUDA GPU (run scripts/gpu_smoke.sh on a GPU machine)"),
]

QUESTION = [{"role": "user", "content": "What is 12 + 7?"}]


@pytest.mark.parametrize("weight_sync", ["merge", "lora"])
def test_engine_on_one_gpu_sleeps_takes_new_weights_and_wakes(
    weight_sync: str, lora_adapter_dir: Path, chat_prompt_ids: Any
) -> None:
    prompt = json.dumps(chat_prompt_ids(QUESTION))
    output = run_script("engine_weight_sync.py", weight_sync, str(lora_adapter_dir), prompt)
    report = json.loads(output.strip().splitlines()[-1])
    assert report["weight_sync"] == weight_sync
    assert report["device"] == report["engine_thread_device"] == "cuda:0"
    assert report["gpu_memory_freed_by_sleep"] > 0  # level 1: KV cache freed, weights moved to host memory
    assert report["adapter"] != report["base"] and report["reverted"] == report["base"]
    assert report["asleep_after_push"] == ["kv_cache"]  # weights woken for the write, not the KV cache
    assert report["pushed_asleep"] == report["adapter"]  # the push was not undone by the wake
    assert report["after_second_wake"] == report["adapter"]
    assert report["after_full_weights"] == report["base"]


@pytest.mark.parametrize("weight_sync", ["merge", "lora"])
def test_training_on_one_gpu_in_bfloat16_stops_and_resumes(tmp_path: Path, weight_sync: str) -> None:
    run_dir = tmp_path / "run"
    reports = stop_and_resume(run_dir, weight_sync)
    assert len(reports) == 2
    for report in reports:
        # dtype="auto" on a GPU: the base weights, where nearly all the compute is, in bfloat16 (peft keeps
        # the LoRA matrices in float32, as it does for every half-precision base).
        assert (report["device"], report["base_dtype"]) == ("cuda:0", "bfloat16")
    [rank] = read_rank_info(run_dir)
    assert rank["device"] == rank["policy_device"] == rank["engine_device"] == "cuda:0"
    assert rank["executor_backend"] is None


@pytest.mark.skipif(GPUS < 2, reason="needs two CUDA GPUs")
def test_two_gpus_under_torchrun_train_the_same_adapter(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_script("distributed_fit.py", str(run_dir), "vllm", nproc=2)
    ranks = check_two_rank_run(run_dir, device_of_rank=lambda rank: f"cuda:{rank}", backend="nccl")
    assert all(rank["executor_backend"] == "external_launcher" for rank in ranks)


@pytest.mark.skipif(GPUS < 2, reason="needs two CUDA GPUs")
def test_two_gpus_stop_together_on_the_time_budget_and_resume(tmp_path: Path) -> None:
    # Each rank reads its own clock; the stop is an all-reduce over NCCL (`Distributed.any_rank`). A rank
    # that stopped alone would leave the other in the next step's collectives until the job's timeout.
    reports = stop_and_resume(tmp_path / "run", "lora", nproc=2)
    assert sorted((report["rank"], report["device"]) for report in reports) == [
        (0, "cuda:0"),
        (0, "cuda:0"),
        (1, "cuda:1"),
        (1, "cuda:1"),
    ]
    assert {report["base_dtype"] for report in reports} == {"bfloat16"}
