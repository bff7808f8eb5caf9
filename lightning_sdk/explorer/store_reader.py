"""`StoreReader`: an episode store opened read-only, read a page at a time.

The viewer must never block or change what a running trainer (or a production agent) writes, so the file is
opened with SQLite's `mode=ro` URI: no write lock is ever taken, and in WAL mode a reader and the writer
never wait for each other. A missing file, a file that is not an episode store, and a store written by a
newer release each raise `StoreProblem` with a sentence saying what to do, rather than a SQLite traceback.

Only a small index stays in memory: each stored episode's row id, step and task index (three integers), so
that a step's page or a held-out task's row is found without reading the others. Episodes themselves are
parsed a page at a time. The index follows the file: appended rows are added on the next request; when rows
were deleted or replaced (a resumed run drops the steps it redoes), it is rebuilt.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from lightning_sdk.explorer.episode_views import episode_agents, episode_has_error, task_text
from lightning_sdk.tracing.episode import Episode
from lightning_sdk.tracing.store import SCHEMA_VERSION

__all__ = ["EpisodeFilter", "IndexRow", "StoreProblem", "StoreReader"]

_COLUMNS = {"id", "run_id", "name", "started_at", "ended_at", "reward", "data"}


class StoreProblem(RuntimeError):
    """The file cannot be shown: missing, not an episode store, or from a newer release."""


@dataclass(frozen=True)
class IndexRow:
    """Where one stored episode sits: its row, and the step and task it belongs to (None when the episode
    has none, as in a production store)."""

    rowid: int
    step: int | None
    task_index: int | None


@dataclass(frozen=True)
class EpisodeFilter:
    """What a list of episodes is narrowed to (every field optional)."""

    text: str = ""
    """A substring of the task (its JSON text), case-insensitive."""
    agent: str = ""
    """The agent's name, or the agent/role of one of its calls."""
    min_reward: float | None = None
    max_reward: float | None = None
    errors_only: bool = False
    """Only episodes where the agent or one of its calls failed."""

    @property
    def active(self) -> bool:
        return bool(self.text or self.agent or self.errors_only) or (
            self.min_reward is not None or self.max_reward is not None
        )

    def matches(self, episode: Episode) -> bool:
        """Whether `episode` passes every given condition."""
        if self.text and self.text.lower() not in task_text(episode.task).lower():
            return False
        if self.agent and self.agent not in episode_agents(episode):
            return False
        reward = episode.reward
        if self.min_reward is not None and (reward is None or reward < self.min_reward):
            return False
        if self.max_reward is not None and (reward is None or reward > self.max_reward):
            return False
        return not self.errors_only or episode_has_error(episode)


