"""Where a page's links point: routes of the live server, or sections of the one-file snapshot.

The templates only ever ask a `Links` for an address, so the live pages and `report.html` are the same
templates. Every address is built from our own route names and quoted ids, never from recorded text, so an
episode id such as `javascript:...` stays a harmless path segment.
"""

from __future__ import annotations

from urllib.parse import quote, urlencode

__all__ = ["Links", "SnapshotLinks"]


class Links:
    """The live server's routes."""

    live = True

    def run(self) -> str:
        return "/"

    def step(self, step: int, **query: object) -> str | None:
        kept = {key: value for key, value in query.items() if value not in (None, "", False, 0)}
        return f"/step/{int(step)}" + (f"?{urlencode(kept)}" if kept else "")

    def episode(self, kind: str, episode_id: str) -> str | None:
        return f"/episode/{quote(kind, safe='')}/{quote(episode_id, safe='')}"

    def held_out(self, **query: object) -> str:
        kept = {key: value for key, value in query.items() if value not in (None, "", False, 0)}
        return "/held-out" + (f"?{urlencode(kept)}" if kept else "")

    def store(self, **query: object) -> str:
        kept = {key: value for key, value in query.items() if value not in (None, "", False, 0)}
        return "/" + (f"?{urlencode(kept)}" if kept else "")


class SnapshotLinks(Links):
    """Sections of one HTML file: `#step-3`, `#episode-7`; an episode left out of the snapshot has none."""

    live = False

    def __init__(self, steps: set[int] | None = None) -> None:
        self.episodes: dict[tuple[str, str], int] = {}
        self.steps = steps or set()
        """The steps with a section of their own."""

    def include(self, kind: str, episode_id: str) -> str:
        """Give this episode a section (its anchor's name)."""
        number = self.episodes.setdefault((kind, episode_id), len(self.episodes))
        return f"episode-{number}"

    def run(self) -> str:
        return "#run"

    def step(self, step: int, **query: object) -> str | None:
        return f"#step-{int(step)}" if int(step) in self.steps else None

    def episode(self, kind: str, episode_id: str) -> str | None:
        number = self.episodes.get((kind, episode_id))
        return None if number is None else f"#episode-{number}"

    def held_out(self, **query: object) -> str:
        return "#held-out"
