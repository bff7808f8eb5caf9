"""`EpisodeStore`: finished episodes in one SQLite file, to train on later or export.

One row per top-level episode: a few indexed columns to filter on (run, name, start time) and the
whole episode, sub-agents included, as JSON. The database runs in WAL mode, so a trainer or a
notebook can read the file while an agent keeps appending to it.

A store can be given a size limit (`max_size_mb`): SQLite itself enforces it (`max_page_count`), and an
append that would pass it raises `EpisodeStoreFull` and writes nothing, so a long-running agent fills a
disk only as far as its owner allowed.

Rewards that arrive later (`add_feedback`, `lightning_sdk.tracing.rewards.feedback`) update a stored
episode in one write transaction, so feedback sent by several processes at once is never lost. The store
knows a feedback only as something that updates an episode (`EpisodeUpdate`), so the feedback API can
use the store without the store depending on it. The file records the
version of its layout (`SCHEMA_VERSION`, SQLite's `user_version`): a store written by a newer release is
refused with a message rather than misread.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol, Self

from lightning_sdk.tracing.episode import Episode

__all__ = [
    "SCHEMA_VERSION",
    "EpisodeStore",
    "EpisodeStoreFull",
    "EpisodeUpdate",
    "StoreVersionError",
    "UnknownEpisode",
]


class EpisodeUpdate(Protocol):
    """What `EpisodeStore.add_feedback` applies: a `lightning_sdk.tracing.rewards.feedback.Feedback`."""

    def apply_to(self, episode: Episode) -> Episode:
        """`episode` with the update applied (in place, and returned)."""
        ...


SCHEMA_VERSION = 1
"""The layout of the store's file (SQLite `user_version`); 0 is a file written before it was recorded."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS episodes (
    id TEXT PRIMARY KEY,
    run_id TEXT,
    name TEXT NOT NULL,
    started_at REAL NOT NULL,
    ended_at REAL,
    reward REAL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS episodes_by_run ON episodes (run_id, started_at);
CREATE INDEX IF NOT EXISTS episodes_by_name ON episodes (name, started_at);
CREATE INDEX IF NOT EXISTS episodes_by_time ON episodes (started_at);
"""

Time = float | dt.datetime


class EpisodeStoreFull(RuntimeError):
    """An append would take the store past its `max_size_mb`; nothing of that append was written."""

    def __init__(self, path: Path, max_size_mb: float, episodes: int) -> None:
        self.path = path
        self.max_size_mb = max_size_mb
        super().__init__(
            f"The episode store {path} reached its size limit of {max_size_mb:g} MB; {episodes} episode(s) "
            "were not stored. Export and delete old runs (EpisodeStore.export_jsonl), or open the store "
            "with a larger max_size_mb (TrainerConfig.episode_store_max_mb for a training run; None means "
            "no limit)."
        )


class StoreVersionError(RuntimeError):
    """The store's file was written by a release with a newer layout than this one reads."""


class UnknownEpisode(KeyError):
    """No stored episode has this id."""

    def __init__(self, episode_id: str, store: str) -> None:
        self.episode_id = episode_id
        super().__init__(
            f"No episode {episode_id!r} in {store}. Feedback names a top-level episode stored there "
            "(ls.last_episode().id after the agent returns, or ls.current_episode().id inside it, with "
            "ls.configure(store=...) set where the agent runs)."
        )

    def __str__(self) -> str:  # KeyError's own str() would quote the message
        return str(self.args[0])


def _timestamp(value: Time) -> float:
    return value.timestamp() if isinstance(value, dt.datetime) else float(value)


