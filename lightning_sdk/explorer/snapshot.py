"""`write_snapshot`: the explorer's views in one HTML file that opens offline (`report.html`).

The same templates as the live pages, each view a `<section>` of the file, shown by the address's `#name`
(the page's own script, inlined). A large run is cut to a size: the newest steps whole, a sample of the
older ones spread over the run, and episodes only while the file stays under `max_mb`; an episode left out
says so on its sample's card (`lightning-sdk view RUN_DIR` shows everything).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lightning_sdk.explorer.episode_views import episode_view
from lightning_sdk.explorer.links import SnapshotLinks
from lightning_sdk.explorer.pages import asset, render, run_context
from lightning_sdk.explorer.run_folder import RunSource
from lightning_sdk.explorer.store_reader import EpisodeFilter, StoreProblem

__all__ = ["write_snapshot"]

SNAPSHOT_FILE = "report.html"


def _steps_to_show(steps: list[int], newest: int, sampled: int) -> list[int]:
    """The newest `newest` steps, and `sampled` of the others spread evenly over the run (newest first)."""
    recent, older = steps[:newest], steps[newest:]
    if len(older) > sampled:
        stride = len(older) / sampled
        older = [older[int(index * stride)] for index in range(sampled)]
    return recent + older


def write_snapshot(
    run_dir: str | Path,
    path: str | Path | None = None,
    *,
    newest_steps: int = 3,
    sampled_steps: int = 7,
    max_mb: float = 20.0,
) -> Path:
    """Write the run's views into one HTML file (default `run_dir/report.html`) and return its path.

    Args:
        run_dir: a training run's folder.
        path: where to write the file.
        newest_steps: the newest steps shown whole.
        sampled_steps: how many of the older steps are shown, spread over the run.
        max_mb: episodes are added while the file stays under this size.
    """
    source = RunSource(Path(run_dir))
    if not source.metrics.read():
        raise StoreProblem(f"{run_dir} has no metrics.jsonl records yet; train for at least one step.")
    links = SnapshotLinks()
    try:
        context = run_context(source)
        steps = _steps_to_show([row["step"] for row in context["steps"]], newest_steps, sampled_steps)
        links.steps = set(steps)
        step_views = [_all_groups(source, step) for step in steps]
        held_out = source.held_out()
        # The episodes first: the views link only to those that fit, so they are chosen before the views.
        episodes = _episode_sections(source, links, _episodes_in(step_views, held_out), int(max_mb * 2**20))
        front = _view_sections(source, links, context, step_views, held_out)
    finally:
        source.close()
    script = asset("explorer.js")
    if "</script" in script.lower():  # our own file; it must not end its own element early
        raise AssertionError("explorer.js must not contain '</script'")
    page = render(
        "snapshot.html",
        links,
        "run",
        title=Path(run_dir).name,
        css=asset("explorer.css"),
        script=script,
        sections=front + episodes,
    )
    target = Path(path) if path is not None else Path(run_dir) / SNAPSHOT_FILE
    target.write_text(page, encoding="utf-8")
    return target


def _episode_sections(
    source: RunSource, links: SnapshotLinks, wanted: Iterable[tuple[str, str]], budget: int
) -> list[str]:
    """A section per episode, in the order wanted, while they fit in `budget` characters; each one kept
    gets its anchor in `links`."""
    sections: list[str] = []
    used = 0
    for kind, episode_id in wanted:
        reader = source.store(kind)
        episode = reader.get(episode_id) if reader is not None else None
        if episode is None:
            continue
        anchor = f"episode-{len(links.episodes)}"
        view = episode_view(episode)
        page = render("episode.html", links, "run", "fragment.html", title="", kind=kind, episode=view)
        if used + len(page) > budget:
            break
        links.include(kind, episode_id)
        sections.append(_section(anchor, page))
        used += len(page)
    return sections


def _view_sections(
    source: RunSource,
    links: SnapshotLinks,
    context: dict[str, Any],
    step_views: list[dict[str, Any]],
    held_out: dict[str, Any],
) -> list[str]:
    """The Run page, each shown step's groups, and the held-out tasks, as sections."""

    def fragment(name: str, **view: Any) -> str:
        return render(name, links, "run", "fragment.html", **view)

    front = [_section("run", fragment("run.html", **context))]
    for view in step_views:
        page = fragment("step.html", title="", query={}, sorts=(), sort="task", **view)
        front.append(_section(f"step-{view['step']}", page))
    if held_out["rows"]:
        page = fragment("held_out.html", title="", threshold=source.success_threshold(), **held_out)
        front.append(_section("held-out", page))
    return front


def _all_groups(source: RunSource, step: int) -> dict[str, Any]:
    view = source.step_groups(step, EpisodeFilter(), "task", 0)
    for page in range(1, view["pages"]):
        view["groups"] += source.step_groups(step, EpisodeFilter(), "task", page)["groups"]
    view["pages"] = 1
    return view


def _episodes_in(step_views: list[dict[str, Any]], held_out: dict[str, Any]) -> list[tuple[str, str]]:
    """The episodes the shown views link to, in the order they get a place: each step's groups first (the
    newest steps first), then the held-out results."""
    wanted = [
        ("training", sample["id"])
        for view in step_views
        for group in view["groups"]
        for sample in group["samples"]
    ]
    wanted += [("evaluations", cell["id"]) for row in held_out["rows"] for cell in row["results"] if cell]
    return wanted


def _section(anchor: str, content: str) -> str:
    return f'<section class="view" id="{anchor}">\n{content}\n</section>'
