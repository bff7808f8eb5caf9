"""Running model-written SQL safely, describing the schema for the prompt, and comparing results.

Model output is untrusted: `run_query` opens the database read-only (`mode=ro`), lets only reading
statements through (an authorizer denies ATTACH, PRAGMA writes and anything else), stops a query after
a time limit (a progress handler), caps the size of any value it builds (`randomblob(10**9)` would
otherwise allocate a gigabyte in one step, which no time limit interrupts) and caps the rows it returns.
Whatever goes wrong comes back as an error message for the model to read, never as an exception.
"""

from __future__ import annotations

import math
import re
import sqlite3
import time
from dataclasses import dataclass, field
from itertools import permutations
from pathlib import Path
from typing import Any

__all__ = [
    "QueryResult",
    "describe_schema",
    "extract_sql",
    "results_match",
    "run_query",
]

MAX_ROWS = 50
TIME_LIMIT_S = 2.0
MAX_VALUE_BYTES = 1_000_000
"""The largest string or blob a query may build; larger ones fail with "string or blob too big"."""

# What a SELECT needs: reading tables and columns, calling functions, recursive CTEs. Everything else
# (ATTACH, PRAGMA, writes, temp tables, ...) is denied before the statement runs.
_ALLOWED_ACTIONS = frozenset(
    {
        sqlite3.SQLITE_SELECT,
        sqlite3.SQLITE_READ,
        sqlite3.SQLITE_FUNCTION,
        getattr(sqlite3, "SQLITE_RECURSIVE", 33),
    }
)


@dataclass
class QueryResult:
    """The outcome of one query: its rows (at most `MAX_ROWS`), or the error message to show the model."""

    rows: list[tuple[Any, ...]] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)
    error: str | None = None
    truncated: bool = False
    """True when the query returned more than `MAX_ROWS` rows and the rest were dropped."""
    tables: frozenset[str] = frozenset()
    """The tables the query read (empty for a query of constants such as `SELECT 3`)."""

    @property
    def ok(self) -> bool:
        return self.error is None


def _authorizer(tables_read: set[str]) -> Any:
    """An SQLite authorizer that allows only reading actions and notes the tables read into `tables_read`."""

    def authorize(action: int, table: str | None, *rest: Any) -> int:
        if action == sqlite3.SQLITE_READ and table:
            tables_read.add(table)
        return sqlite3.SQLITE_OK if action in _ALLOWED_ACTIONS else sqlite3.SQLITE_DENY

    return authorize


def run_query(
    db_path: str | Path, sql: str, *, max_rows: int = MAX_ROWS, time_limit_s: float = TIME_LIMIT_S
) -> QueryResult:
    """Run one read-only statement against `db_path`; never raises for a bad query.

    Returns the rows (at most `max_rows`) and column names, or an `error` such as
    `"no such column: salry"`, `"not authorized"` or `"query took longer than 2 s"`.
    """
    if not sql or not sql.strip():
        return QueryResult(error="empty query: write one SQL SELECT statement")
    try:
        connection = sqlite3.connect(f"file:{Path(db_path)}?mode=ro", uri=True, check_same_thread=False)
    except sqlite3.Error as error:
        return QueryResult(error=f"cannot open the database: {error}")
    deadline = time.monotonic() + time_limit_s
    # Called every 1000 SQLite VM instructions; a non-zero return interrupts the query.
    connection.set_progress_handler(lambda: int(time.monotonic() > deadline), 1000)
    connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
    tables_read: set[str] = set()
    connection.set_authorizer(_authorizer(tables_read))
    try:
        cursor = connection.execute(sql)
        rows = cursor.fetchmany(max_rows + 1)
        columns = [column[0] for column in cursor.description or ()]
    except sqlite3.OperationalError as error:
        if str(error) == "interrupted":
            return QueryResult(error=f"query took longer than {time_limit_s:g} s")
        return QueryResult(error=str(error))
    except (sqlite3.Error, ValueError, OverflowError, MemoryError) as error:
        # sqlite3.Warning ("You can only execute one statement at a time") and friends, bad text encodings.
        return QueryResult(error=str(error) or type(error).__name__)
    finally:
        connection.close()
    return QueryResult(
        rows=rows[:max_rows], columns=columns, truncated=len(rows) > max_rows, tables=frozenset(tables_read)
    )


