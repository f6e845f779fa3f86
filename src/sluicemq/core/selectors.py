"""JMS message selectors (the SQL-92 subset of JMS 2.0 §3.8) evaluated over STOMP headers.

A subscription's ``selector`` header is compiled once into a tree of closures and then run
against every candidate message, so evaluation must be cheap and must never raise: a bad
header value from one producer may not break delivery to anyone else.

Semantics, and where they follow ActiveMQ Classic rather than the letter of JMS:

* Identifiers name headers (case-sensitive). A missing header is NULL. JMS header names map
  to STOMP headers: JMSMessageID, JMSCorrelationID, JMSType, JMSDestination, JMSReplyTo to
  message-id, correlation-id, type, destination, reply-to; JMSPriority to priority (integer,
  default 4); JMSTimestamp to timestamp (integer); JMSExpiration to expires (integer,
  default 0); JMSDeliveryMode to 'PERSISTENT'/'NON_PERSISTENT' from persistent;
  JMSRedelivered to redelivered (boolean). JMSX* names are plain headers.
* The prefix ``hyphenated_props:`` lets identifiers contain ``-``, as in Artemis
  (``hyphenated_props:content-type = 'x'``); without it ``a-b`` means ``a - b``.
  ``convert_string_expressions:`` (which ActiveMQ's STOMP layer always adds) is accepted and
  ignored because conversion is always on.
* Three-valued logic: comparisons involving NULL are UNKNOWN, AND/OR/NOT follow the SQL
  truth tables, and a message matches only when the whole selector is TRUE.
* STOMP header values are strings. Compared with a number, or used in arithmetic, a string
  that spells a number is that number (ActiveMQ's ``convert_string_expressions``); compared
  with TRUE/FALSE, ``'true'``/``'false'`` (any case) are booleans.
* Values of unlike types compare FALSE (JMS §3.8.1.2 and ActiveMQ), not UNKNOWN, so
  ``NOT (x = 5)`` matches when ``x`` is ``'abc'``. Arithmetic on a non-number, or division
  by zero, yields NULL.
* Strings and booleans may be ordered with ``<``, ``<=``, ``>``, ``>=`` (ActiveMQ allows it;
  JMS does not): strings compare by code point, FALSE < TRUE.
* Exact numerics are 64-bit; an integer result outside that range becomes approximate
  (float) instead of wrapping. Integer division truncates toward zero, as in Java.
* LIKE is matched without backtracking regular expressions, so no pattern can make a
  match take more than O(len(value) * len(pattern)).
"""

from __future__ import annotations

import functools
import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, NoReturn

from sluicemq.errors import SluiceError

__all__ = [
    "MAX_NESTING",
    "MAX_SELECTOR_LENGTH",
    "Selector",
    "SelectorError",
    "compile_selector",
]

MAX_SELECTOR_LENGTH = 4096
"""Longer selectors are refused: they cost memory per subscription and time per message."""

MAX_NESTING = 40
"""Deepest nesting of parentheses, NOT and unary signs; bounds the parser's recursion."""

_MAX_TREE_DEPTH = 100
"""Deepest closure tree; bounds the evaluator's recursion independently of the caller's stack."""

_CONVERT_PREFIX = "convert_string_expressions:"
_HYPHENATED_PREFIX = "hyphenated_props:"

Value = bool | int | float | str | None
Headers = Mapping[str, str]
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


def _exact(value: int) -> int | float:
    """Keep integers within Java's long range; beyond it they degrade to approximate numbers
    (infinite beyond a double's range, as a decimal literal of that size reads)."""
    if _INT64_MIN <= value <= _INT64_MAX:
        return value
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _parse_int(text: str) -> int | float:
    """Parse a decimal integer of any length without tripping Python's int-digit limit."""
    digits = text.lstrip("+-").lstrip("0") or "0"
    if len(digits) > 19:
        return float(text)
    return _exact(-int(digits) if text.startswith("-") else int(digits))


def _parse_number(text: str) -> int | float | None:
    """The number a header value spells, or None; rejects ``nan``, ``1_0``, spaces and such."""
    if _INT_RE.fullmatch(text):
        return _parse_int(text)
    if _FLOAT_RE.fullmatch(text):
        return float(text)
    return None


def _parse_bool(text: str) -> bool | None:
    lowered = text.lower()
    if lowered == "true":
        return True
    if lowered == "false":
        return False
    return None


