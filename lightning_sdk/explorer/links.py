"""Where a page's links point: routes of the live server, or sections of the one-file snapshot.

The templates only ever ask a `Links` for an address, so the live pages and `report.html` are the same
templates. Every address is built from our own route names and quoted ids, never from recorded text, so an
episode id such as `javascript:...` stays a harmless path segment.

The live addresses are relative to the page they appear on (`../step/3` on an episode's page): behind a
proxy that serves the explorer under a path prefix (`https://host/explorer/`), every link, the stylesheet,
the script and the page's polling stay under that prefix.
"""

from __future__ import annotations

from urllib.parse import quote, urlencode

__all__ = ["Links", "SnapshotLinks"]


class Links:
    """The live server's routes, relative to a page `depth` folders below the explorer's root (0: `/`,
    `/held-out`; 1: `/step/3`; 2: `/episode/training/<id>`)."""

    live = True

    def __init__(self, depth: int = 0) -> None:
        self.root = "../" * depth

    def run(self) -> str:
        return self.root or "./"

    def step(self, step: int, **query: object) -> str | None:
        return f"{self.root}step/{int(step)}" + _query(query)

    def episode(self, kind: str, episode_id: str) -> str | None:
        return f"{self.root}episode/{quote(kind, safe='')}/{quote(episode_id, safe='')}"

    def held_out(self, **query: object) -> str:
        return f"{self.root}held-out" + _query(query)

    def store(self, **query: object) -> str:
        return (self.root or "./") + _query(query)

    def asset(self, name: str) -> str:
        """The page's stylesheet or script (`explorer.css`, `explorer.js`)."""
        return f"{self.root}static/{quote(name, safe='')}"

    def metrics_api(self) -> str:
        """What the Run page polls for new steps."""
        return f"{self.root}api/metrics"


def _query(query: dict[str, object]) -> str:
    kept = {key: value for key, value in query.items() if value not in (None, "", False, 0)}
    return f"?{urlencode(kept)}" if kept else ""


class SnapshotLinks(Links):
    """Sections of one HTML file: `#step-3`, `#episode-7`; an episode left out of the snapshot has none."""

    live = False

    def __init__(self, steps: set[int] | None = None) -> None:
        super().__init__()
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
