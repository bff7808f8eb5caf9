"""The example's data: a small company database built from a seed, and templated questions with gold SQL.

`build_database(folder, seed)` writes `company-<seed>.sqlite` (two tables, `employees` and `departments`,
a few dozen rows; salaries and ages are unique so "the highest"/"the oldest" has one answer).
`make_splits(db_path, seed)` instantiates every question template with every value it can take, drops
instances whose gold query returns nothing, and splits the instances, shuffled by `seed`, into disjoint
train and held-out test sets. A task is a plain dict:

    {"id": "count_dept:Sales", "template": "count_dept", "kind": "aggregate",
     "question": "How many employees work in ...?",
     "gold_sql": "SELECT COUNT(*) FROM employees WHERE department = 'Sales'", "ordered": False,
     "db_path": "/home/.../company-0.sqlite"}
"""

from __future__ import annotations

import os
import random
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "CITIES",
    "DEPARTMENTS",
    "KINDS",
    "TEMPLATES",
    "Template",
    "all_questions",
    "build_database",
    "default_data_dir",
    "make_splits",
]

DEPARTMENTS = ("Sales", "Engineering", "Marketing", "Finance", "Support")
CITIES = ("London", "Paris", "Berlin", "Madrid", "Rome")
FIRST_NAMES = (
    "Alice",
    "Bruno",
    "Chloe",
    "Daniel",
    "Elena",
    "Farid",
    "Grace",
    "Hugo",
    "Irene",
    "Jonas",
    "Karin",
    "Liam",
    "Maria",
    "Nikos",
    "Olga",
    "Pedro",
    "Quinn",
    "Rosa",
    "Samir",
    "Tessa",
    "Umar",
    "Vera",
    "Walter",
    "Xenia",
    "Yusuf",
    "Zoe",
    "Anton",
    "Bianca",
    "Carlos",
    "Dora",
    "Emil",
    "Fatima",
    "Georg",
    "Hanna",
    "Ivan",
    "Julia",
)

SCHEMA = """
CREATE TABLE departments (
    name TEXT PRIMARY KEY,
    floor INTEGER NOT NULL,
    budget INTEGER NOT NULL
);
CREATE TABLE employees (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    department TEXT NOT NULL REFERENCES departments(name),
    city TEXT NOT NULL,
    age INTEGER NOT NULL,
    salary INTEGER NOT NULL
);
"""


def default_data_dir() -> Path:
    """Where the example keeps its generated database unless told otherwise: `examples/sql_langchain`
    under the SDK's cache folder (`$LIGHTNING_SDK_CACHE`, else `lightning-sdk` in the user's cache dir)."""
    configured = os.environ.get("LIGHTNING_SDK_CACHE")
    user_cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lightning-sdk"
    root = Path(configured).expanduser() if configured else user_cache
    return root / "examples" / "sql_langchain"


def _employee_rows(rng: random.Random) -> list[tuple[Any, ...]]:
    count = len(FIRST_NAMES)
    # Every department and city gets several employees; ages and salaries are unique, so questions
    # like "who is the oldest" or "the highest salary" have exactly one right answer.
    departments = [DEPARTMENTS[i % len(DEPARTMENTS)] for i in range(count)]
    cities = [CITIES[i % len(CITIES)] for i in range(count)]
    rng.shuffle(departments)
    rng.shuffle(cities)
    ages = rng.sample(range(22, 65), count)
    salaries = rng.sample(range(30_000, 120_001, 500), count)
    return [
        (i + 1, name, departments[i], cities[i], ages[i], salaries[i]) for i, name in enumerate(FIRST_NAMES)
    ]


