"""Decisions every rank takes together under torchrun, and how long a rank waits for the others.

A real 2-process gloo group (torch.multiprocessing, as torchrun would start it on a CPU) runs
`Distributed.any_rank` and checks the process group's timeout; the timeout rule itself is plain arithmetic.
"""

from __future__ import annotations

import json
import os
import socket
from datetime import timedelta
from pathlib import Path

import torch.multiprocessing as mp

from lightning_sdk.engine.placement import plan_placement
from lightning_sdk.training.config import TrainerConfig
from lightning_sdk.training.update.distributed import NCCL_DEFAULT_TIMEOUT, Distributed

TIMEOUT = timedelta(seconds=1234)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rank(rank: int, port: int, out: str) -> None:
    """One rank: join the group as the trainer does, vote, report what it saw."""
    import torch
    import torch.distributed as dist

    env = {"WORLD_SIZE": "2", "RANK": str(rank), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2"}
    os.environ.update(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    distributed = Distributed.from_environment(plan_placement(env, cuda_devices=0), TIMEOUT)
    try:
        backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
        report = {
            # Only rank 1 is out of time, as when its clock started earlier or its steps ran longer.
            "only_rank_1": distributed.any_rank(rank == 1),
            "none": distributed.any_rank(False),
            "all": distributed.any_rank(True),
            "timeout_s": backend.options._timeout.total_seconds(),
        }
    finally:
        distributed.close()
    Path(out, f"rank{rank}.json").write_text(json.dumps(report))


def test_every_rank_stops_when_one_rank_is_out_of_time(tmp_path: Path) -> None:
    mp.spawn(_rank, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for report in reports:
        assert report["only_rank_1"] is True  # rank 0 stops with rank 1 instead of waiting for it
        assert report["none"] is False and report["all"] is True
        assert report["timeout_s"] == TIMEOUT.total_seconds()  # the timeout reached the process group


def test_one_process_decides_alone() -> None:
    distributed = Distributed()
    assert distributed.any_rank(True) is True
    assert distributed.any_rank(False) is False


def test_the_collective_timeout_covers_a_steps_episode_timeouts() -> None:
    # Defaults: 4 tasks x 8 episodes, all 32 at once, 300 s each: one wave, twice, plus NCCL's 10 minutes.
    assert Distributed.collective_timeout(TrainerConfig()) == timedelta(minutes=20)
    # 128 episodes, 32 at a time: 4 waves of up to 600 s each.
    slow = TrainerConfig(batch_size=8, group_size=16, max_concurrency=32, episode_timeout_s=600)
    assert Distributed.collective_timeout(slow) == 2 * 4 * timedelta(seconds=600) + NCCL_DEFAULT_TIMEOUT
    # An agent slower than NCCL's default still has room: the timeout is never below twice its own.
    assert Distributed.collective_timeout(TrainerConfig(episode_timeout_s=3600)) > timedelta(hours=2)
