"""The explorer's web app: one FastAPI app over a run folder or an episode store, pages from Jinja2 templates.

Pages are rendered on the server with autoescape on, so every recorded string reaches the browser as text.
The page's only script (`static/explorer.js`, ours, shipped in the package) draws the curves and polls
`/api/metrics` for new steps; it sets `textContent` and SVG attributes, never markup.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
from collections.abc import AsyncIterator
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
KINDS = ("training", "evaluations", "store")


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
    source = RunSource(Path(run_dir)) if run_dir is not None else None
    production = StoreReader(store) if store is not None else None
    mode = "run" if source is not None else "store"

    @contextlib.asynccontextmanager
    async def lifespan(_app: Any) -> AsyncIterator[None]:
        yield
        if source is not None:
            source.close()
        if production is not None:
            production.close()

    app = FastAPI(
        title="lightning-sdk run explorer", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan
    )
    app.middleware("http")(KeyCheck(key, cookie_name(port)))

    def html(name: str, depth: int = 0, **context: Any) -> HTMLResponse:
        """A page `depth` folders below the root (its links are relative to it: `Links`)."""
        return HTMLResponse(render(name, Links(depth), mode, **context))

    def problem(status: int, message: str, depth: int = 0) -> HTMLResponse:
        title = HTTPStatus(status).phrase.lower()  # "not found", "internal server error"
        page = render("problem.html", Links(depth), mode, title=title, message=message)
        return HTMLResponse(page, status_code=status)

    @app.exception_handler(StoreProblem)
    async def store_problem(request: Request, error: StoreProblem) -> HTMLResponse:
        return problem(500, str(error), _depth(request))

    @app.get("/", response_class=HTMLResponse)
    def home(request: Request) -> HTMLResponse:
        if source is not None:
            return html("run.html", **run_context(source))
        assert production is not None
        query = dict(request.query_params)
        where, page = filter_from(query), page_number(query.get("page"))
        episodes, total = production.page(page * STORE_PAGE_SIZE, STORE_PAGE_SIZE, where)
        return html(
            "store.html",
            title=production.path.name,
            episodes=[sample_view(episode, 1.0) | _store_row(episode) for episode in episodes],
            total=total,
            page=page,
            pages=max(1, math.ceil(total / STORE_PAGE_SIZE)),
            query=query,
        )

    @app.get("/step/{step}", response_class=HTMLResponse)
    def step_page(step: int, request: Request) -> HTMLResponse:
        if source is None:
            message = "An episode store has no training steps: its episodes are on the first page."
            return problem(404, message, depth=1)
        query = dict(request.query_params)
        sort = query.get("sort", "task")
        view = source.step_groups(step, filter_from(query), sort, page_number(query.get("page")))
        return html("step.html", 1, title=f"step {step}", query=query, sorts=SORTS, sort=sort, **view)

    @app.get("/episode/{kind}/{episode_id}", response_class=HTMLResponse)
    def episode_page(kind: str, episode_id: str) -> HTMLResponse:
        reader = production if kind == "store" else source.store(kind) if source and kind in KINDS else None
        episode = reader.get(episode_id) if reader is not None else None
        if episode is None:
            return problem(404, f"No episode {episode_id!r} among the {kind} episodes.", depth=2)
        view = episode_view(episode)
        return html("episode.html", 2, title=f"episode {episode.name}", kind=kind, episode=view)

    @app.get("/held-out", response_class=HTMLResponse)
    def held_out_page(request: Request) -> HTMLResponse:
        if source is None:
            return problem(404, "An episode store has no held-out evaluations.")
        query = dict(request.query_params)
        view = source.held_out(page_number(query.get("page")), failing_only=query.get("failing") == "1")
        return html("held_out.html", title="held-out", threshold=source.success_threshold(), **view)

    @app.get("/api/metrics")
    def metrics(known: int = -1) -> JSONResponse:
        """The curves, when the page holds another number of records than `metrics.jsonl` has now (else
        only the count)."""
        records = source.metrics.read() if source is not None else []
        body: dict[str, Any] = {"count": len(records)}
        if len(records) != known:
            body["charts"] = charts(records)
            body["last_step"] = max((int(r["step"]) for r in records), default=None)
            body["steps"] = source.steps() if source is not None else []
        return JSONResponse(body)

    @app.get("/static/{name}")
    def static(name: str) -> Response:
        media = {"explorer.js": "text/javascript", "explorer.css": "text/css"}.get(name)
        if media is None:
            return PlainTextResponse("not found", status_code=404)
        return Response(asset(name), media_type=media, headers={"cache-control": "no-cache"})

    return app


def _depth(request: Request) -> int:
    """How many folders below the explorer's root the requested page is (`/step/3`: 1)."""
    return max(request.url.path.strip("/").count("/"), 0)


def _store_row(episode: Episode) -> dict[str, Any]:
    started = dt.datetime.fromtimestamp(episode.started_at).strftime("%Y-%m-%d %H:%M:%S")
    feedback = episode.metadata.get(FEEDBACK_KEY)
    return {
        "name": episode.name,
        "started": started,
        "task": short(episode.task, 200),
        "feedback": len(feedback) if isinstance(feedback, list) else 0,
    }
