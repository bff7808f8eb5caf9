"""`RunSource`: what the explorer reads of a run folder, kept current while the run writes it.

A run folder (`training/records/`) holds `metrics.jsonl` (one line per step or evaluation), `run.json` (the
configuration), `episodes.sqlite` (every training rollout, with `metadata` step, task_index and sample)
and `evaluations.sqlite` (every held-out episode, with `metadata` step and task_index). The trainer may be
writing all of them while the page is open: files that do not exist yet are looked for again on the next
request, `metrics.jsonl` is read from where the last read stopped, and a line cut short is left for later.
"""

from __future__ import annotations

import json
import math
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from lightning_sdk.explorer.episode_views import episode_agents, group_view, short, task_text
from lightning_sdk.explorer.store_reader import EpisodeFilter, StoreProblem, StoreReader
from lightning_sdk.tracing.episode import Episode
from lightning_sdk.training.records.metrics import METRICS_FILE
from lightning_sdk.training.records.policy_gap import MISMATCH_HIGH
from lightning_sdk.training.records.report import (
    MOVING_AVERAGE_STEPS,
    moving_average,
    role_keys,
    signal_share,
)
from lightning_sdk.training.records.run_dir import read_run_info
from lightning_sdk.training.records.run_episodes import EPISODES_FILE, EVALUATIONS_FILE
from lightning_sdk.training.records.run_warnings_file import read_warnings

__all__ = ["GROUPS_PER_PAGE", "GroupSort", "RunSource", "charts"]

GROUPS_PER_PAGE = 20
TASKS_PER_PAGE = 50
GroupSort = Literal["task", "worst", "best", "spread"]
"""How a step's groups are ordered: by task index, lowest mean reward first, highest first, or largest reward
spread first."""
SORTS: tuple[str, ...] = get_args(GroupSort)
NONE = "\u2013"  # an en dash: no value


class MetricsTail:
    """`metrics.jsonl`, read incrementally: only the bytes appended since the last read are parsed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: list[dict[str, Any]] = []
        self._offset = 0
        self._lock = threading.Lock()  # the server answers requests on several threads

    def read(self) -> list[dict[str, Any]]:
        """Every whole record so far."""
        with self._lock:
            return list(self._read())

    def _read(self) -> list[dict[str, Any]]:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            self.records, self._offset = [], 0
            return self.records
        if size < self._offset:  # rewritten shorter (a resumed run drops the steps it redoes)
            self.records, self._offset = [], 0
        if size > self._offset:
            with self.path.open("rb") as file:
                file.seek(self._offset)
                chunk = file.read(size - self._offset)
            whole = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits for the next read
            self._offset += len(whole)
            for line in whole.decode("utf-8", errors="replace").split("\n"):
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(record, dict) and isinstance(record.get("step"), int | float):
                    self.records.append(record)
        return self.records


def _points(records: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    return [
        (int(record["step"]), float(record[key]))
        for record in records
        if isinstance(record.get(key), int | float) and math.isfinite(record[key])
    ]


def staleness_ages(records: list[dict[str, Any]]) -> list[int]:
    """The ages the run counted groups at (`groups_staleness_<k>`, k = 0..max_staleness)."""
    prefix = "groups_staleness_"
    found = {key[len(prefix) :] for record in records for key in record if key.startswith(prefix)}
    return sorted(int(age) for age in found if age.isdigit())


Spec = tuple[str, str, dict[str, list[tuple[int, float]]]]
"""A chart: its id, its title, and its named series of [step, value] points."""


def charts(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Run page's curves, as JSON for the page's script: each chart a title and named series of
    [step, value] points (charts without a point are left out)."""
    specs = _learning_charts(records) + _engine_charts(records)
    return [
        {
            "id": name,
            "title": title,
            "series": [{"name": key, "points": points} for key, points in series.items()],
        }
        for name, title, series in specs
        if any(series.values())
    ]


def _learning_charts(records: list[dict[str, Any]]) -> list[Spec]:
    """Reward, held-out, signal, roles and step-level credit."""
    reward = _points(records, "reward_mean")
    return [
        (
            "reward",
            "Training reward (mean over the step's episodes)",
            {
                "reward_mean": reward,
                f"moving average ({MOVING_AVERAGE_STEPS} steps)": moving_average(
                    reward, MOVING_AVERAGE_STEPS
                ),
            },
        ),
        (
            "held_out",
            "Held-out reward and success rate",
            {key: _points(records, key) for key in ("val_reward", "val_success_rate")},
        ),
        (
            "signal",
            "Share of groups with a learning signal",
            {"groups with a reward spread": signal_share(records)},
        ),
        (
            "roles",
            "Each role's mean credited reward",
            {key: _points(records, key) for key in role_keys(records, "reward/")},
        ),
        (
            "credit",
            'Step-level credit (credit="step"): share of trained calls that shared a state, mean |advantage|',
            {
                "share of calls in a step group": _points(records, "step_group_share"),
                "mean |episode advantage|": _points(records, "advantage_episode_abs_mean"),
                "mean |step advantage|": _points(records, "advantage_step_abs_mean"),
            },
        ),
    ]


