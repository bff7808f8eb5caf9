"""The search engine behind the agent's tool: SQLite FTS5 full-text search with BM25 ranking.

The index is an ordinary SQLite file (Python's `sqlite3` ships with FTS5). A query is free text, as a
model writes it: it is split into words, common question words are dropped, and the remaining words are
OR-ed, so "Who founded Brenvik Works?" finds the entry that mentions Brenvik and Works most.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable
from pathlib import Path

__all__ = ["Corpus", "build_index", "fts_query"]

_STOPWORDS = frozenset(
    {
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "by",
        "did",
        "does",
        "do",
        "for",
        "from",
        "has",
        "have",
        "in",
        "is",
        "it",
        "of",
        "on",
        "or",
        "the",
        "to",
        "was",
        "were",
        "what",
        "when",
        "where",
        "which",
        "who",
        "whom",
        "whose",
        "why",
        "how",
        "city",
        "year",
        "founded",
        "founder",
        "born",
        "make",
        "makes",
        "made",
        "headquarters",
        "company",
    }
)
"""Words that appear in every question or every entry; searching for them only adds noise."""
_WORD = re.compile(r"[A-Za-z0-9]+")


def fts_query(text: str) -> str | None:
    """An FTS5 query for free text: its distinctive words, quoted and OR-ed (None if there are none).

    Quoting each word keeps FTS5 syntax (AND, NEAR, *, ") in model-written text from being interpreted.
    When every word is a stop word, the stop words are searched after all (better than nothing).
    """
    words = [word.lower() for word in _WORD.findall(text or "")]
    distinctive = [word for word in words if word not in _STOPWORDS] or words
    unique = list(dict.fromkeys(distinctive))
    return " OR ".join(f'"{word}"' for word in unique) if unique else None


def build_index(path: str | Path, entries: Iterable[tuple[str, str]]) -> Path:
    """Write a new FTS5 index of (title, text) entries to `path` (replacing any file there)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE VIRTUAL TABLE entries USING fts5(title, text)")
        connection.executemany("INSERT INTO entries (title, text) VALUES (?, ?)", entries)
    connection.close()
    return path


class Corpus:
    """Read-only search over an index written by `build_index`.

    Each search opens its own connection, so the corpus is safe to share between concurrent episodes
    (threads or asyncio tasks); opening a local SQLite file costs well under a millisecond.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(
                f"No search index at {self.path}: build it first with build_index(path, entries)."
            )

    def search(self, query: str, limit: int = 3) -> list[str]:
        """The texts of the `limit` entries that match `query` best (BM25), best first."""
        match = fts_query(query)
        if match is None:
            return []
        with sqlite3.connect(f"file:{self.path}?mode=ro", uri=True) as connection:
            rows = connection.execute(
                "SELECT text FROM entries WHERE entries MATCH ? ORDER BY bm25(entries) LIMIT ?",
                (match, limit),
            ).fetchall()
        connection.close()
        return [text for (text,) in rows]
