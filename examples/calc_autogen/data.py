"""Arithmetic word problems generated from templates, reproducible from a seed.

Each task is a plain dict: the `question`, the numeric `answer` and the `expression` that computes it (a
reference for readers; the agent never sees it). One or two operations per problem, small whole numbers,
whole-number answers. `train_test_split` keeps the held-out problems' arithmetic out of training.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

__all__ = ["NAMES", "OBJECTS", "TEMPLATES", "make_problem", "make_problems", "train_test_split"]

NAMES = (
    "Anna",
    "Ben",
    "Carla",
    "David",
    "Emma",
    "Farid",
    "Grace",
    "Hugo",
    "Ines",
    "Jack",
    "Kenji",
    "Lena",
    "Mia",
    "Noah",
    "Olga",
    "Pablo",
    "Rosa",
    "Sam",
    "Tara",
    "Victor",
)
OBJECTS = (
    "apples",
    "pencils",
    "stickers",
    "marbles",
    "cookies",
    "books",
    "stamps",
    "shells",
    "cards",
    "eggs",
    "balloons",
    "coins",
)

Numbers = dict[str, int]
# A template: (question with {name} {obj} and number fields, expression over the same fields, number sampler).
Template = tuple[str, str, Callable[[random.Random], Numbers]]


def _two(rng: random.Random, low: int = 2, high: int = 60) -> Numbers:
    return {"a": rng.randint(low, high), "b": rng.randint(low, high)}


def _difference(rng: random.Random) -> Numbers:
    b = rng.randint(2, 40)
    return {"a": b + rng.randint(2, 50), "b": b}


def _product(rng: random.Random) -> Numbers:
    return {"a": rng.randint(2, 12), "b": rng.randint(2, 12)}


def _quotient(rng: random.Random) -> Numbers:
    b, share = rng.randint(2, 9), rng.randint(2, 12)
    return {"a": b * share, "b": b}


def _buy_then_give(rng: random.Random) -> Numbers:
    a, b = rng.randint(5, 40), rng.randint(2, 30)
    return {"a": a, "b": b, "c": rng.randint(1, a + b - 1)}


def _plus_boxes(rng: random.Random) -> Numbers:
    return {"a": rng.randint(2, 30), "b": rng.randint(2, 9), "c": rng.randint(2, 12)}


TEMPLATES: tuple[Template, ...] = (
    ("{name} has {a} {obj} and gets {b} more. How many {obj} does {name} have now?", "{a} + {b}", _two),
    ("{name} had {a} {obj} and gave {b} away. How many {obj} are left?", "{a} - {b}", _difference),
    ("{name} buys {a} bags with {b} {obj} in each bag. How many {obj} is that?", "{a} * {b}", _product),
    (
        "{name} shares {a} {obj} equally among {b} friends. How many {obj} does each friend get?",
        "{a} / {b}",
        _quotient,
    ),
    (
        "{name} has {a} {obj}, finds {b} more, then gives {c} away. How many {obj} are left?",
        "{a} + {b} - {c}",
        _buy_then_give,
    ),
    (
        "{name} has {a} {obj} and buys {b} boxes of {c} {obj}. How many {obj} does {name} have now?",
        "{a} + {b} * {c}",
        _plus_boxes,
    ),
)
"""The problem kinds: addition, subtraction, multiplication, division, and two two-step problems."""


def make_problem(rng: random.Random, kinds: tuple[int, ...] | None = None) -> dict[str, Any]:
    """One problem from a random template (among `kinds`, indices into `TEMPLATES`; default all)."""
    question, expression, sample = TEMPLATES[rng.choice(kinds or range(len(TEMPLATES)))]
    numbers = sample(rng)
    fields = {"name": rng.choice(NAMES), "obj": rng.choice(OBJECTS), **numbers}
    filled = expression.format(**numbers)
    answer = _evaluate_reference(filled)
    return {"question": question.format(**fields), "answer": answer, "expression": filled}


def _evaluate_reference(expression: str) -> int:
    # The reference expressions are our own templates: the safe calculator computes them too.
    from lightning_sdk.examples.calc_autogen.calculator import calculate

    value = calculate(expression)
    assert float(value).is_integer(), f"template produced a fractional answer: {expression}"
    return int(value)


def make_problems(
    count: int,
    seed: int,
    kinds: tuple[int, ...] | None = None,
    exclude_expressions: frozenset[str] = frozenset(),
) -> list[dict[str, Any]]:
    """`count` distinct problems (no repeated question), reproducible from `seed`; none computes one of
    `exclude_expressions`."""
    rng, problems, seen = random.Random(seed), [], set()
    attempts = 0
    while len(problems) < count:
        attempts += 1
        if attempts > 100 * count + 1000:
            raise ValueError(
                f"Could not generate {count} distinct problems of kinds {kinds} that avoid the held-out "
                "expressions; ask for fewer problems or allow more kinds."
            )
        problem = make_problem(rng, kinds)
        if problem["question"] not in seen and problem["expression"] not in exclude_expressions:
            seen.add(problem["question"])
            problems.append(problem)
    return problems


def train_test_split(
    train_size: int, test_size: int, seed: int = 0, kinds: tuple[int, ...] | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Training and held-out problems, disjoint by arithmetic: no training problem computes the expression
    of a held-out one (`3 + 4` about apples in training would make `3 + 4` about stamps no test of
    anything new), so the held-out reward measures problems the model never practised."""
    test = make_problems(test_size, seed=seed * 2 + 1, kinds=kinds)
    held_out = frozenset(problem["expression"] for problem in test)
    train = make_problems(train_size, seed=seed * 2 + 2, kinds=kinds, exclude_expressions=held_out)
    return train, test
