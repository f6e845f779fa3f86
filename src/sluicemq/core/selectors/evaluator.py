"""The compiled form of a selector: a tree of closures over the headers, built by the
parser, with SQL's three-valued logic; and LIKE patterns matched without backtracking."""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

from sluicemq.core.selectors.values import (
    ARITHMETIC,
    COMPARISONS,
    Evaluator,
    Headers,
    SelectorError,
    Value,
    as_number,
    compare_values,
    exact,
    parse_bool,
    parse_number,
)

# --------------------------------------------------------------------------- tree

class Kind(Enum):
    """What an expression yields, as far as the parser can tell; ANY is a plain header."""

    BOOL = "boolean"
    NUM = "numeric"
    STR = "string"
    ANY = "header"


@dataclass(frozen=True, slots=True)
class Node:
    evaluate: Evaluator
    kind: Kind
    depth: int
    column: int


def constant(value: Value) -> Evaluator:
    return lambda _headers: value


def header_of(name: str) -> Evaluator:
    def evaluate(headers: Headers) -> Value:
        value = headers.get(name)
        if value is None or isinstance(value, str | int | float):
            return value
        return None

    return evaluate


def typed_header(name: str, convert: Callable[[str | None], Value]) -> Evaluator:
    def evaluate(headers: Headers) -> Value:
        value = headers.get(name)
        return convert(value if isinstance(value, str) else None)

    return evaluate


def _int_or(default: int | None) -> Callable[[str | None], Value]:
    def convert(text: str | None) -> Value:
        number = None if text is None else parse_number(text)
        return number if isinstance(number, int) else default

    return convert


def _delivery_mode(text: str | None) -> str:
    return "PERSISTENT" if text is not None and text.lower() == "true" else "NON_PERSISTENT"


def _redelivered(text: str | None) -> bool:
    return text is not None and text.lower() == "true"


def _same(text: str | None) -> str | None:
    return text


JMS_HEADERS: dict[str, tuple[str, Kind, Callable[[str | None], Value]]] = {
    "JMSMessageID": ("message-id", Kind.STR, _same),
    "JMSCorrelationID": ("correlation-id", Kind.STR, _same),
    "JMSType": ("type", Kind.STR, _same),
    "JMSDestination": ("destination", Kind.STR, _same),
    "JMSReplyTo": ("reply-to", Kind.STR, _same),
    "JMSPriority": ("priority", Kind.NUM, _int_or(4)),
    "JMSTimestamp": ("timestamp", Kind.NUM, _int_or(None)),
    "JMSExpiration": ("expires", Kind.NUM, _int_or(0)),
    "JMSDeliveryMode": ("persistent", Kind.STR, _delivery_mode),
    "JMSRedelivered": ("redelivered", Kind.BOOL, _redelivered),
}
"""JMS header identifier -> (STOMP header, kind, conversion of the raw value or None).

Other ``JMSX*`` names (JMSXGroupID, JMSXDeliveryCount, ...) are ordinary headers.
"""


def and_(evaluators: Sequence[Evaluator]) -> Evaluator:
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


def or_(evaluators: Sequence[Evaluator]) -> Evaluator:
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


def not_(inner: Evaluator) -> Evaluator:
    def evaluate(headers: Headers) -> Value:
        value = inner(headers)
        return None if value is None else not value

    return evaluate


def truth(inner: Evaluator) -> Evaluator:
    """A header used as a condition: 'true'/'false' are booleans, other values are FALSE."""

    def evaluate(headers: Headers) -> Value:
        value = inner(headers)
        if value is None or isinstance(value, bool):
            return value
        return parse_bool(value) is True if isinstance(value, str) else False

    return evaluate


def arithmetic(first: Evaluator, rest: Sequence[tuple[str, Evaluator]]) -> Evaluator:
    steps = [(ARITHMETIC[op], term) for op, term in rest]

    def evaluate(headers: Headers) -> Value:
        accumulator = as_number(first(headers))
        for apply, term in steps:
            operand = as_number(term(headers))
            if accumulator is None or operand is None:
                return None
            result = apply(accumulator, operand)
            accumulator = exact(result) if isinstance(result, int) else result
        return accumulator

    return evaluate


def negate(inner: Evaluator) -> Evaluator:
    def evaluate(headers: Headers) -> Value:
        number = as_number(inner(headers))
        if isinstance(number, int):
            return exact(-number)
        return None if number is None else -number

    return evaluate


def comparison(op: str, left: Evaluator, right: Evaluator) -> Evaluator:
    compare = COMPARISONS[op]
    return lambda headers: compare_values(compare, left(headers), right(headers))


def between(value: Evaluator, low: Evaluator, high: Evaluator, negated: bool) -> Evaluator:
    def evaluate(headers: Headers) -> Value:
        subject = value(headers)
        above = compare_values(operator.ge, subject, low(headers))
        below = compare_values(operator.le, subject, high(headers))
        if above is False or below is False:
            return negated
        if above is None or below is None:
            return None
        return not negated

    return evaluate


def in_(value: Evaluator, choices: Sequence[str], negated: bool) -> Evaluator:
    members = frozenset(choices)

    def evaluate(headers: Headers) -> Value:
        subject = value(headers)
        if subject is None:
            return None
        if isinstance(subject, str):
            found = subject in members
        else:
            found = any(compare_values(operator.eq, subject, choice) for choice in choices)
        return found != negated

    return evaluate


def like(value: Evaluator, matcher: Callable[[str], bool], negated: bool) -> Evaluator:
    def evaluate(headers: Headers) -> Value:
        subject = value(headers)
        if subject is None:
            return None
        if not isinstance(subject, str):
            return False
        return matcher(subject) != negated

    return evaluate


def is_null(value: Evaluator, negated: bool) -> Evaluator:
    return lambda headers: (value(headers) is None) != negated


# --------------------------------------------------------------------------- LIKE

def like_matcher(pattern: str, escape: str | None, column: int) -> Callable[[str], bool]:
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
