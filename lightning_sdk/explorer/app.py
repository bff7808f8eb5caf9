"""The explorer's web app: one FastAPI app over a run folder or an episode store, pages from Jinja2 templates.

Pages are rendered on the server with autoescape on, so every recorded string reaches the browser as text.
The page's only script (`static/explorer.js`, ours, shipped in the package) draws the curves and polls
`api/metrics` for new steps; it sets `textContent` and SVG attributes, never markup.

The two modes have routes of their own (`_run_routes`, `_store_routes`): a run folder has steps, held-out
tasks and curves; a store of production episodes has a filtered list. What a mode does not have answers a
404 that says so.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response

from lightning_sdk.explorer.access import KeyCheck, cookie_name
from lightning_sdk.explorer.episode_views import episode_view, sample_view, short
from lightning_sdk.explorer.links import Links
from lightning_sdk.explorer.pages import asset, filter_from, page_number, render, run_context
from lightning_sdk.explorer.run_folder import SORTS, RunSource, charts
from lightning_sdk.explorer.store_reader import StoreProblem, StoreReader
from lightning_sdk.tracing.episode import FEEDBACK_KEY, Episode

__all__ = ["STORE_PAGE_SIZE", "build_app"]

STORE_PAGE_SIZE = 50
RUN_KINDS = ("training", "evaluations")
"""The episode files of a run folder, as an episode's address names them."""
_ASSETS = {"explorer.js": "text/javascript", "explorer.css": "text/css"}


def build_app(
    run_dir: str | Path | None = None,
    store: str | Path | None = None,
    key: str | None = None,
    port: int | None = None,
) -> FastAPI:
    """The app over `run_dir` (a training run's folder) or `store` (an episode store file), one of them.

    `key`: every request must carry it (for an app reachable from other machines); None: none needed, and
    only requests addressed to this machine (Host 127.0.0.1, localhost, ::1) are answered. `port`: the port
    it is served on, which names the key's cookie (browsers keep one set of cookies for every port of a
    host). Raises `StoreProblem` when the folder or the file cannot be read."""
    if (run_dir is None) == (store is None):
        raise ValueError("build_app needs a run folder or an episode store file, one of the two.")
    opened = RunSource(Path(run_dir)) if run_dir is not None else StoreReader(Path(str(store)))

    @contextlib.asynccontextmanager
    async def lifespan(_app: Any) -> AsyncIterator[None]:
        yield
        opened.close()

    app = FastAPI(
        title="lightning-sdk run explorer", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan
    )
    app.middleware("http")(KeyCheck(key, cookie_name(port)))
    pages = _Pages("run" if isinstance(opened, RunSource) else "store")

    @app.exception_handler(StoreProblem)
    async def store_problem(request: Request, error: StoreProblem) -> HTMLResponse:
        return pages.problem(500, str(error), _depth(request))

    if isinstance(opened, RunSource):
        _run_routes(app, opened, pages)
    else:
        _store_routes(app, opened, pages)
    app.get("/static/{name}")(_static)
    return app


@dataclass(frozen=True)
class _Pages:
    """Renders a page of one mode, with links relative to where it is (`Links(depth)`)."""

    mode: str

    def html(self, name: str, depth: int = 0, **context: Any) -> HTMLResponse:
        """A page `depth` folders below the explorer's root."""
        return HTMLResponse(render(name, Links(depth), self.mode, **context))

    def problem(self, status: int, message: str, depth: int = 0) -> HTMLResponse:
        """An error page titled by its status ("not found", "internal server error")."""
        title = HTTPStatus(status).phrase.lower()
        page = render("problem.html", Links(depth), self.mode, title=title, message=message)
        return HTMLResponse(page, status_code=status)


