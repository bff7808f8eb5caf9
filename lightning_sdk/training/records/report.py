"""`lightning-sdk report RUN_DIR`: an HTML page with the reward and validation curves and sample episodes."""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

from lightning_sdk.tracing.episode import Episode, LLMCall
from lightning_sdk.tracing.store import EpisodeStore
from lightning_sdk.training.records.metrics import read_metrics
from lightning_sdk.training.records.run_dir import read_run_info

__all__ = ["moving_average", "plot_curves", "role_keys", "signal_share", "write_report"]

REPORT_FILE = "report.html"
MOVING_AVERAGE_STEPS = 5
"""Window of the training reward's moving average: one step's mean over a few groups is noisy."""


def plot_curves(history: list[dict[str, Any]], folder: Path) -> list[Path]:
    """Draw the training reward and validation curves as PNGs in `folder`; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never open a window
    import matplotlib.pyplot as plt

    reward = _series(history, "reward_mean")
    figures: list[tuple[str, str, dict[str, list[tuple[int, float]]]]] = [
        (
            "reward.png",
            "Training reward (mean over the step's episodes)",
            {
                "reward_mean": reward,
                f"moving average ({MOVING_AVERAGE_STEPS} steps)": moving_average(
                    reward, MOVING_AVERAGE_STEPS
                ),
            },
        ),
        (
            "validation.png",
            "Validation (held-out tasks)",
            {key: _series(history, key) for key in ("val_reward", "val_success_rate")},
        ),
        (
            "signal.png",
            "Share of the step's groups that carried a learning signal",
            {"groups with a reward spread": signal_share(history)},
        ),
        (
            "step_groups.png",
            'credit="step": share of trained calls whose state another sample faced',
            {"step_group_share": _series(history, "step_group_share")},
        ),
        (
            "roles.png",
            "Each role's calls: mean credited reward (TrainerConfig.roles)",
            {key: _series(history, key) for key in role_keys(history, "reward/")},
        ),
    ]
    written = []
    for name, title, series in figures:
        if not any(points for points in series.values()):
            continue
        figure, axes = plt.subplots(figsize=(6.4, 3.6), dpi=100)
        for key, points in series.items():
            if points:
                axes.plot(*zip(*points, strict=True), marker="o", markersize=3, label=key)
        if name in ("signal.png", "step_groups.png"):
            axes.set_ylim(-0.05, 1.05)
        axes.set_xlabel("step")
        axes.set_title(title)
        axes.grid(alpha=0.3)
        axes.legend()
        figure.tight_layout()
        path = folder / name
        figure.savefig(path)
        plt.close(figure)
        written.append(path)
    return written


def role_keys(history: list[dict[str, Any]], prefix: str) -> list[str]:
    """The per-role metric keys with `prefix` (`"reward/"` gives `reward/<role>`) in the history, sorted."""
    return sorted({key for record in history for key in record if key.startswith(prefix)})


def _series(history: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    return [(int(record["step"]), float(record[key])) for record in history if _finite(record.get(key))]


def moving_average(points: list[tuple[int, float]], window: int) -> list[tuple[int, float]]:
    """The trailing mean of the last `window` points at each point (fewer at the start)."""
    averaged = []
    for index, (step, _) in enumerate(points):
        recent = [value for _, value in points[max(0, index - window + 1) : index + 1]]
        averaged.append((step, math.fsum(recent) / len(recent)))
    return averaged


def signal_share(history: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """Per step, the share of rolled-out groups whose rewards differed (the ones GRPO learns from).

    Uses `groups_with_signal / groups_rolled_out` when the run recorded them, else (older runs) the
    groups that were not skipped."""
    points = []
    for record in history:
        if _finite(record.get("groups_with_signal")) and record.get("groups_rolled_out"):
            share = record["groups_with_signal"] / record["groups_rolled_out"]
        elif record.get("groups"):
            skipped = sum(
                record.get(f"groups_skipped_{reason}") or 0 for reason in ("no_spread", "too_few_episodes")
            )
            share = (record["groups"] - skipped) / record["groups"]
        else:
            continue
        points.append((int(record["step"]), float(share)))
    return points


def write_report(run_dir: str | Path, episodes_shown: int = 6) -> Path:
    """Write `run_dir/report.html` (with its PNGs beside it) and return its path."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir} is not a run folder (pass the run_dir a training run wrote).")
    history = read_metrics(run_dir)
    if not history:
        raise FileNotFoundError(f"{run_dir} has no metrics.jsonl records yet; train for at least one step.")
    images = plot_curves(history, run_dir)
    episodes = _sample_episodes(run_dir / "episodes.sqlite", episodes_shown)
    held_out = _sample_episodes(run_dir / "evaluations.sqlite", episodes_shown)
    info = read_run_info(run_dir)
    parts = [
        f"<h1>Training run {html.escape(run_dir.name)}</h1>",
        _summary_table(history),
        *(f'<img src="{image.name}" alt="{image.stem}">' for image in images),
        *(["<h2>Sample episodes (last step)</h2>"] if episodes else []),
        *(_episode_html(episode) for episode in episodes),
        *(["<h2>Held-out episodes (last evaluation)</h2>"] if held_out else []),
        *(_episode_html(episode) for episode in held_out),
        "<h2>Configuration</h2>",
        f"<pre>{html.escape(json.dumps(info.get('config', {}), indent=2))}</pre>",
    ]
    path = run_dir / REPORT_FILE
    path.write_text(_PAGE.format(title=html.escape(run_dir.name), body="\n".join(parts)), encoding="utf-8")
    return path