class EpisodeStore:
    """Append finished episodes to a SQLite file and read them back.

        store = ls.EpisodeStore("episodes.db")
        ls.configure(store=store)                      # every finished episode is appended
        recent = store.episodes(name="solver", since=time.time() - 3600)
        store.export_jsonl("episodes.jsonl", run_id="prod")

    Safe to share between threads (writes are serialised by a lock). Adding an episode whose id is
    already stored replaces it. With `max_size_mb`, an append that would grow the file past it raises
    `EpisodeStoreFull` and stores nothing of that append (the episodes already stored stay readable).
    """

    def __init__(self, path: str | os.PathLike[str], max_size_mb: float | None = None) -> None:
        if max_size_mb is not None and not max_size_mb > 0:
            raise ValueError(f"max_size_mb={max_size_mb!r} must be positive, or None for no limit.")
        self.path = Path(path)
        self.max_size_mb = max_size_mb
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._connection = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._connection.execute("PRAGMA journal_mode=WAL")
        self._connection.execute("PRAGMA synchronous=NORMAL")  # durable at checkpoints; fast appends
        self._connection.execute("PRAGMA busy_timeout=10000")  # wait for other processes' writes
        self._check_version()
        self._connection.executescript(_SCHEMA)
        if max_size_mb is not None:
            self._limit_size(max_size_mb)

    @classmethod
    def open_existing(cls, path: str | os.PathLike[str], max_size_mb: float | None = None) -> EpisodeStore:
        """The store at `path`, which must exist: for readers (`lightning-sdk sft`), where a mistyped path
        would otherwise open a new, empty store and train on nothing. `FileNotFoundError` otherwise."""
        if not Path(path).is_file():
            raise FileNotFoundError(
                f"No episode store at {path}: check the path. A store is made by the agent that records into "
                "it (ls.configure(store=...)), by `lightning-sdk import`, or by a training run "
                "(run_dir/episodes.sqlite)."
            )
        return cls(path, max_size_mb)

    def _check_version(self) -> None:
        (version,) = self._connection.execute("PRAGMA user_version").fetchone()
        if version > SCHEMA_VERSION:
            self._connection.close()
            raise StoreVersionError(
                f"{self.path} was written by a newer lightning-sdk (store layout {version}; this release "
                f"reads up to {SCHEMA_VERSION}). Upgrade lightning-sdk to read it; nothing was changed."
            )
        if version < SCHEMA_VERSION:  # a new file, or one from before versions were recorded: same rows
            self._connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _limit_size(self, max_size_mb: float) -> None:
        page_size = self._connection.execute("PRAGMA page_size").fetchone()[0]
        pages = max(1, int(max_size_mb * 1024 * 1024) // page_size)
        # SQLite keeps the larger of this and the current size: a store already past the limit stays
        # readable and refuses further appends.
        self._connection.execute(f"PRAGMA max_page_count = {pages}")

    def add(self, episode: Episode) -> None:
        """Append one finished episode."""
        self.add_many([episode])

    def add_many(
        self, episodes: Iterable[Episode], merge: Callable[[Episode, Episode], None] | None = None
    ) -> None:
        """Append several episodes in one transaction.

        `merge(episode, stored)` is called, inside that transaction, for each episode whose id is already
        stored, before it replaces the stored one: to keep what was attached to the stored copy since
        (an import keeps its feedback, `trace_files.store_traces`). The transaction holds SQLite's write
        lock from the first read, so feedback another process writes meanwhile waits and lands on top,
        rather than being read stale and overwritten."""
        episodes = list(episodes)
        with self._lock:
            self._connection.execute("BEGIN IMMEDIATE" if merge is not None else "BEGIN")
            try:
                if merge is not None:
                    for episode in episodes:
                        row = self._connection.execute(
                            "SELECT data FROM episodes WHERE id = ?", (episode.id,)
                        ).fetchone()
                        if row is not None:
                            merge(episode, Episode.from_json(row[0]))
                rows = [
                    (e.id, e.run_id, e.name, e.started_at, e.ended_at, e.reward, e.to_json())
                    for e in episodes
                ]
                self._connection.executemany(
                    "INSERT OR REPLACE INTO episodes VALUES (?, ?, ?, ?, ?, ?, ?)", rows
                )
            except sqlite3.OperationalError as error:
                self._rollback()
                if self.max_size_mb is not None and error.sqlite_errorcode == sqlite3.SQLITE_FULL:
                    raise EpisodeStoreFull(self.path, self.max_size_mb, len(episodes)) from error
                raise
            except BaseException:
                self._rollback()
                raise
            self._connection.execute("COMMIT")

    def _rollback(self) -> None:
        # SQLite has already rolled back after some errors (a full database among them).
        if self._connection.in_transaction:
            self._connection.execute("ROLLBACK")

    def discard_steps_after(self, run_id: str, step: int) -> int:
        """Delete the run's episodes of training steps after `step` (their `metadata["step"]`); returns how
        many. A run resumed from the checkpoint of `step` redoes those steps: the episodes a killed attempt
        stored for them would otherwise stand beside the redone ones."""
        with self._lock:
            cursor = self._connection.execute(
                "DELETE FROM episodes WHERE run_id = ? AND json_extract(data, '$.metadata.step') > ?",
                (run_id, step),
            )
        return cursor.rowcount

    def add_feedback(self, episode_id: str, feedback: EpisodeUpdate) -> Episode:
        """Apply a reward that arrived later to the stored episode `episode_id` (a `Feedback`, see
        `lightning_sdk.tracing.rewards.feedback`) and return the updated episode; `UnknownEpisode` when no
        stored episode has that id. Read and write are one transaction that holds SQLite's write lock, so two
        processes giving feedback at once both land."""
        with self._lock:
            self._connection.execute("BEGIN IMMEDIATE")
            try:
                row = self._connection.execute(
                    "SELECT data FROM episodes WHERE id = ?", (episode_id,)
                ).fetchone()
                if row is None:
                    raise UnknownEpisode(episode_id, str(self.path))
                episode = feedback.apply_to(Episode.from_json(row[0]))
                self._connection.execute(
                    "UPDATE episodes SET reward = ?, data = ? WHERE id = ?",
                    (episode.reward, episode.to_json(), episode_id),
                )
            except BaseException:
                self._rollback()
                raise
            self._connection.execute("COMMIT")
        return episode

    def get(self, episode_id: str) -> Episode | None:
        """The episode with this id, or None."""
        with self._lock:
            row = self._connection.execute("SELECT data FROM episodes WHERE id = ?", (episode_id,)).fetchone()
        return Episode.from_json(row[0]) if row else None

    def episodes(
        self,
        *,
        run_id: str | None = None,
        name: str | None = None,
        since: Time | None = None,
        until: Time | None = None,
        limit: int | None = None,
    ) -> list[Episode]:
        """Stored episodes matching every given filter, oldest first.

        Args:
            run_id: only this run's episodes.
            name: only episodes of the agent with this name.
            since: only episodes started at or after this time (unix seconds or a datetime).
            until: only episodes started before this time.
            limit: at most this many, the most recent ones.
        """
        return list(self._iter(run_id=run_id, name=name, since=since, until=until, limit=limit))

    def _iter(
        self,
        *,
        run_id: str | None,
        name: str | None,
        since: Time | None,
        until: Time | None,
        limit: int | None,
    ) -> Iterator[Episode]:
        where, params = _filters(run_id, name, since, until)
        query = f"SELECT data FROM episodes {where} ORDER BY started_at DESC, rowid DESC"
        if limit is not None:
            if limit < 0:
                raise ValueError(f"limit must be >= 0, got {limit}")
            query += " LIMIT ?"
            params.append(limit)
        with self._lock:
            rows = self._connection.execute(query, params).fetchall()
        for (data,) in reversed(rows):
            yield Episode.from_json(data)

    def tasks(
        self,
        *,
        run_id: str | None = None,
        name: str | None = None,
        since: Time | None = None,
        until: Time | None = None,
        unique: bool = True,
    ) -> list[Any]:
        """The tasks the matching episodes were run on, oldest first: a training dataset made of the
        traffic an agent served (`Trainer.fit(agent, store.tasks(name="support"))`).

        A task is the agent's first argument as recorded (`Episode.task`): JSON data (dicts, lists,
        strings, numbers) comes back equal to what the agent was given. `unique` keeps the first of equal
        tasks; episodes recorded without a task are skipped."""
        where, params = _filters(run_id, name, since, until)
        with self._lock:
            rows = self._connection.execute(
                "SELECT json_type(data, '$.task'), json_extract(data, '$.task') FROM episodes "
                f"{where} ORDER BY started_at, rowid",
                params,
            ).fetchall()
        tasks, seen = [], set()
        for kind, value in rows:
            if kind in (None, "null") or (unique and (kind, value) in seen):
                continue
            seen.add((kind, value))
            tasks.append(_json_value(kind, value))
        return tasks

    def count(self, *, run_id: str | None = None, name: str | None = None) -> int:
        """How many episodes match the filters."""
        where, params = _filters(run_id, name, None, None)
        with self._lock:
            (count,) = self._connection.execute(f"SELECT COUNT(*) FROM episodes {where}", params).fetchone()
        return int(count)

    def run_ids(self) -> list[str]:
        """The distinct run ids stored, in order of first appearance."""
        with self._lock:
            rows = self._connection.execute(
                "SELECT run_id FROM episodes WHERE run_id IS NOT NULL "
                "GROUP BY run_id ORDER BY MIN(started_at)"
            ).fetchall()
        return [row[0] for row in rows]

    def export_jsonl(
        self,
        path: str | os.PathLike[str],
        *,
        run_id: str | None = None,
        name: str | None = None,
        since: Time | None = None,
        until: Time | None = None,
        limit: int | None = None,
    ) -> int:
        """Write matching episodes to a JSON Lines file (one `Episode.to_json()` per line).

        Returns the number of episodes written. Read them back with `Episode.from_json(line)`.
        """
        episodes = self._iter(run_id=run_id, name=name, since=since, until=until, limit=limit)
        count = 0
        with open(path, "w", encoding="utf-8") as file:
            for episode in episodes:
                file.write(episode.to_json() + "\n")
                count += 1
        return count

    def close(self) -> None:
        """Close the database connection."""
        with self._lock:
            self._connection.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __len__(self) -> int:
        return self.count()

    def __repr__(self) -> str:
        return f"EpisodeStore({str(self.path)!r})"


def _filters(
    run_id: str | None, name: str | None, since: Time | None, until: Time | None
) -> tuple[str, list[object]]:
    clauses: list[str] = []
    params: list[object] = []
    for clause, value in (("run_id = ?", run_id), ("name = ?", name)):
        if value is not None:
            clauses.append(clause)
            params.append(value)
    for clause, time in (("started_at >= ?", since), ("started_at < ?", until)):
        if time is not None:
            clauses.append(clause)
            params.append(_timestamp(time))
    return ("WHERE " + " AND ".join(clauses)) if clauses else "", params


def _json_value(kind: str, value: Any) -> Any:
    """A value `json_extract` returned, as the JSON it was: objects and arrays come back as JSON text,
    booleans as 0 and 1."""
    if kind in ("object", "array"):
        return json.loads(value)
    if kind in ("true", "false"):
        return kind == "true"
    return value