def _run_routes(app: FastAPI, source: RunSource, pages: _Pages) -> None:
    """A training run's folder: the Run page with its curves, each step's groups, episodes, held-out."""

    @app.get("/", response_class=HTMLResponse)
    def home() -> HTMLResponse:
        return pages.html("run.html", **run_context(source))

    @app.get("/step/{step}", response_class=HTMLResponse)
    def step_page(step: int, request: Request) -> HTMLResponse:
        query = dict(request.query_params)
        sort = query.get("sort", "task")
        view = source.step_groups(step, filter_from(query), sort, page_number(query.get("page")))
        return pages.html("step.html", 1, title=f"step {step}", query=query, sorts=SORTS, sort=sort, **view)

    @app.get("/episode/{kind}/{episode_id}", response_class=HTMLResponse)
    def episode_page(kind: str, episode_id: str) -> HTMLResponse:
        reader = source.store(kind) if kind in RUN_KINDS else None  # None until the run wrote that file
        return _episode(pages, kind, episode_id, reader.get(episode_id) if reader is not None else None)

    @app.get("/held-out", response_class=HTMLResponse)
    def held_out_page(request: Request) -> HTMLResponse:
        query = dict(request.query_params)
        view = source.held_out(page_number(query.get("page")), failing_only=query.get("failing") == "1")
        return pages.html("held_out.html", title="held-out", threshold=source.success_threshold(), **view)

    @app.get("/api/metrics")
    def metrics(known: int = -1) -> JSONResponse:
        """The curves, when the page holds another number of records than `metrics.jsonl` has now (else
        only the count)."""
        records = source.metrics.read()
        body: dict[str, Any] = {"count": len(records)}
        if len(records) != known:
            body["charts"] = charts(records)
            body["last_step"] = max((int(r["step"]) for r in records), default=None)
            body["steps"] = source.steps()
        return JSONResponse(body)


def _store_routes(app: FastAPI, production: StoreReader, pages: _Pages) -> None:
    """An episode store of production traces: a filtered, paged list, and each episode."""

    @app.get("/", response_class=HTMLResponse)
    def home(request: Request) -> HTMLResponse:
        query = dict(request.query_params)
        where, page = filter_from(query), page_number(query.get("page"))
        episodes, total = production.page(page * STORE_PAGE_SIZE, STORE_PAGE_SIZE, where)
        return pages.html(
            "store.html",
            title=production.path.name,
            episodes=[sample_view(episode, 1.0) | _store_row(episode) for episode in episodes],
            total=total,
            page=page,
            pages=max(1, math.ceil(total / STORE_PAGE_SIZE)),
            query=query,
        )

    @app.get("/episode/{kind}/{episode_id}", response_class=HTMLResponse)
    def episode_page(kind: str, episode_id: str) -> HTMLResponse:
        episode = production.get(episode_id) if kind == "store" else None
        return _episode(pages, kind, episode_id, episode)

    for path, what in (("/step/{step}", "training steps"), ("/held-out", "held-out evaluations")):
        app.get(path, response_class=HTMLResponse)(_absent(pages, path, what))


def _episode(pages: _Pages, kind: str, episode_id: str, episode: Episode | None) -> HTMLResponse:
    if episode is None:
        return pages.problem(404, f"No episode {episode_id!r} among the {kind} episodes.", depth=2)
    view = episode_view(episode)
    return pages.html("episode.html", 2, title=f"episode {episode.name}", kind=kind, episode=view)


def _absent(pages: _Pages, path: str, what: str) -> Callable[[], HTMLResponse]:
    """A route an episode store does not have: a 404 saying where its episodes are."""

    def absent() -> HTMLResponse:
        message = f"An episode store has no {what}: its episodes are on the first page."
        return pages.problem(404, message, depth=path.strip("/").count("/"))

    return absent


def _static(name: str) -> Response:
    media = _ASSETS.get(name)
    if media is None:
        return PlainTextResponse("not found", status_code=404)
    return Response(asset(name), media_type=media, headers={"cache-control": "no-cache"})


def _depth(request: Request) -> int:
    """How many folders below the explorer's root the requested page is (`/step/3`: 1), also when a proxy
    serves the explorer under a path prefix (the scope's `root_path`)."""
    path, prefix = request.url.path, request.scope.get("root_path", "")
    return path.removeprefix(prefix).strip("/").count("/")


def _store_row(episode: Episode) -> dict[str, Any]:
    started = dt.datetime.fromtimestamp(episode.started_at).strftime("%Y-%m-%d %H:%M:%S")
    feedback = episode.metadata.get(FEEDBACK_KEY)
    return {
        "name": episode.name,
        "started": started,
        "task": short(episode.task, 200),
        "feedback": len(feedback) if isinstance(feedback, list) else 0,
    }
