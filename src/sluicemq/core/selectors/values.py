"""What selector expressions compute with: value types, numbers read from header strings,
comparison of unlike types and arithmetic with Java's integer rules (the package docstring
says which ActiveMQ choices these follow)."""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping
from typing import Any

from sluicemq.errors import SluiceError

MAX_SELECTOR_LENGTH = 4096
"""Longer selectors are refused: they cost memory per subscription and time per message."""

MAX_NESTING = 40
"""Deepest nesting of parentheses, NOT and unary signs; bounds the parser's recursion."""

MAX_TREE_DEPTH = 100
"""Deepest closure tree; bounds the evaluator's recursion independently of the caller's stack."""

CONVERT_PREFIX = "convert_string_expressions:"
HYPHENATED_PREFIX = "hyphenated_props:"

Value = bool | int | float | str | None
# Header values as the broker hands them: strings from STOMP frames, typed values from JSON
# headers (a column batch's); the evaluator reads any other type as an absent header.
Headers = Mapping[str, object]
Evaluator = Callable[[Headers], Value]


class SelectorError(SluiceError, ValueError):
    """The selector text is not a valid JMS selector; ``column`` is 1-based, or None."""

    def __init__(self, message: str, column: int | None = None) -> None:
        super().__init__(message if column is None else f"{message} at column {column}")
        self.column = column


# --------------------------------------------------------------------------- values

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_INT_RE = re.compile(r"[+-]?[0-9]+")
_FLOAT_RE = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
"""Unambiguous on purpose: header values are hostile, so the pattern must never backtrack."""


def exact(value: int) -> int | float:
    """Keep integers within Java's long range; beyond it they degrade to approximate numbers
    (infinite beyond a double's range, as a decimal literal of that size reads)."""
    if _INT64_MIN <= value <= _INT64_MAX:
        return value
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def parse_int(text: str) -> int | float:
    """Parse a decimal integer of any length without tripping Python's int-digit limit."""
    digits = text.lstrip("+-").lstrip("0") or "0"
    if len(digits) > 19:
        return float(text)
    return exact(-int(digits) if text.startswith("-") else int(digits))


def parse_number(text: str) -> int | float | None:
    """The number a header value spells, or None; rejects ``nan``, ``1_0``, spaces and such."""
    if _INT_RE.fullmatch(text):
        return parse_int(text)
    if _FLOAT_RE.fullmatch(text):
        return float(text)
    return None


def parse_bool(text: str) -> bool | None:
    lowered = text.lower()
    if lowered == "true":
        return True
    if lowered == "false":
        return False
    return None


def as_number(value: Value) -> int | float | None:
    """Operand of arithmetic: numbers pass, numeric strings convert, anything else is NULL."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        return parse_number(value)
    return value


def _like_typed(a: Value, b: Value) -> tuple[Value, Value] | None:
    """Bring two non-NULL values to one type for comparison, or None if they are unlike."""
    if isinstance(a, str) == isinstance(b, str) and isinstance(a, bool) == isinstance(b, bool):
        return a, b
    if isinstance(a, str):
        converted = _convert_like(a, b)
        return None if converted is None else (converted, b)
    if isinstance(b, str):
        converted = _convert_like(b, a)
        return None if converted is None else (a, converted)
    return None  # a boolean against a number


def _convert_like(text: str, other: Value) -> Value:
    """The value a header string denotes when compared with ``other`` (a boolean or number)."""
    return parse_bool(text) if isinstance(other, bool) else parse_number(text)


def compare_values(op: Callable[[Any, Any], bool], a: Value, b: Value) -> bool | None:
    if a is None or b is None:
        return None
    pair = _like_typed(a, b)
    if pair is None:
        return False
    return op(*pair)


def _divide(a: int | float, b: int | float) -> int | float | None:
    if b == 0:
        return None
    if isinstance(a, int) and isinstance(b, int):
        quotient = abs(a) // abs(b)
        return quotient if (a < 0) == (b < 0) else -quotient
    return a / b


ARITHMETIC: dict[str, Callable[[int | float, int | float], int | float | None]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": _divide,
}

COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq,
    "<>": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
