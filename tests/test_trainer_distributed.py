"""`Trainer.fit` under torchrun: 2 CPU processes, gloo all-reduce, rank 0 writes the run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from lightning_sdk.training.metrics import read_metrics

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parent / "scripts" / "distributed_fit.py"


def test_two_ranks_train_the_same_adapter(tmp_path: Path, bundled_model: object) -> None:
    run_dir = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1])}
    env.pop("PYTEST_CURRENT_TEST", None)
    completed = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(SCRIPT),
         str(run_dir)],
        check=False, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-4000:]

    steps = [record for record in read_metrics(run_dir) if "reward_mean" in record]
    assert [record["step"] for record in steps] == [1, 2]  # written once, by rank 0
    assert all(record["episodes"] == 4 for record in steps)  # rank 0's share: 1 task x 4 samples
    rank0 = load_file(str(run_dir / "adapter" / "adapter_model.safetensors"))
    rank1 = load_file(str(run_dir / "adapter-rank1" / "adapter_model.safetensors"))
    assert rank0.keys() == rank1.keys()
    # DDP averaged the gradients: both ranks hold the same adapter, and it moved from its zero init.
    assert all((rank0[name] == rank1[name]).all() for name in rank0)
    assert sum(float(tensor.norm()) for name, tensor in rank0.items() if "lora_B" in name) > 0
    assert (run_dir / "checkpoints" / "step-00000002").is_dir()