def build_database(folder: str | Path | None = None, seed: int = 0) -> Path:
    """Write the company database for `seed` into `folder` (default: `default_data_dir()`); return its path.

    The same seed always gives the same rows. An existing file is rebuilt, so a half-written one from an
    interrupted run never survives.
    """
    folder = Path(folder) if folder is not None else default_data_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"company-{seed}.sqlite"
    partial = path.with_suffix(".sqlite.partial")
    partial.unlink(missing_ok=True)
    rng = random.Random(seed)
    floors = rng.sample(range(1, 10), len(DEPARTMENTS))
    budgets = rng.sample(range(100_000, 1_000_001, 25_000), len(DEPARTMENTS))
    with sqlite3.connect(partial) as connection:
        connection.executescript(SCHEMA)
        connection.executemany(
            "INSERT INTO departments VALUES (?, ?, ?)", zip(DEPARTMENTS, floors, budgets, strict=True)
        )
        connection.executemany("INSERT INTO employees VALUES (?, ?, ?, ?, ?, ?)", _employee_rows(rng))
    connection.close()
    partial.replace(path)  # atomic: concurrent readers see the old file or the new one, never half of one
    return path


@dataclass(frozen=True)
class Template:
    """A question template and its gold SQL; `slots` names the values it is filled with."""

    name: str
    question: str
    gold_sql: str
    slots: tuple[str, ...]
    ordered: bool = False
    """True when the question asks for an order, so results are compared row by row in order."""


TEMPLATES: tuple[Template, ...] = (
    Template(
        "count_dept",
        "How many employees work in the {dept} department?",
        "SELECT COUNT(*) FROM employees WHERE department = '{dept}'",
        ("dept",),
    ),
    Template(
        "count_city",
        "How many employees live in {city}?",
        "SELECT COUNT(*) FROM employees WHERE city = '{city}'",
        ("city",),
    ),
    Template(
        "count_older",
        "How many employees are older than {age}?",
        "SELECT COUNT(*) FROM employees WHERE age > {age}",
        ("age",),
    ),
    Template(
        "max_salary_dept",
        "What is the highest salary in the {dept} department?",
        "SELECT MAX(salary) FROM employees WHERE department = '{dept}'",
        ("dept",),
    ),
    Template(
        "min_salary_dept",
        "What is the lowest salary in the {dept} department?",
        "SELECT MIN(salary) FROM employees WHERE department = '{dept}'",
        ("dept",),
    ),
    Template(
        "avg_salary_dept",
        "What is the average salary in the {dept} department?",
        "SELECT AVG(salary) FROM employees WHERE department = '{dept}'",
        ("dept",),
    ),
    Template(
        "max_age_city",
        "How old is the oldest employee in {city}?",
        "SELECT MAX(age) FROM employees WHERE city = '{city}'",
        ("city",),
    ),
    Template(
        "top_paid_dept",
        "Which employee in the {dept} department has the highest salary?",
        "SELECT name FROM employees WHERE department = '{dept}' ORDER BY salary DESC LIMIT 1",
        ("dept",),
    ),
    Template(
        "youngest_city",
        "Who is the youngest employee in {city}?",
        "SELECT name FROM employees WHERE city = '{city}' ORDER BY age ASC LIMIT 1",
        ("city",),
    ),
    Template(
        "salary_of",
        "What is the salary of {name}?",
        "SELECT salary FROM employees WHERE name = '{name}'",
        ("name",),
    ),
    Template("age_of", "How old is {name}?", "SELECT age FROM employees WHERE name = '{name}'", ("name",)),
    Template(
        "dept_of",
        "Which department does {name} work in?",
        "SELECT department FROM employees WHERE name = '{name}'",
        ("name",),
    ),
    Template(
        "city_of",
        "In which city does {name} live?",
        "SELECT city FROM employees WHERE name = '{name}'",
        ("name",),
    ),
    Template(
        "names_dept_city",
        "List the names of the employees in the {dept} department who live in {city}.",
        "SELECT name FROM employees WHERE department = '{dept}' AND city = '{city}'",
        ("dept", "city"),
    ),
    Template(
        "names_by_salary",
        "List the names of the employees in the {dept} department from the highest salary to the lowest.",
        "SELECT name FROM employees WHERE department = '{dept}' ORDER BY salary DESC",
        ("dept",),
        True,
    ),
    Template(
        "budget_of",
        "What is the budget of the {dept} department?",
        "SELECT budget FROM departments WHERE name = '{dept}'",
        ("dept",),
    ),
    Template(
        "floor_of",
        "On which floor does {name} work?",
        "SELECT departments.floor FROM employees JOIN departments ON employees.department = "
        "departments.name WHERE employees.name = '{name}'",
        ("name",),
    ),
)