def _summary_table(history: list[dict[str, Any]]) -> str:
    steps = [record for record in history if "reward_mean" in record]
    evals = [record for record in history if "val_reward" in record]
    rows = [("steps trained", str(max((int(r["step"]) for r in steps), default=0)))]
    if evals:
        rows.append(
            (
                "validation reward, first → last",
                f"{_number(evals[0]['val_reward'])} → {_number(evals[-1]['val_reward'])}",
            )
        )
        best = [record for record in evals if "best_step" in record]
        if best:
            rows.append(
                (
                    "best validation reward (the run's adapter: best_adapter/)",
                    f"{_number(best[-1]['val_reward'])} at step {int(best[-1]['best_step'])}",
                )
            )
    if steps:
        averaged = moving_average(_series(history, "reward_mean"), MOVING_AVERAGE_STEPS)
        if averaged:
            rows.append(
                (
                    f"training reward, moving average of {MOVING_AVERAGE_STEPS} steps, first → last",
                    f"{_number(averaged[0][1])} → {_number(averaged[-1][1])}",
                )
            )
        shares = signal_share(history)
        if shares:
            mean_share = math.fsum(share for _, share in shares) / len(shares)
            rows.append(("groups with a learning signal (mean over steps)", f"{mean_share:.0%}"))
        solved = sum(int(r.get("groups_all_solved", 0)) for r in steps)
        alike = sum(int(r.get("groups_all_alike_unsolved", 0)) for r in steps)
        if solved or alike:
            rows.append(
                (
                    "groups without a signal: every sample solved / every sample alike, unsolved",
                    f"{solved} / {alike}",
                )
            )
        rows += _step_credit_rows(steps)
        seconds = [r["time_step_s"] for r in steps if "time_step_s" in r]
        if seconds:
            rows.append(("seconds per step (median)", f"{sorted(seconds)[len(seconds) // 2]:.1f}"))
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def _step_credit_rows(steps: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Under `credit="step"`: how often a trained call shared its state with another sample's call, and
    the mean size of the episode and step parts of the advantages, averaged over steps."""
    rows = []
    for key, label, percent in (
        ("step_group_share", "trained calls sharing a state with another sample (credit=step)", True),
        ("advantage_episode_abs_mean", "mean |episode advantage| (credit=step)", False),
        ("advantage_step_abs_mean", "mean |weighted step advantage| (credit=step)", False),
    ):
        values = [float(record[key]) for record in steps if _finite(record.get(key))]
        if values:
            average = math.fsum(values) / len(values)
            rows.append((label + ", mean over steps", f"{average:.0%}" if percent else f"{average:.3f}"))
    return rows


def _number(value: object) -> str:
    # A step whose episodes all failed has no mean reward: metrics.jsonl holds null (its NaN).
    return f"{value:.3f}" if _finite(value) else "n/a"


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _sample_episodes(path: Path, count: int) -> list[Episode]:
    """The best and worst episodes of the newest step stored in `path` (none when it does not exist)."""
    if not path.exists():
        return []
    with EpisodeStore(path) as store:
        episodes = store.episodes()
    if not episodes:
        return []
    last_step = max(episode.metadata.get("step", 0) for episode in episodes)
    last = [episode for episode in episodes if episode.metadata.get("step", 0) == last_step]
    last.sort(key=lambda episode: episode.reward if episode.reward is not None else -math.inf, reverse=True)
    # The best and the worst of the last step: what the agent learned, and what it still gets wrong.
    return last[: count // 2] + last[-(count - count // 2) :] if len(last) > count else last


def _episode_html(episode: Episode) -> str:
    reward = "none" if episode.reward is None else f"{episode.reward:.3f}"
    calls = []
    for call in episode.all_calls():
        prompt = call.messages[-1].get("content") if call.messages else call.prompt
        calls.append(
            f"<li><b>{html.escape(str(call.agent_name))}</b>: <pre>{html.escape(str(prompt))}</pre>"
            f"→ <pre>{html.escape(_reply_text(call))}</pre></li>"
        )
    error = f"<p>error: {html.escape(episode.error['message'])}</p>" if episode.error else ""
    return (
        f"<details><summary>reward {reward} — task {html.escape(_short(episode.task))}</summary>"
        f"{error}<ol>{''.join(calls)}</ol>"
        f"<p>output: <code>{html.escape(_short(episode.output))}</code></p></details>"
    )


def _reply_text(call: LLMCall) -> str:
    """What the model answered: its text and its tool calls as `name(arguments)` (a tool call has no text)."""
    parts = [call.text] if call.text else []
    for tool_call in (call.response_message or {}).get("tool_calls") or []:
        function = tool_call.get("function") or {}
        parts.append(f"{function.get('name')}({function.get('arguments', '')})")
    return "\n".join(parts) if parts else str(call.error or "(empty reply)")


def _short(value: object, limit: int = 160) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>lightning-sdk run {title}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem}}
table{{border-collapse:collapse}}th,td{{text-align:left;padding:.2rem .8rem;border-bottom:1px solid #ddd}}
img{{max-width:100%;display:block;margin:1rem 0}}pre{{white-space:pre-wrap;background:#f6f6f6;padding:.4rem}}
details{{margin:.5rem 0}}</style></head>
<body>{body}</body></html>
"""