def _as_number(value: Value) -> int | float | None:
    """Operand of arithmetic: numbers pass, numeric strings convert, anything else is NULL."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        return _parse_number(value)
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
    return _parse_bool(text) if isinstance(other, bool) else _parse_number(text)


def _compare(op: Callable[[Any, Any], bool], a: Value, b: Value) -> bool | None:
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


_ARITHMETIC: dict[str, Callable[[int | float, int | float], int | float | None]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": _divide,
}

_COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq,
    "<>": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


# --------------------------------------------------------------------------- tokens

_KEYWORDS = frozenset(
    {"AND", "OR", "NOT", "BETWEEN", "LIKE", "ESCAPE", "IN", "IS", "NULL", "TRUE", "FALSE"}
)

_TOKEN_RE = re.compile(
    r"""
      (?P<space>\s+)
    | (?P<string>'[^']*(?:''[^']*)*')  # unrolled so that it cannot backtrack
    | (?P<float>(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+)
    | (?P<hex>0[xX][0-9a-fA-F]+)
    | (?P<int>[0-9]+[lL]?)
    | (?P<op><>|<=|>=|[=<>+\-*/(),])
    """,
    re.VERBOSE,
)
_IDENT_RE = re.compile(r"(?:[^\W\d]|\$)[\w$]*")
_HYPHENATED_IDENT_RE = re.compile(r"(?:[^\W\d]|\$)(?:[\w$]|-(?=[\w$]))*")
_IDENT_PART_RE = re.compile(r"[\w$]")


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # "string", "number", "ident", "keyword", "op", "end"
    value: Value
    text: str
    column: int

    def describe(self) -> str:
        return "end of selector" if self.kind == "end" else repr(self.text)


def _tokenize(text: str, offset: int, hyphenated: bool) -> list[_Token]:
    """Split ``text`` into tokens; ``offset`` is the length of any stripped prefix."""
    ident_re = _HYPHENATED_IDENT_RE if hyphenated else _IDENT_RE
    tokens: list[_Token] = []
    pos = 0
    while pos < len(text):
        column = offset + pos + 1
        ident = ident_re.match(text, pos)
        if ident:
            word = ident.group()
            if word.upper() in _KEYWORDS:
                tokens.append(_Token("keyword", word.upper(), word, column))
            else:
                tokens.append(_Token("ident", word, word, column))
            pos = ident.end()
            continue
        match = _TOKEN_RE.match(text, pos)
        if match is None:
            if text[pos] == "'":
                raise SelectorError("unterminated string literal", column)
            if text[pos] == "!" and text.startswith("!=", pos):
                raise SelectorError("unknown operator '!=' (use '<>')", column)
            raise SelectorError(f"unexpected character {text[pos]!r}", column)
        kind, lexeme = match.lastgroup, match.group()
        pos = match.end()
        if kind == "space":
            continue
        if kind == "string":
            tokens.append(_Token("string", lexeme[1:-1].replace("''", "'"), lexeme, column))
        elif kind == "op":
            tokens.append(_Token("op", lexeme, lexeme, column))
        else:
            if pos < len(text) and _IDENT_PART_RE.match(text, pos):
                raise SelectorError(f"malformed number {lexeme + text[pos]!r}", column)
            tokens.append(_Token("number", _number_literal(kind, lexeme, column), lexeme, column))
    tokens.append(_Token("end", None, "", offset + len(text) + 1))
    return tokens


def _number_literal(kind: str | None, lexeme: str, column: int) -> int | float:
    """Value of a Java-style numeric literal: decimal, octal (leading 0), hex, or floating."""
    if kind == "float":
        return float(lexeme)
    if kind == "hex":
        return _exact(int(lexeme[2:], 16))
    digits = lexeme.rstrip("lL")
    if len(digits) > 1 and digits.startswith("0"):
        if not all(c in "01234567" for c in digits):
            raise SelectorError(f"invalid octal literal {lexeme!r}", column)
        return _exact(int(digits, 8))
    return _parse_int(digits)


# --------------------------------------------------------------------------- tree

class _Kind(Enum):
    """What an expression yields, as far as the parser can tell; ANY is a plain header."""

    BOOL = "boolean"
    NUM = "numeric"
    STR = "string"
    ANY = "header"


@dataclass(frozen=True, slots=True)
class _Node:
    evaluate: Evaluator
    kind: _Kind
    depth: int
    column: int


def _constant(value: Value) -> Evaluator:
    return lambda _headers: value


def _header(name: str) -> Evaluator:
    def evaluate(headers: Headers) -> Value:
        value = headers.get(name)
        if value is None or isinstance(value, str | int | float):
            return value
        return None

    return evaluate


def _typed_header(name: str, convert: Callable[[str | None], Value]) -> Evaluator:
    def evaluate(headers: Headers) -> Value:
        value = headers.get(name)
        return convert(value if isinstance(value, str) else None)

    return evaluate


def _int_or(default: int | None) -> Callable[[str | None], Value]:
    def convert(text: str | None) -> Value:
        number = None if text is None else _parse_number(text)
        return number if isinstance(number, int) else default

    return convert


def _delivery_mode(text: str | None) -> str:
    return "PERSISTENT" if text is not None and text.lower() == "true" else "NON_PERSISTENT"


def _redelivered(text: str | None) -> bool:
    return text is not None and text.lower() == "true"


def _same(text: str | None) -> str | None:
    return text


_JMS_HEADERS: dict[str, tuple[str, _Kind, Callable[[str | None], Value]]] = {
    "JMSMessageID": ("message-id", _Kind.STR, _same),
    "JMSCorrelationID": ("correlation-id", _Kind.STR, _same),
    "JMSType": ("type", _Kind.STR, _same),
    "JMSDestination": ("destination", _Kind.STR, _same),
    "JMSReplyTo": ("reply-to", _Kind.STR, _same),
    "JMSPriority": ("priority", _Kind.NUM, _int_or(4)),
    "JMSTimestamp": ("timestamp", _Kind.NUM, _int_or(None)),
    "JMSExpiration": ("expires", _Kind.NUM, _int_or(0)),
    "JMSDeliveryMode": ("persistent", _Kind.STR, _delivery_mode),
    "JMSRedelivered": ("redelivered", _Kind.BOOL, _redelivered),
}
"""JMS header identifier -> (STOMP header, kind, conversion of the raw value or None).

Other ``JMSX*`` names (JMSXGroupID, JMSXDeliveryCount, ...) are ordinary headers.
"""


def _and(evaluators: Sequence[Evaluator]) -> Evaluator:
    def evaluate(headers: Headers) -> Value:
        result: bool | None = True
        for term in evaluators:
            value = term(headers)
            if value is False:
                return False
            if value is None:
                result = None
        return result

    return evaluate


def _or(evaluators: Sequence[Evaluator]) -> Evaluator:
    def evaluate(headers: Headers) -> Value:
        result: bool | None = False
        for term in evaluators:
            value = term(headers)
            if value is True:
                return True
            if value is None:
                result = None
        return result

    return evaluate


def _not(inner: Evaluator) -> Evaluator:
    def evaluate(headers: Headers) -> Value:
        value = inner(headers)
        return None if value is None else not value

    return evaluate


def _truth(inner: Evaluator) -> Evaluator:
    """A header used as a condition: 'true'/'false' are booleans, other values are FALSE."""

    def evaluate(headers: Headers) -> Value:
        value = inner(headers)
        if value is None or isinstance(value, bool):
            return value
        return _parse_bool(value) is True if isinstance(value, str) else False

    return evaluate


def _arithmetic(first: Evaluator, rest: Sequence[tuple[str, Evaluator]]) -> Evaluator:
    steps = [(_ARITHMETIC[op], term) for op, term in rest]

    def evaluate(headers: Headers) -> Value:
        accumulator = _as_number(first(headers))
        for apply, term in steps:
            operand = _as_number(term(headers))
            if accumulator is None or operand is None:
                return None
            result = apply(accumulator, operand)
            accumulator = _exact(result) if isinstance(result, int) else result
        return accumulator

    return evaluate


def _negate(inner: Evaluator) -> Evaluator:
    def evaluate(headers: Headers) -> Value:
        number = _as_number(inner(headers))
        if isinstance(number, int):
            return _exact(-number)
        return None if number is None else -number

    return evaluate


def _comparison(op: str, left: Evaluator, right: Evaluator) -> Evaluator:
    compare = _COMPARISONS[op]
    return lambda headers: _compare(compare, left(headers), right(headers))


def _between(value: Evaluator, low: Evaluator, high: Evaluator, negated: bool) -> Evaluator:
    def evaluate(headers: Headers) -> Value:
        subject = value(headers)
        above = _compare(operator.ge, subject, low(headers))
        below = _compare(operator.le, subject, high(headers))
        if above is False or below is False:
            return negated
        if above is None or below is None:
            return None
        return not negated

    return evaluate


def _in(value: Evaluator, choices: Sequence[str], negated: bool) -> Evaluator:
    members = frozenset(choices)

    def evaluate(headers: Headers) -> Value:
        subject = value(headers)
        if subject is None:
            return None
        if isinstance(subject, str):
            found = subject in members
        else:
            found = any(_compare(operator.eq, subject, choice) for choice in choices)
        return found != negated

    return evaluate


def _like(value: Evaluator, matcher: Callable[[str], bool], negated: bool) -> Evaluator:
    def evaluate(headers: Headers) -> Value:
        subject = value(headers)
        if subject is None:
            return None
        if not isinstance(subject, str):
            return False
        return matcher(subject) != negated

    return evaluate


def _is_null(value: Evaluator, negated: bool) -> Evaluator:
    return lambda headers: (value(headers) is None) != negated


# --------------------------------------------------------------------------- LIKE

def _like_matcher(pattern: str, escape: str | None, column: int) -> Callable[[str], bool]:
    """Compile a LIKE pattern into a matcher of fixed-length segments split at each '%'.

    Each segment (literal characters and '_') has a fixed length, so the first must match at
    the start, the last at the end, and the middle ones greedily leftmost in between; the
    regular expressions used per segment contain no quantifiers and cannot backtrack.
    """
    segments: list[list[str]] = [[]]
    chars = iter(pattern)
    for char in chars:
        if char == escape:
            literal = next(chars, None)
            if literal is None:
                raise SelectorError("LIKE pattern ends with its escape character", column)
            segments[-1].append(re.escape(literal))
        elif char == "%":
            segments.append([])
        elif char == "_":
            segments[-1].append(".")
        else:
            segments[-1].append(re.escape(char))
    compiled = [(re.compile("".join(parts), re.DOTALL), len(parts)) for parts in segments]
    if len(compiled) == 1:
        only = compiled[0][0]
        return lambda text: only.fullmatch(text) is not None
    (head, head_len), (tail, tail_len) = compiled[0], compiled[-1]
    middle = [(regex, size) for regex, size in compiled[1:-1] if size]

    def matches(text: str) -> bool:
        end = len(text) - tail_len
        if end < head_len or not head.match(text) or not tail.match(text, end):
            return False
        pos = head_len
        for regex, _size in middle:
            found = regex.search(text, pos, end)
            if found is None:
                return False
            pos = found.end()
        return True

    return matches


# --------------------------------------------------------------------------- parser

class _Parser:
    """Recursive descent over the JMS grammar, building closures as it goes.

    Precedence, loosest first: OR, AND, NOT, comparison/BETWEEN/IN/LIKE/IS, + -, * /, sign.
    """

    def __init__(self, tokens: list[_Token]) -> None:
        self._tokens = tokens
        self._pos = 0
        self._nesting = 0

    # -- helpers

    def _peek(self) -> _Token:
        return self._tokens[self._pos]

    def _advance(self) -> _Token:
        token = self._tokens[self._pos]
        if token.kind != "end":
            self._pos += 1
        return token

    def _at(self, kind: str, *values: str) -> bool:
        token = self._tokens[self._pos]
        return token.kind == kind and (not values or token.value in values)

    def _expect(self, kind: str, value: str, what: str) -> _Token:
        if not self._at(kind, value):
            self._fail(f"expected {what}")
        return self._advance()

    def _fail(self, expectation: str) -> NoReturn:
        token = self._peek()
        raise SelectorError(f"{expectation}, found {token.describe()}", token.column)

    def _enter(self, token: _Token) -> None:
        self._nesting += 1
        if self._nesting > MAX_NESTING:
            raise SelectorError(f"selector nests deeper than {MAX_NESTING} levels", token.column)

    def _node(self, evaluate: Evaluator, kind: _Kind, column: int, *children: _Node) -> _Node:
        depth = 1 + max((child.depth for child in children), default=0)
        if depth > _MAX_TREE_DEPTH:
            raise SelectorError("selector is too deeply nested", column)
        return _Node(evaluate, kind, depth, column)

    @staticmethod
    def _condition(node: _Node, role: str) -> _Node:
        """Check that ``node`` can stand where a TRUE/FALSE/UNKNOWN is needed."""
        if node.kind is _Kind.BOOL:
            return node
        if node.kind is _Kind.ANY:
            return _Node(_truth(node.evaluate), _Kind.BOOL, node.depth + 1, node.column)
        raise SelectorError(f"{role} needs a condition, not a {node.kind.value} value", node.column)

    @staticmethod
    def _numeric(node: _Node, role: str) -> _Node:
        if node.kind in (_Kind.NUM, _Kind.ANY):
            return node
        raise SelectorError(f"{role} needs a number, not a {node.kind.value} value", node.column)

    # -- grammar

    def parse(self) -> _Node:
        node = self._condition(self._or_expr(), "a selector")
        if not self._at("end"):
            self._fail("expected an operator or the end of the selector")
        return node

    def _or_expr(self) -> _Node:
        return self._logical("OR", self._and_expr, _or)

    def _and_expr(self) -> _Node:
        return self._logical("AND", self._not_expr, _and)

    def _logical(
        self,
        keyword: str,
        operand: Callable[[], _Node],
        combine: Callable[[Sequence[Evaluator]], Evaluator],
    ) -> _Node:
        first = operand()
        if not self._at("keyword", keyword):
            return first
        terms = [self._condition(first, keyword)]
        while self._at("keyword", keyword):
            self._advance()
            terms.append(self._condition(operand(), keyword))
        return self._node(combine([t.evaluate for t in terms]), _Kind.BOOL, first.column, *terms)

    def _not_expr(self) -> _Node:
        if not self._at("keyword", "NOT"):
            return self._comparison()
        token = self._advance()
        self._enter(token)
        inner = self._condition(self._not_expr(), "NOT")
        self._nesting -= 1
        return self._node(_not(inner.evaluate), _Kind.BOOL, token.column, inner)

    def _comparison(self) -> _Node:
        left = self._additive()
        token = self._peek()
        if token.kind == "op" and token.value in _COMPARISONS:
            self._advance()
            right = self._additive()
            if self._peek().kind == "op" and self._peek().value in _COMPARISONS:
                self._fail("comparisons cannot be chained (combine them with AND)")
            evaluate = _comparison(str(token.value), left.evaluate, right.evaluate)
            return self._node(evaluate, _Kind.BOOL, token.column, left, right)
        if token.kind != "keyword":
            return left
        negated = token.value == "NOT"
        if negated:
            self._advance()
            if not self._at("keyword", "BETWEEN", "IN", "LIKE"):
                self._fail("expected BETWEEN, IN or LIKE after NOT")
        if self._at("keyword", "BETWEEN"):
            return self._between(left, negated)
        if self._at("keyword", "IN"):
            return self._in(left, negated)
        if self._at("keyword", "LIKE"):
            return self._like(left, negated)
        if self._at("keyword", "IS"):
            return self._is_null(left)
        return left

    def _between(self, left: _Node, negated: bool) -> _Node:
        token = self._advance()
        low = self._additive()
        self._expect("keyword", "AND", "AND between the BETWEEN bounds")
        high = self._additive()
        evaluate = _between(left.evaluate, low.evaluate, high.evaluate, negated)
        return self._node(evaluate, _Kind.BOOL, token.column, left, low, high)

    def _in(self, left: _Node, negated: bool) -> _Node:
        token = self._advance()
        self._string_subject(left, "IN")
        self._expect("op", "(", "'(' after IN")
        choices = [self._string_literal("IN list items must be string literals")]
        while self._at("op", ","):
            self._advance()
            choices.append(self._string_literal("IN list items must be string literals"))
        self._expect("op", ")", "',' or ')' in the IN list")
        return self._node(_in(left.evaluate, choices, negated), _Kind.BOOL, token.column, left)

    def _like(self, left: _Node, negated: bool) -> _Node:
        token = self._advance()
        self._string_subject(left, "LIKE")
        pattern_column = self._peek().column
        pattern = self._string_literal("LIKE needs a string literal pattern")
        escape = None
        if self._at("keyword", "ESCAPE"):
            self._advance()
            escape_token = self._peek()
            escape = self._string_literal("ESCAPE needs a string literal")
            if len(escape) != 1:
                raise SelectorError("ESCAPE must be a single character", escape_token.column)
        matcher = _like_matcher(pattern, escape, pattern_column)
        return self._node(_like(left.evaluate, matcher, negated), _Kind.BOOL, token.column, left)

    def _is_null(self, left: _Node) -> _Node:
        token = self._advance()
        negated = self._at("keyword", "NOT")
        if negated:
            self._advance()
        wanted = "NULL after IS NOT" if negated else "NULL or NOT NULL after IS"
        self._expect("keyword", "NULL", wanted)
        return self._node(_is_null(left.evaluate, negated), _Kind.BOOL, token.column, left)

    def _string_subject(self, node: _Node, operation: str) -> None:
        if node.kind not in (_Kind.STR, _Kind.ANY):
            raise SelectorError(
                f"{operation} needs a string, not a {node.kind.value} value", node.column
            )

    def _string_literal(self, message: str) -> str:
        if not self._at("string"):
            self._fail(message)
        return str(self._advance().value)

    def _additive(self) -> _Node:
        return self._arithmetic(("+", "-"), self._multiplicative)

    def _multiplicative(self) -> _Node:
        return self._arithmetic(("*", "/"), self._unary)

    def _arithmetic(self, ops: tuple[str, ...], operand: Callable[[], _Node]) -> _Node:
        first = operand()
        if not self._at("op", *ops):
            return first
        terms = [self._numeric(first, "arithmetic")]
        rest: list[tuple[str, Evaluator]] = []
        while self._at("op", *ops):
            op = str(self._advance().value)
            term = self._numeric(operand(), f"'{op}'")
            terms.append(term)
            rest.append((op, term.evaluate))
        evaluate = _arithmetic(first.evaluate, rest)
        return self._node(evaluate, _Kind.NUM, first.column, *terms)

    def _unary(self) -> _Node:
        if not self._at("op", "+", "-"):
            return self._primary()
        token = self._advance()
        self._enter(token)
        inner = self._numeric(self._unary(), f"unary '{token.value}'")
        self._nesting -= 1
        if token.value == "+":
            evaluate = _arithmetic(inner.evaluate, ())
        else:
            evaluate = _negate(inner.evaluate)
        return self._node(evaluate, _Kind.NUM, token.column, inner)

    def _primary(self) -> _Node:
        token = self._peek()
        if token.kind == "op" and token.value == "(":
            self._advance()
            self._enter(token)
            inner = self._or_expr()
            self._nesting -= 1
            self._expect("op", ")", "')'")
            return inner
        if token.kind == "number":
            self._advance()
            return _Node(_constant(token.value), _Kind.NUM, 1, token.column)
        if token.kind == "string":
            self._advance()
            return _Node(_constant(token.value), _Kind.STR, 1, token.column)
        if token.kind == "keyword" and token.value in ("TRUE", "FALSE"):
            self._advance()
            return _Node(_constant(token.value == "TRUE"), _Kind.BOOL, 1, token.column)
        if token.kind == "ident":
            self._advance()
            name = str(token.value)
            if name in _JMS_HEADERS:
                header, kind, convert = _JMS_HEADERS[name]
                return _Node(_typed_header(header, convert), kind, 1, token.column)
            return _Node(_header(name), _Kind.ANY, 1, token.column)
        if token.kind == "keyword" and token.value == "NULL":
            raise SelectorError("NULL can only be tested with IS [NOT] NULL", token.column)
        self._fail("expected a value")


# --------------------------------------------------------------------------- public API

class Selector:
    """A compiled selector; ``matches`` is safe to call on any headers from any producer."""

    __slots__ = ("_evaluate", "text")

    def __init__(self, text: str, evaluate: Evaluator) -> None:
        self.text = text
        self._evaluate = evaluate

    def matches(self, headers: Mapping[str, str]) -> bool:
        """True only if the selector evaluates to TRUE (FALSE and UNKNOWN both reject)."""
        return self._evaluate(headers) is True

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"


@functools.lru_cache(maxsize=1024)
def compile_selector(text: str) -> Selector:
    """Parse ``text`` into a Selector, raising SelectorError with a column on bad syntax.

    Cached because many subscriptions commonly share one selector string.
    """
    if len(text) > MAX_SELECTOR_LENGTH:
        raise SelectorError(f"selector is longer than {MAX_SELECTOR_LENGTH} characters")
    body, hyphenated = text, False
    while True:
        if body.startswith(_CONVERT_PREFIX):
            body = body[len(_CONVERT_PREFIX):]
        elif body.startswith(_HYPHENATED_PREFIX):
            body, hyphenated = body[len(_HYPHENATED_PREFIX):], True
        else:
            break
    if not body.strip():
        raise SelectorError("selector is empty")
    tokens = _tokenize(body, len(text) - len(body), hyphenated)
    return Selector(text, _Parser(tokens).parse().evaluate)
