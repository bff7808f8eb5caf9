"""The run folder: where checkpoints, metrics, episodes, the final adapter and reports go."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_sdk.training.records.metrics import METRICS_FILE

if TYPE_CHECKING:
    from lightning_sdk.training.config import TrainerConfig

__all__ = ["make_run_dir", "read_rank_info", "refuse_earlier_run", "write_rank_info", "write_run_info"]

RUN_INFO_FILE = "run.json"


def make_run_dir(run_dir: str | Path | None) -> Path:
    """The configured folder, or a new `runs/<date>-<time>` under the working directory."""
    if run_dir is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = Path("runs") / stamp
        suffix = 1
        while path.exists():  # two runs started in the same second
            path, suffix = Path("runs") / f"{stamp}-{suffix}", suffix + 1
    else:
        path = Path(run_dir)
    path.mkdir(parents=True, exist_ok=True)
    return path.resolve()


def refuse_earlier_run(run_dir: str | Path | None) -> None:
    """Raise `ValueError` when `run_dir` already holds a training run (its `run.json` or `metrics.jsonl`).

    A new run there would start at step 0 and append its metrics, episodes and checkpoints to the earlier
    run's, and every curve and report would mix the two. Other files (an episode store, a warm start's
    own folder) are no run and are left alone.
    """
    if run_dir is None:
        return
    path = Path(run_dir)
    found = [name for name in (RUN_INFO_FILE, METRICS_FILE) if (path / name).is_file()]
    if found:
        raise ValueError(
            f"{path} already holds a run ({' and '.join(found)}): pass resume=True to continue it, or give "
            "another run_dir (or remove this one). A new run here would mix its metrics and episodes with "
            "the earlier run's."
        )


def write_run_info(run_dir: Path, config: TrainerConfig, start_step: int, facts: dict[str, Any]) -> None:
    """Write `run.json`: the configuration and what the run runs on (appended to on each resume)."""
    path = run_dir / RUN_INFO_FILE
    info: dict[str, Any] = (
        json.loads(path.read_text()) if path.exists() else {"config": config.to_dict(), "starts": []}
    )
    info["starts"].append({"at": time.time(), "step": start_step, **facts})
    path.write_text(json.dumps(info, indent=2, default=str))


def write_rank_info(run_dir: Path, placement: dict[str, Any], **devices: str) -> None:
    """Write `ranks/rank-<r>.json`: where this process's engine and policy actually are (each rank writes
    its own, so a multi-GPU run shows at a glance that no two ranks share a device)."""
    folder = run_dir / "ranks"
    folder.mkdir(exist_ok=True)
    (folder / f"rank-{placement['rank']}.json").write_text(json.dumps({**placement, **devices}, indent=2))


def read_rank_info(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every rank's `ranks/rank-<r>.json`, ordered by rank."""
    files = sorted((Path(run_dir) / "ranks").glob("rank-*.json"), key=lambda f: int(f.stem.split("-")[1]))
    return [json.loads(file.read_text()) for file in files]


def read_run_info(run_dir: str | Path) -> dict[str, Any]:
    """The contents of `run.json`, or an empty dict when the folder has none."""
    path = Path(run_dir) / RUN_INFO_FILE
    return json.loads(path.read_text()) if path.exists() else {}