_SQL_BLOCK = re.compile(r"```(?:sql|sqlite)?\s*\n?(.*?)(?:```|$)", re.DOTALL | re.IGNORECASE)
_SELECT_START = re.compile(r"\b(SELECT|WITH)\b", re.IGNORECASE)


def extract_sql(reply: str | None) -> str:
    """The SQL statement in a model reply: the first ```sql block if there is one, else the reply from its
    first SELECT/WITH on; cut at the first `;` so trailing chatter is not executed."""
    text = reply or ""
    block = _SQL_BLOCK.search(text)
    if block and block.group(1).strip():
        text = block.group(1)
    start = _SELECT_START.search(text)
    if start:
        text = text[start.start() :]
    return text.split(";", 1)[0].strip()


def describe_schema(db_path: str | Path, example_rows: int = 2) -> str:
    """The CREATE TABLE statements of the database, each followed by a few example rows in a comment."""
    parts = []
    with sqlite3.connect(f"file:{Path(db_path)}?mode=ro", uri=True) as connection:
        tables = connection.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'table' ORDER BY name"
        ).fetchall()
        for name, create in tables:
            cursor = connection.execute(f'SELECT * FROM "{name}" LIMIT {int(example_rows)}')
            header = " | ".join(column[0] for column in cursor.description)
            rows = "\n".join(" | ".join(str(value) for value in row) for row in cursor.fetchall())
            parts.append(f"{create};\n/* {example_rows} example rows of {name}:\n{header}\n{rows}\n*/")
    connection.close()
    return "\n\n".join(parts)


def _values_equal(a: Any, b: Any) -> bool:
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool | str):
        # Averages may come back rounded by the model's query (ROUND(AVG(x), 2)): 0.01 absolute slack.
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=0.01)
    if isinstance(a, str) and isinstance(b, str):
        return a.strip().casefold() == b.strip().casefold()
    return a == b


def _rows_equal(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return len(a) == len(b) and all(_values_equal(x, y) for x, y in zip(a, b, strict=True))


def _same_rows(predicted: list[tuple[Any, ...]], gold: list[tuple[Any, ...]], ordered: bool) -> bool:
    if len(predicted) != len(gold):
        return False
    if ordered:
        return all(_rows_equal(p, g) for p, g in zip(predicted, gold, strict=True))
    unmatched = list(predicted)  # multiset match; tolerance rules out sorting, and results are small
    for row in gold:
        index = next((i for i, candidate in enumerate(unmatched) if _rows_equal(candidate, row)), None)
        if index is None:
            return False
        unmatched.pop(index)
    return True


def results_match(
    predicted: list[tuple[Any, ...]], gold: list[tuple[Any, ...]], ordered: bool = False
) -> bool:
    """Whether a query's rows are the gold query's rows (execution match, as in Spider's evaluation).

    The same rows, as a multiset (in order only when `ordered`); numbers equal within 0.01 absolute or
    1e-6 relative, text equal ignoring case and surrounding spaces. The predicted query must return as
    many columns as the gold one, in any order: extra columns are not allowed, since `SELECT *` would
    otherwise answer every "what is the X of Y?" question without choosing X.
    """
    if not gold or not predicted:
        return not gold and not predicted
    width = len(gold[0])
    if len(predicted[0]) != width:
        return False
    for columns in permutations(range(width)):
        projected = [tuple(row[i] for i in columns) for row in predicted]
        if _same_rows(projected, gold, ordered):
            return True
    return False