class StoreReader:
    """An `EpisodeStore` file, read-only. Safe to share between the server's threads."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise StoreProblem(
                f"No episode store at {self.path}: check the path. A training run writes "
                "run_dir/episodes.sqlite; an agent writes the file given to ls.configure(store=...)."
            )
        self._lock = threading.Lock()
        self._index: list[IndexRow] = []
        self._last_rowid = 0
        self._connection = self._connect()
        try:
            self._check_layout()
        except sqlite3.DatabaseError as error:
            self._connection.close()
            raise StoreProblem(
                f"{self.path} is not a readable episode store ({error}). Nothing was changed; point the "
                "viewer at a file an EpisodeStore wrote (run_dir/episodes.sqlite, or --store FILE)."
            ) from None
        except StoreProblem:
            self._connection.close()
            raise

    @property
    def _writer_active(self) -> bool:
        """Whether a writer has the file open (or left its log behind): SQLite's `-wal` file is there."""
        return Path(f"{self.path}-wal").exists()

    def _connect(self) -> sqlite3.Connection:
        # `mode=ro`: SQLite refuses every write, and in WAL mode a reader takes no lock a writer waits on.
        # A WAL reader needs the writer's `-wal` and `-shm` files, and makes them when they are missing:
        # with no writer about, the file is opened as immutable instead, so the viewer leaves no file
        # behind; `refresh` reopens it as a plain reader as soon as a writer appears.
        self._immutable = not self._writer_active
        uri = f"file:{quote(str(self.path.resolve()))}?mode=ro" + ("&immutable=1" if self._immutable else "")
        connection = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None)
        connection.execute("PRAGMA busy_timeout=10000")
        return connection

    def _follow_writer(self) -> None:
        """Reopen as a plain reader once a writer appeared (call with the lock held)."""
        if self._immutable and self._writer_active:
            self._connection.close()
            self._connection = self._connect()

    def _check_layout(self) -> None:
        (version,) = self._connection.execute("PRAGMA user_version").fetchone()
        if version > SCHEMA_VERSION:
            raise StoreProblem(
                f"{self.path} was written by a newer lightning-sdk (store layout {version}; this release "
                f"reads up to {SCHEMA_VERSION}). Upgrade lightning-sdk to view it; nothing was changed."
            )
        columns = {row[1] for row in self._connection.execute("PRAGMA table_info(episodes)")}
        if not columns >= _COLUMNS:
            raise StoreProblem(
                f"{self.path} is a SQLite file but not an episode store (no episodes table with the columns "
                f"{', '.join(sorted(_COLUMNS))}). Nothing was changed."
            )

    # --- the index ----------------------------------------------------------------------------------------
    def refresh(self) -> list[IndexRow]:
        """The index, brought up to date with the file (cheap when nothing changed)."""
        with self._lock:
            self._follow_writer()
            (count,) = self._connection.execute("SELECT COUNT(*) FROM episodes").fetchone()
            new = self._index_rows(after=self._last_rowid)
            if len(self._index) + len(new) != count:  # rows were deleted or replaced: read it all again
                self._index, self._last_rowid = [], 0
                new = self._index_rows(after=0)
            self._index.extend(new)
            if new:
                self._last_rowid = new[-1].rowid
            return self._index

    def _index_rows(self, after: int) -> list[IndexRow]:
        rows = self._connection.execute(
            "SELECT rowid, json_extract(data, '$.metadata.step'), "
            "json_extract(data, '$.metadata.task_index') FROM episodes WHERE rowid > ? ORDER BY rowid",
            (after,),
        ).fetchall()
        return [IndexRow(rowid, _integer(step), _integer(task)) for rowid, step, task in rows]

    # --- reading episodes ---------------------------------------------------------------------------------
    def load(self, rowids: Sequence[int]) -> list[Episode]:
        """The episodes of these rows, in the order given (rows gone since the index was read are left
        out)."""
        found: dict[int, Episode] = {}
        for start in range(0, len(rowids), 500):  # SQLite's limit on bound parameters
            chunk = list(rowids[start : start + 500])
            marks = ",".join("?" * len(chunk))
            with self._lock:
                self._follow_writer()
                rows = self._connection.execute(
                    f"SELECT rowid, data FROM episodes WHERE rowid IN ({marks})", chunk
                ).fetchall()
            found.update((rowid, Episode.from_json(data)) for rowid, data in rows)
        return [found[rowid] for rowid in rowids if rowid in found]

    def get(self, episode_id: str) -> Episode | None:
        """The top-level episode with this id, or None."""
        with self._lock:
            self._follow_writer()
            row = self._connection.execute("SELECT data FROM episodes WHERE id = ?", (episode_id,)).fetchone()
        return Episode.from_json(row[0]) if row else None

    def page(self, offset: int, limit: int, where: EpisodeFilter) -> tuple[list[Episode], int]:
        """Newest first: `limit` episodes from `offset` among those matching `where`, and how many match.
        The filters run in SQLite, so a page of a large production store parses only that page's rows."""
        clauses, params = _sql_filter(where)
        condition = ("WHERE " + " AND ".join(clauses)) if clauses else ""
        with self._lock:
            self._follow_writer()
            (total,) = self._connection.execute(
                f"SELECT COUNT(*) FROM episodes {condition}", params
            ).fetchone()
            rows = self._connection.execute(
                f"SELECT data FROM episodes {condition} "
                "ORDER BY started_at DESC, rowid DESC LIMIT ? OFFSET ?",
                [*params, limit, offset],
            ).fetchall()
        return [Episode.from_json(data) for (data,) in rows], int(total)

    def close(self) -> None:
        with self._lock:
            self._connection.close()


def _integer(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _sql_filter(where: EpisodeFilter) -> tuple[list[str], list[object]]:
    """`where` as SQL over the stored JSON (`Episode.to_json` writes `"key": value` with these spaces)."""
    clauses: list[str] = []
    params: list[object] = []
    if where.text:
        clauses.append("instr(lower(json_extract(data, '$.task')), lower(?)) > 0")
        params.append(where.text)
    if where.agent:
        clauses.append("(name = ? OR instr(data, ?) > 0)")
        params += [where.agent, f'"agent_name": {json.dumps(where.agent, ensure_ascii=False)}']
    if where.min_reward is not None:
        clauses.append("reward >= ?")
        params.append(where.min_reward)
    if where.max_reward is not None:
        clauses.append("reward <= ?")
        params.append(where.max_reward)
    if where.errors_only:  # the agent raised (an object), or a call failed (a string)
        clauses.append("(json_extract(data, '$.error') IS NOT NULL OR instr(data, '\"error\": \"') > 0)")
    return clauses, params
