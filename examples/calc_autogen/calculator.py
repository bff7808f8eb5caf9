"""A safe calculator for model-written arithmetic: walks the expression's syntax tree, never `eval`s it.

Only numbers, `+ - * / // % **`, unary minus/plus and parentheses are accepted. Anything else (names,
calls, attributes, strings, comparisons...) is refused with a message meant for the model to read, since
AutoGen hands the tool's return value (or its error text) back as the tool result. Limits on the input
length, the exponent and the size of intermediate results keep a sampled `9**9**9` from hanging a CPU.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable

__all__ = [
    "MAX_ABS_VALUE",
    "MAX_EXPONENT",
    "MAX_EXPRESSION_CHARS",
    "CalculatorError",
    "calculate",
    "calculator",
]

MAX_EXPRESSION_CHARS = 200
"""Longer expressions are refused before parsing (a word problem never needs more)."""
MAX_EXPONENT = 64
"""Largest absolute exponent of `**`: bounds the cost of big-integer powers."""
MAX_ABS_VALUE = 1e15
"""Largest absolute value of any intermediate result."""

_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[float], float]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}


class CalculatorError(ValueError):
    """The expression is not plain arithmetic or cannot be computed; the message says why."""


def calculate(expression: str) -> int | float:
    """The value of an arithmetic expression such as `"(12 + 7) * 3"`.

    Raises:
        CalculatorError: for anything but numbers, `+ - * / // % **`, unary signs and parentheses;
            for division by zero, exponents above `MAX_EXPONENT` and results above `MAX_ABS_VALUE`.
    """
    if not isinstance(expression, str) or not expression.strip():
        raise CalculatorError("Give an arithmetic expression as a string, e.g. '12 * 3'.")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"The expression is longer than {MAX_EXPRESSION_CHARS} characters.")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise CalculatorError(f"Not a valid arithmetic expression: {expression!r}.") from None
    return _checked(_value(tree.body))


def _value(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _checked(_UNARY[type(node.op)](_value(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"Exponents above {MAX_EXPONENT} are not allowed.")
        try:
            return _checked(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise CalculatorError("Division by zero.") from None
        except (OverflowError, TypeError):  # e.g. 0 ** -1 overflow, complex results
            raise CalculatorError("The result is too large or not a real number.") from None
    raise CalculatorError(
        f"Only numbers, + - * / // % ** and parentheses are allowed; found {_describe(node)}."
    )


def _checked(value: float) -> int | float:
    if isinstance(value, complex) or (isinstance(value, float) and not math.isfinite(value)):
        raise CalculatorError("The result is too large or not a real number.")
    if abs(value) > MAX_ABS_VALUE:
        raise CalculatorError(f"Results above {MAX_ABS_VALUE:.0e} are not allowed.")
    return value


def _describe(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return f"the name {node.id!r}"
    if isinstance(node, ast.Constant):
        return f"the constant {node.value!r}"
    return f"a {type(node).__name__} element"


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with numbers, + - * / and parentheses, e.g. "(12 + 7) * 3".

    This is the tool the agent calls: it returns the result, or the error message for the model to read.
    """
    try:
        value = calculate(expression)
    except CalculatorError as error:
        return f"Error: {error}"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(round(value, 6) if isinstance(value, float) else value)
