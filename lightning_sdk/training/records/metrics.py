"""Metrics of a run: `metrics.jsonl` always, TensorBoard and W&B on request, and live progress lines.

`metrics.jsonl` has one JSON object per line, each with `step` and `time` plus the step's metrics;
it is flushed after every line, so a killed run keeps every finished step. Non-finite numbers are
written as `null` (JSON has no NaN).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self, TextIO

from lightning_sdk.training.records.policy_gap import mismatch_is_high

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

    from lightning_sdk.rollouts.in_process import Rollout

__all__ = ["METRICS_FILE", "EvaluationProgress", "MetricsWriter", "ProgressBar", "read_metrics"]

METRICS_FILE = "metrics.jsonl"


def _plain(value: object) -> Any:
    """A JSON-ready copy: tensors and NumPy scalars become numbers, NaN and infinities become None."""
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
        value = value.item()
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return str(value)


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a `metrics.jsonl` file (or of the one in a run folder); a torn last line is skipped."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").split("\n"):  # not splitlines(): see cli._read_jsonl
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut short by a kill; every earlier line is whole
    return records


class MetricsWriter:
    """Writes one record per step to `metrics.jsonl` and to the backends in `report_to`.

    Args:
        run_dir: the run folder.
        report_to: extra backends, `"tensorboard"` and/or `"wandb"`.
        config: the run's configuration (JSON-ready), given to W&B.
        resume_step: when resuming after step N, records with `step > N` (written after the
            checkpoint) are removed so the history has no duplicates.
        wandb_project: W&B project name.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        report_to: Iterable[str] = (),
        config: Mapping[str, Any] | None = None,
        resume_step: int | None = None,
        wandb_project: str | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        if resume_step is not None:
            self._truncate_after(resume_step)
        self.history: list[dict[str, Any]] = read_metrics(self.path)
        self._file = self.path.open("a", encoding="utf-8")
        self._tensorboard: SummaryWriter | None = None
        self._wandb = None
        self._wandb_step = -1
        report_to = list(report_to)
        if "tensorboard" in report_to:
            self._tensorboard = _open_tensorboard(self.run_dir / "tensorboard")
        if "wandb" in report_to:
            self._wandb = _open_wandb(self.run_dir, config, wandb_project)

    def _truncate_after(self, step: int) -> None:
        kept = [record for record in read_metrics(self.path) if record.get("step", 0) <= step]
        temporary = self.path.with_suffix(".jsonl.tmp")
        temporary.write_text("".join(json.dumps(record) + "\n" for record in kept), encoding="utf-8")
        temporary.replace(self.path)

    def log(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """Write the metrics of `step`; returns the record as written."""
        record = {"step": step, "time": time.time(), **_plain(dict(metrics))}
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._file.flush()
        self.history.append(record)
        numbers = {
            key: value
            for key, value in record.items()
            if key not in ("step", "time") and isinstance(value, (int, float)) and not isinstance(value, bool)
        }
        if self._tensorboard is not None:
            for key, value in numbers.items():
                self._tensorboard.add_scalar(key, value, step)
            self._tensorboard.flush()
        if self._wandb is not None:
            # W&B drops a step lower than one it has seen: an evaluation that ran beside training ends a
            # few steps after the step it scored, so it goes under the latest step, naming its own.
            if step < self._wandb_step:
                numbers["evaluated_step"] = step
            self._wandb_step = max(self._wandb_step, step)
            self._wandb.log(numbers, step=self._wandb_step)
        return record

    def close(self) -> None:
        """Flush and close every backend."""
        if not self._file.closed:
            self._file.close()
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _open_tensorboard(folder: Path) -> SummaryWriter:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as error:
        raise ImportError(
            "report_to includes 'tensorboard' but the `tensorboard` package is not installed: run "
            "`pip install tensorboard`, or remove 'tensorboard' from TrainerConfig.report_to."
        ) from error
    return SummaryWriter(log_dir=str(folder))


def _open_wandb(run_dir: Path, config: Mapping[str, Any] | None, project: str | None) -> Any:
    try:
        import wandb
    except ImportError as error:
        raise ImportError(
            "report_to includes 'wandb' but the `wandb` package is not installed: run `pip install wandb` "
            "(and `wandb login`), or remove 'wandb' from TrainerConfig.report_to."
        ) from error
    return wandb.init(
        project=project,
        name=run_dir.name,
        dir=str(run_dir),
        config=dict(config or {}),
        # The run folder's name is the W&B run id, so a resumed run continues the same W&B run.
        id=re.sub(r"[^A-Za-z0-9_-]", "-", run_dir.name),
        resume="allow",
    )


class ProgressBar:
    """A one-line live progress display: step, reward and seconds per step.

    Uses tqdm when it is installed (and `stream` is a terminal or tqdm decides to draw), else prints
    a short line per step. `enabled=False` shows nothing.
    """

    def __init__(
        self, total: int, initial: int = 0, enabled: bool = True, stream: TextIO | None = None
    ) -> None:
        self.total = total
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self._bar = None
        self._last_time = time.monotonic()
        tqdm = _tqdm() if enabled else None
        if tqdm is not None:
            self._bar = tqdm(total=total, initial=initial, desc="training", unit="step", file=self.stream)

    def update(self, step: int, metrics: Mapping[str, Any]) -> str:
        """Advance to `step` and show the key metrics; returns the text shown."""
        now = time.monotonic()
        seconds = now - self._last_time
        self._last_time = now
        parts = []
        for key, label in (("reward_mean", "reward"), ("val_reward_mean", "val"), ("loss", "loss")):
            value = metrics.get(key)
            if isinstance(value, (int, float)) and math.isfinite(value):
                parts.append(f"{label}={value:.3f}")
        signal, rolled_out = metrics.get("groups_with_signal"), metrics.get("groups_rolled_out")
        if isinstance(signal, int) and isinstance(rolled_out, int) and rolled_out:
            parts.append(f"signal={signal}/{rolled_out}")  # groups GRPO could learn from
        if mismatch_is_high(metrics):  # the engine samples from another policy than the one that learns
            parts.append(f"gap={metrics['mismatch_logratio_abs']:.3f}")
        stale, too_old = metrics.get("staleness_mean"), metrics.get("groups_too_old")
        if isinstance(stale, (int, float)) and math.isfinite(stale):  # rollouts through the update
            parts.append(f"stale={stale:.1f}" + (f" old={too_old:.0f}" if too_old else ""))
            flight, busy = metrics.get("groups_in_flight"), metrics.get("engine_busy_share")
            # The groups that ran on through the update, and the share of the step the engine was busy.
            if isinstance(flight, (int, float)):
                parts.append(f"flight={flight:.0f}")
            if isinstance(busy, (int, float)) and math.isfinite(busy):
                parts.append(f"busy={busy:.0%}")
        shared = metrics.get("step_group_share")
        if isinstance(shared, (int, float)) and math.isfinite(shared):
            parts.append(f"shared={shared:.0%}")  # credit="step": calls whose state another sample faced
        parts.append(f"{seconds:.1f}s/step")
        text = " ".join(parts)
        if not self.enabled:
            return text
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)
            self._bar.update(step - self._bar.n)
        else:
            print(f"step {step}/{self.total} {text}", file=self.stream, flush=True)
        return text

    def close(self) -> None:
        """Close the bar."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class EvaluationProgress:
    """A transient count of finished evaluation episodes, then one line with the held-out result.

    Evaluations run the agent on every validation task and can take minutes; without this the run would
    print nothing meanwhile. `enabled=False` shows nothing; `live=False` shows only the result's line (an
    evaluation beside training, whose count would fight the step's progress line).
    """

    def __init__(
        self,
        step: int,
        total: int,
        enabled: bool = True,
        stream: TextIO | None = None,
        live: bool = True,
    ) -> None:
        self.step = step
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self._bar = None
        tqdm = _tqdm() if enabled and live else None
        if tqdm is not None:
            label = "evaluating the base model" if step == 0 else f"evaluating after step {step}"
            self._bar = tqdm(total=total, desc=label, unit="task", leave=False, file=self.stream)

    def episode_done(self, _rollout: Rollout | None = None) -> None:
        """Count one finished episode (the `on_finished` callback of `run_rollouts`)."""
        if self._bar is not None:
            self._bar.update(1)

    def finish(self, metrics: Mapping[str, float]) -> str:
        """Close the counter and show the result; returns the line shown."""
        when = "base model" if self.step == 0 else f"step {self.step}"
        failed = int(metrics.get("episodes_failed", 0) or 0)
        text = (
            f"held-out ({when}): reward {metrics.get('reward', math.nan):.3f}, "
            f"success {metrics.get('success_rate', math.nan):.0%} of {int(metrics.get('episodes', 0))} tasks"
            + (f", {failed} failed" if failed else "")
        )
        tqdm = _tqdm() if self.enabled else None
        if self._bar is not None:
            self._bar.close()
        if tqdm is not None:  # above any progress line shown meanwhile
            tqdm.write(text, file=self.stream)
        elif self.enabled:
            print(text, file=self.stream, flush=True)
        return text


def _tqdm() -> Any:
    """tqdm's class when installed (it comes with the train extra), else None: progress then prints lines."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm
