"""`FitResult`: what `Trainer.fit` returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["FitResult"]


@dataclass
class FitResult:
    """What `Trainer.fit` returns."""

    run_dir: Path
    """Folder with checkpoints, `metrics.jsonl`, the final adapter and reports."""
    adapter_path: Path
    """The run's LoRA adapter (peft folder, safetensors): with a validation set and `keep_best`, the one of
    the best held-out reward (`run_dir/best_adapter`, maybe the starting one); else the last one."""
    last_adapter_path: Path | None = None
    """The adapter after the last step (`run_dir/adapter`), whichever `adapter_path` is."""
    best_step: int | None = None
    """The step whose adapter `adapter_path` is, when it is the best evaluated one (0: the starting one)."""
    best_eval: dict[str, float] | None = None
    """The validation metrics of that adapter."""
    history: list[dict[str, Any]] = field(default_factory=list)
    """One metrics record per step (and per evaluation), as written to `metrics.jsonl`."""
    initial_eval: dict[str, float] | None = None
    """Validation metrics of the base model (before the first step), when a validation set was given."""
    final_eval: dict[str, float] | None = None
    """Validation metrics after the last step, when a validation set was given."""
