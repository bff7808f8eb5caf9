"""The pages' common parts: the Jinja2 templates (autoescape on), the shipped front-end files, and what a
query string asks for. Shared by the live app and the one-file snapshot; no FastAPI here."""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path
from typing import Any

from lightning_sdk.explorer.links import Links
from lightning_sdk.explorer.run_folder import RunSource, charts, warnings
from lightning_sdk.explorer.run_summary import summary
from lightning_sdk.explorer.store_reader import EpisodeFilter

__all__ = ["asset", "filter_from", "page_number", "render", "run_context", "templates"]

HERE = Path(__file__).parent


@cache
def templates() -> Any:
    """The Jinja2 environment (autoescape on for every template)."""
    try:
        import jinja2
    except ImportError as error:
        raise ImportError(
            "lightning-sdk view needs Jinja2, FastAPI and uvicorn: pip install 'lightning-sdk[view]'"
        ) from error
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # every template, whatever its name: recorded text is never markup
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    return environment


def asset(name: str) -> str:
    """The text of a shipped front-end file (`static/explorer.js`, `static/explorer.css`)."""
    return (HERE / "static" / name).read_text(encoding="utf-8")


def filter_from(query: dict[str, str]) -> EpisodeFilter:
    """The filter a page's query string asks for (an unreadable number is ignored)."""
    return EpisodeFilter(
        text=query.get("q", "").strip(),
        agent=query.get("agent", "").strip(),
        min_reward=_float(query.get("min")),
        max_reward=_float(query.get("max")),
        errors_only=query.get("errors") in ("1", "on", "true"),
    )


def _float(value: str | None) -> float | None:
    try:
        number = float(value) if value not in (None, "") else None
    except ValueError:
        return None
    return number if number is not None and math.isfinite(number) else None


def page_number(value: str | None) -> int:
    return int(value) if value is not None and value.isdigit() else 0


def render(name: str, links: Links, mode: str, layout: str = "base.html", **context: Any) -> str:
    """A page (`layout="fragment.html"`: only its content, for the snapshot)."""
    page: str = templates().get_template(name).render(links=links, mode=mode, layout=layout, **context)
    return page


def run_context(source: RunSource) -> dict[str, Any]:
    records = source.metrics.read()
    return {
        "title": source.run_dir.name,
        "charts": charts(records),
        "summary": summary(records),
        "record_count": len(records),
        "last_step": max((int(r["step"]) for r in records), default=None),
        "steps": source.steps(),
        "config_text": json.dumps(source.config(), indent=2, ensure_ascii=False, default=str),
        "warnings": warnings(records, source.logged_warnings()),
        "has_held_out": source.store("evaluations") is not None,
    }
