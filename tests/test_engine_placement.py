"""Where each process puts its engine and policy, for the environments torchrun and the machine give."""

from __future__ import annotations

import pytest

from lightning_sdk.engine.placement import CPU_BF16_ENV, auto_dtype, plan_placement, serving_dtype
from lightning_sdk.training.update.distributed import Distributed

TORCHRUN_RANK_1 = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}


def test_one_process_without_a_gpu_runs_on_the_cpu() -> None:
    placement = plan_placement({}, cuda_devices=0)
    assert (placement.rank, placement.world_size, placement.device) == (0, 1, "cpu")
    assert placement.process_group_backend == "gloo"
    assert placement.executor_backend is None  # vLLM's single-process executor
    assert placement.training_dtype() == "float32"
    assert not placement.on_gpu


def test_one_process_with_gpus_takes_the_first() -> None:
    placement = plan_placement({}, cuda_devices=4)
    assert placement.device == "cuda:0" and placement.on_gpu
    assert placement.executor_backend is None
    assert placement.training_dtype() == "bfloat16"
    assert placement.training_dtype("float32") == "float32"  # an explicit choice is kept


def test_each_torchrun_rank_gets_the_gpu_of_its_local_rank() -> None:
    placement = plan_placement(TORCHRUN_RANK_1, cuda_devices=2)
    assert (placement.rank, placement.local_rank, placement.world_size) == (1, 1, 2)
    assert placement.device == "cuda:1"
    assert placement.process_group_backend == "nccl"
    # Without it vLLM's uni-process executor would put every rank's engine on cuda:0.
    assert placement.executor_backend == "external_launcher"


def test_torchrun_on_cpus_uses_gloo_and_still_one_engine_per_rank() -> None:
    placement = plan_placement(TORCHRUN_RANK_1, cuda_devices=0)
    assert placement.device == "cpu" and placement.process_group_backend == "gloo"
    assert placement.executor_backend == "external_launcher"


def test_a_second_node_uses_its_own_local_ranks() -> None:
    env = {"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    placement = plan_placement(env, cuda_devices=2)
    assert (placement.rank, placement.device) == (3, "cuda:1")


@pytest.mark.parametrize(
    "env",
    [
        {**TORCHRUN_RANK_1, "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"},
        {"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "3"},  # a launcher that sets no LOCAL_WORLD_SIZE
    ],
)
def test_more_processes_than_gpus_on_a_node_is_refused(env) -> None:
    with pytest.raises(ValueError, match="--nproc-per-node 2"):
        plan_placement(env, cuda_devices=2)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not a whole number"),
        ({"WORLD_SIZE": "2", "RANK": "-1"}, "must not be negative"),
    ],
)
def test_malformed_torchrun_variables_are_named(env, message) -> None:
    with pytest.raises(ValueError, match=message):
        plan_placement(env, cuda_devices=0)


@pytest.mark.parametrize("share", [0.0, 1.0, 1.5])
def test_the_engine_cannot_take_the_whole_gpu(share) -> None:
    with pytest.raises(ValueError, match="training needs the rest"):
        plan_placement({}, cuda_devices=1, gpu_memory_utilization=share)


def test_auto_dtype_by_device() -> None:
    assert [auto_dtype(d) for d in ("cpu", "cuda:0", "cuda")] == ["float32", "bfloat16", "bfloat16"]


def test_a_training_engine_serves_in_the_policys_dtype() -> None:
    # Serving alone, a CPU with bfloat16 arithmetic serves bfloat16; a training run's engine never does
    # beside a float32 policy (issue 59): it takes the policy's dtype, as asked or as "auto" resolves it.
    cpu, gpu = plan_placement({}, cuda_devices=0), plan_placement({}, cuda_devices=1)
    assert serving_dtype(on_cpu=True, native_bf16=True) == "bfloat16"
    assert cpu.engine_dtype_while_training() == cpu.training_dtype() == "float32"
    assert gpu.engine_dtype_while_training() == "bfloat16"
    assert gpu.engine_dtype_while_training("float16") == gpu.training_dtype("float16") == "float16"


def test_one_process_joins_no_process_group() -> None:
    distributed = Distributed.from_environment(plan_placement({}, cuda_devices=0))
    assert (distributed.world_size, distributed.device, distributed.initialized_here) == (1, "cpu", False)
    distributed.close()  # nothing to end


def test_serving_dtype_is_float32_on_a_cpu_without_bf16_arithmetic() -> None:
    assert serving_dtype(on_cpu=False) == "auto"  # the checkpoint's dtype on a GPU, as vLLM decides
    assert serving_dtype(on_cpu=True, native_bf16=False) == "float32"
    assert serving_dtype(on_cpu=True, native_bf16=True) == "bfloat16"


def test_the_cpu_bf16_variable_picks_the_serving_dtype_on_any_cpu(monkeypatch) -> None:
    for value, dtype in (("0", "float32"), ("1", "bfloat16")):
        monkeypatch.setenv(CPU_BF16_ENV, value)
        assert serving_dtype(on_cpu=True) == dtype
        assert serving_dtype(on_cpu=False) == "auto"  # a GPU serves the checkpoint's dtype regardless
    monkeypatch.setenv(CPU_BF16_ENV, "yes")
    with pytest.raises(ValueError, match=r"LIGHTNING_SDK_CPU_BF16='yes'.*0 .*or 1"):
        serving_dtype(on_cpu=True)