KINDS: dict[str, tuple[str, ...]] = {
    "lookup": ("salary_of", "age_of", "dept_of", "city_of", "budget_of"),
    "aggregate": (
        "count_dept",
        "count_city",
        "count_older",
        "max_salary_dept",
        "min_salary_dept",
        "avg_salary_dept",
        "max_age_city",
    ),
    "ordering": ("top_paid_dept", "youngest_city", "names_by_salary"),
    "list": ("names_dept_city",),
    "join": ("floor_of",),
}
"""The skill each template asks for, the way results are reported: one column of one row found by a
filter (`lookup`), COUNT/MIN/MAX/AVG (`aggregate`), ORDER BY (`ordering`), several rows under two
filters (`list`), and the one question that needs both tables (`join`)."""
_KIND_OF = {template: kind for kind, templates in KINDS.items() for template in templates}

_SLOT_VALUES: dict[str, tuple[Any, ...]] = {
    "dept": DEPARTMENTS,
    "city": CITIES,
    "name": FIRST_NAMES,
    "age": tuple(range(25, 61, 5)),
}


def _fillings(slots: tuple[str, ...]) -> Iterator[dict[str, Any]]:
    if not slots:
        yield {}
        return
    first, rest = slots[0], slots[1:]
    for value in _SLOT_VALUES[first]:
        for filling in _fillings(rest):
            yield {first: value, **filling}


def all_questions(db_path: str | Path) -> list[dict[str, Any]]:
    """Every question instance, in template order, whose gold query returns at least one row."""
    tasks = []
    with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as connection:
        for template in TEMPLATES:
            for filling in _fillings(template.slots):
                gold_sql = template.gold_sql.format(**filling)
                rows = connection.execute(gold_sql).fetchall()
                if not rows or rows == [(None,)]:  # e.g. no employee of that department in that city
                    continue
                tasks.append(
                    {
                        "id": f"{template.name}:" + ",".join(str(filling[slot]) for slot in template.slots),
                        "template": template.name,
                        "kind": _KIND_OF[template.name],
                        "question": template.question.format(**filling),
                        "gold_sql": gold_sql,
                        "ordered": template.ordered,
                        "db_path": str(db_path),
                    }
                )
    connection.close()
    return tasks


def make_splits(
    db_path: str | Path, seed: int = 0, test_size: int = 48
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Shuffle every question instance with `seed` and split it into (train, test), disjoint by instance;
    the test set has about `test_size` questions.

    The split is stratified by template (each template sends about the same share of its instances to
    test), so the held-out set asks the same kinds of questions about different values.
    """
    questions = all_questions(db_path)
    if not 0 < test_size < len(questions):
        raise ValueError(f"test_size must be between 1 and {len(questions) - 1}, got {test_size}.")
    rng = random.Random(seed)
    by_template: dict[str, list[dict[str, Any]]] = {}
    for task in questions:
        by_template.setdefault(task["template"], []).append(task)
    train, test = [], []
    share = test_size / len(questions)
    for tasks in by_template.values():
        rng.shuffle(tasks)
        cut = round(len(tasks) * share)
        test.extend(tasks[:cut])
        train.extend(tasks[cut:])
    rng.shuffle(train)
    rng.shuffle(test)
    return train, test