def _engine_charts(records: list[dict[str, Any]]) -> list[Spec]:
    """The two policies' gap, rollouts through the update, the engine's busy share, and time."""
    return [
        (
            "policy_gap",
            "Engine against trainer: mean |log p_trainer - log p_engine| per trained token, in nats "
            f"(high above {MISMATCH_HIGH})",
            {"mean |log ratio|": _points(records, "mismatch_logratio_abs")},
        ),
        (
            "policy_gap_shares",
            "Engine against trainer: share of tokens off by more than 2x, share of the signal the "
            "importance weights removed",
            {
                "tokens off by more than 2x": _points(records, "mismatch_tail_share"),
                "signal removed by the importance weights": _points(records, "mismatch_signal_removed"),
            },
        ),
        (
            "staleness",
            "Rollouts through the update (max_staleness): groups trained by age, too old, running",
            {
                **{
                    f"trained, {age} update(s) old": _points(records, f"groups_staleness_{age}")
                    for age in staleness_ages(records)
                },
                "too old (left out)": _points(records, "groups_too_old"),
                "running through the update": _points(records, "groups_in_flight"),
            },
        ),
        (
            "capped_by_staleness",
            "Share of trained tokens whose importance weight hit the cap, by how many updates old their "
            "sample was",
            {
                f"{age} update(s) old": _points(records, f"importance_capped_fraction_s{age}")
                for age in staleness_ages(records)
            },
        ),
        (
            "engine_busy",
            "Share of the step the engine had model calls in flight; calls held during the update",
            {
                "engine busy": _points(records, "engine_busy_share"),
                "calls held": _points(records, "calls_held"),
            },
        ),
        (
            "time",
            "Seconds per step: rollout, update, weight sync",
            {
                "rollout": _points(records, "time_rollout_s"),
                "update": _points(records, "time_train_s"),
                "weight sync": _points(records, "time_weight_sync_s"),
            },
        ),
    ]


def warnings(records: list[dict[str, Any]], logged: list[dict[str, Any]] | None = None) -> list[str]:
    """What the run warned about (`warnings.jsonl`), then what went wrong by the step metrics (a run that
    kept no warnings file still shows these)."""
    found = [str(record["message"]) for record in logged or []]
    for record in records:
        step = int(record["step"])
        for key, text in (
            ("episodes_failed", "episode(s) failed (the agent raised or timed out)"),
            ("episodes_not_stored", "episode(s) not stored: the episode store reached its size limit"),
            ("samples_dropped_too_long", "sample(s) dropped: longer than max_sample_tokens"),
            ("val_episodes_failed", "held-out episode(s) failed"),
        ):
            count = record.get(key)
            if isinstance(count, int | float) and count > 0:
                found.append(f"step {step}: {count:g} {text}")
        if record.get("groups_rolled_out") and record.get("groups_with_signal") == 0:
            found.append(
                f"step {step}: no group carried a learning signal (every group's rewards were equal)"
            )
    return found


