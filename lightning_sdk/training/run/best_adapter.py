"""The adapter of the best held-out score so far, kept beside the last one.

A run with a validation set evaluates at the start, every `eval_every` steps and at the end. GRPO can lose
ground (a warm start trained again at a fresh adapter's learning rate, a judge that disagrees with the
true reward), so the adapter each evaluation scored highest is saved in `run_dir/best_adapter` with a
`best.json` that says its step and metrics; `run_dir/adapter` stays the last one. The starting adapter
(step 0: the base model's zero adapter, or `init_adapter`) competes too, so a run that never beats its
start hands back what it started from. A resumed run reads `best.json` and keeps competing against it.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lightning_sdk.training.update.folders.whole_folders import write_text_whole

__all__ = [
    "BEST_ADAPTER_DIR",
    "BEST_FILE",
    "SCORE_KEY",
    "BestAdapter",
    "is_better",
    "read_best",
    "write_best",
]

BEST_ADAPTER_DIR = "best_adapter"
"""The best adapter's folder inside the run folder."""
BEST_FILE = "best.json"
"""Its step and metrics, inside that folder."""
SCORE_KEY = "reward"
"""The validation metric compared: the mean held-out reward (`evaluation.summarize_rollouts`)."""


@dataclass
class BestAdapter:
    """Which evaluation scored highest so far."""

    step: int
    score: float
    metrics: dict[str, float]


def is_better(metrics: dict[str, float] | None, best: BestAdapter | None) -> bool:
    """Whether an evaluation beats the best so far: strictly higher (a tie keeps the earlier adapter, the
    one fewer steps away from where the run started); a score that is not finite never wins."""
    if metrics is None:
        return False
    score = metrics.get(SCORE_KEY)
    if not isinstance(score, (int, float)) or not math.isfinite(score):
        return False
    return best is None or score > best.score


def read_best(run_dir: Path) -> BestAdapter | None:
    """The best adapter recorded in `run_dir` (a resumed run), or None."""
    path = run_dir / BEST_ADAPTER_DIR / BEST_FILE
    if not path.is_file():
        return None
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return BestAdapter(step=int(data["step"]), score=float(data["score"]), metrics=dict(data["metrics"]))


def write_best(folder: Path, best: BestAdapter) -> None:
    """Record in the adapter folder `folder` which step its adapter comes from. The trainer writes it into
    the staging folder of `best_adapter` before that is renamed into place, so the adapter and its record
    are replaced together; the file itself is written whole too (a staging name, then a rename)."""
    write_text_whole(folder / BEST_FILE, json.dumps(asdict(best), indent=1) + "\n")