@dataclass
class RunSource:
    """A run folder, read live."""

    run_dir: Path
    metrics: MetricsTail = field(init=False)
    _stores: dict[str, StoreReader] = field(default_factory=dict, init=False)
    _opening: threading.Lock = field(default_factory=threading.Lock, init=False)

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)
        if not self.run_dir.is_dir():
            raise StoreProblem(
                f"{self.run_dir} is not a run folder: pass the run_dir a training run wrote "
                "(runs/<date-time> by default), or --store FILE for an episode store."
            )
        self.metrics = MetricsTail(self.run_dir / METRICS_FILE)

    # --- the files ----------------------------------------------------------------------------------------
    def store(self, kind: str) -> StoreReader | None:
        """The training (`"training"`) or held-out (`"evaluations"`) store; None until the run wrote it."""
        with self._opening:
            if kind not in self._stores:
                path = self.run_dir / (EPISODES_FILE if kind == "training" else EVALUATIONS_FILE)
                if not path.is_file():
                    return None
                self._stores[kind] = StoreReader(path)
            return self._stores[kind]

    def config(self) -> dict[str, Any]:
        try:
            config = read_run_info(self.run_dir).get("config", {})
        except (OSError, json.JSONDecodeError):  # written while we read it: shown on the next request
            return {}
        return config if isinstance(config, dict) else {}

    def logged_warnings(self) -> list[dict[str, Any]]:
        """The warnings the run kept in `warnings.jsonl`."""
        return read_warnings(self.run_dir)

    def success_threshold(self) -> float:
        value = self.config().get("success_threshold", 1.0)
        return float(value) if isinstance(value, int | float) else 1.0

    def close(self) -> None:
        for store in self._stores.values():
            store.close()

    # --- the Run page -------------------------------------------------------------------------------------
    def steps(self) -> list[dict[str, Any]]:
        """One row per training step: its metrics and how many of its episodes are stored, newest first."""
        stored: dict[int, int] = defaultdict(int)
        training = self.store("training")
        for row in training.refresh() if training is not None else []:
            if row.step is not None:
                stored[row.step] += 1
        by_step = {int(r["step"]): r for r in self.metrics.read() if "reward_mean" in r or "groups" in r}
        rows = []
        for step in sorted(set(by_step) | set(stored), reverse=True):
            record = by_step.get(step, {})
            rows.append(
                {
                    "step": step,
                    "reward": _format(record.get("reward_mean")),
                    "signal": _signal(record),
                    "episodes": stored.get(step, 0),
                    "seconds": _format(record.get("time_step_s"), 1),
                }
            )
        return rows

    # --- Step -> groups -> samples ------------------------------------------------------------------------
    def step_groups(
        self, step: int, where: EpisodeFilter, sort: GroupSort | str = "task", page: int = 0
    ) -> dict[str, Any]:
        """The step's groups (a page of them), each with its samples side by side; samples not matching
        `where` are left out, and groups left empty with them."""
        training = self.store("training")
        rowids = [row.rowid for row in training.refresh() if row.step == step] if training else []
        episodes = training.load(rowids) if training else []
        groups: dict[Any, list[Episode]] = defaultdict(list)
        for episode in episodes:
            if not where.active or where.matches(episode):
                groups[episode.metadata.get("task_index")].append(episode)
        threshold = self.success_threshold()
        views = [group_view(members, threshold) for members in groups.values()]
        key = {
            "task": lambda g: (g["task_index"] is None, g["task_index"] or 0),
            "worst": lambda g: g["mean_value"],
            "best": lambda g: -g["mean_value"],
            "spread": lambda g: -g["spread_value"],
        }[sort if sort in SORTS else "task"]
        views.sort(key=key)
        start = page * GROUPS_PER_PAGE
        return {
            "step": step,
            "groups": views[start : start + GROUPS_PER_PAGE],
            "group_count": len(views),
            "episode_count": len(episodes),
            "page": page,
            "pages": max(1, math.ceil(len(views) / GROUPS_PER_PAGE)),
            "agents": sorted({name for episode in episodes for name in episode_agents(episode)}),
        }

    # --- Held-out -----------------------------------------------------------------------------------------
    def held_out(self, page: int = 0, failing_only: bool = False) -> dict[str, Any]:
        """Each held-out task in a row, its result at each evaluation in a column (step 0: before
        training)."""
        evaluations = self.store("evaluations")
        index = evaluations.refresh() if evaluations is not None else []
        steps = sorted({row.step for row in index if row.step is not None})
        cells: dict[int, dict[int, int]] = defaultdict(dict)
        for row in index:
            if row.task_index is not None and row.step is not None:
                cells[row.task_index][row.step] = row.rowid
        tasks = sorted(cells)
        threshold = self.success_threshold()
        if failing_only and evaluations is not None and steps:
            last = [cells[task].get(steps[-1]) for task in tasks]
            finals = evaluations.load([rowid for rowid in last if rowid is not None])
            failing = {
                e.metadata.get("task_index") for e in finals if e.reward is None or e.reward < threshold
            }
            tasks = [task for task in tasks if task in failing]
        shown = tasks[page * TASKS_PER_PAGE : (page + 1) * TASKS_PER_PAGE]
        wanted = [rowid for task in shown for rowid in cells[task].values()]
        loaded = {
            (e.metadata.get("task_index"), e.metadata.get("step")): e
            for e in (evaluations.load(wanted) if evaluations is not None else [])
        }
        rows = []
        for task in shown:
            results = []
            for step in steps:
                episode = loaded.get((task, step))
                results.append(
                    None
                    if episode is None
                    else {
                        "id": episode.id,
                        "reward": _format(episode.reward),
                        "failed": episode.reward is None or episode.reward < threshold,
                        "output": short(episode.output, 160),
                    }
                )
            first = next((loaded[(task, s)] for s in steps if (task, s) in loaded), None)
            rows.append(
                {
                    "task_index": task,
                    "task": short(task_text(first.task) if first else "", 300),
                    "results": results,
                }
            )
        return {
            "steps": steps,
            "rows": rows,
            "task_count": len(tasks),
            "page": page,
            "pages": max(1, math.ceil(len(tasks) / TASKS_PER_PAGE)),
            "failing_only": failing_only,
        }


def _format(value: Any, digits: int = 3) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return NONE
    return f"{value:.{digits}f}"


def _signal(record: dict[str, Any]) -> str:
    signal, rolled = record.get("groups_with_signal"), record.get("groups_rolled_out")
    if isinstance(signal, int | float) and isinstance(rolled, int | float) and rolled:
        return f"{signal:g}/{rolled:g}"
    return NONE
