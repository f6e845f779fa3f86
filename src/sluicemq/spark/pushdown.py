"""Filters a batch read answers itself: comparisons on ``offset`` narrow the range it reads,
equalities on header columns become the read's selector.

Why only ``offset``: it is the broker's sequence number, and a range read of ``[start, end)``
returns exactly the retained messages with ``start <= seq < end`` - so ``offset >= 1000 AND
offset < 2000`` is answered exactly by reading less (the rest of the queue is never sent),
and, with option ``consume``, by removing only what was read. ``IN`` narrows the range to its
smallest and largest value and is still checked by Spark; anything else (headers, bodies,
timestamps) is left to Spark.

Equalities (``=``, ``IN``) of string literals on ``headerColumns`` columns go to the broker as
a JMS selector, so messages that cannot match are never sent; Spark still checks those filters
(they are returned as not handled), so the selector only has to be no narrower than the filter.
Spark offers filters to a Python source only with
``spark.sql.python.filterPushdown.enabled=true`` (PySpark 4.1+, off by default).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    LessThan,
    LessThanOrEqual,
)

COLUMN = "offset"


@dataclass
class SeqBounds:
    """``[low, high)`` of seqs a read may return; None: unbounded on that side."""

    low: int | None = None
    high: int | None = None

    def clamp(self, start: int, end: int) -> tuple[int, int]:
        """``[start, end)`` narrowed to these bounds (empty: ``start >= end``)."""
        if self.low is not None:
            start = max(start, self.low)
        if self.high is not None:
            end = min(end, self.high)
        return start, end

    def take(self, filters: Iterable[Filter]) -> Iterator[Filter]:
        """Absorb what narrows the range; yield the filters Spark must still evaluate."""
        for f in filters:
            if not _on_offset(f):
                yield f
                continue
            value = getattr(f, "value", None)
            if isinstance(f, In):
                values = [v for v in f.value if v is not None]
                if values and all(isinstance(v, int) for v in values):
                    self._above(min(values))
                    self._below(max(values) + 1)
                yield f  # the range holds more than the listed offsets
            elif not isinstance(value, int) or isinstance(value, bool):
                yield f
            elif isinstance(f, EqualTo):
                self._above(value)
                self._below(value + 1)
            elif isinstance(f, GreaterThan):
                self._above(value + 1)
            elif isinstance(f, GreaterThanOrEqual):
                self._above(value)
            elif isinstance(f, LessThan):
                self._below(value)
            elif isinstance(f, LessThanOrEqual):
                self._below(value + 1)
            else:
                yield f

    def _above(self, low: int) -> None:
        self.low = low if self.low is None else max(self.low, low)

    def _below(self, high: int) -> None:
        self.high = high if self.high is None else min(self.high, high)


def _on_offset(f: Filter) -> bool:
    attribute: tuple[str, ...] = tuple(getattr(f, "attribute", ()))
    return len(attribute) == 1 and attribute[0].lower() == COLUMN


_NAME = re.compile(r"[A-Za-z_$][A-Za-z0-9_$-]*")
_RESERVED = {"AND", "OR", "NOT", "BETWEEN", "LIKE", "IN", "IS", "NULL", "TRUE", "FALSE",
             "ESCAPE"}


def header_selector(filters: Iterable[Filter], columns: Sequence[str]) -> str | None:
    """A JMS selector that every row passing the header-column equalities among ``filters``
    also passes (None: nothing to push). Names a selector cannot spell are left to Spark."""
    clauses: list[str] = []
    hyphens = False
    for f in filters:
        attribute: tuple[str, ...] = tuple(getattr(f, "attribute", ()))
        if len(attribute) != 1 or attribute[0] not in columns:
            continue
        name = attribute[0]
        if not _NAME.fullmatch(name) or name.upper() in _RESERVED:
            continue
        if isinstance(f, EqualTo) and isinstance(f.value, str):
            clauses.append(f"{name} = {_literal(f.value)}")
        elif isinstance(f, In) and f.value and all(isinstance(v, str) for v in f.value):
            clauses.append(f"{name} IN ({', '.join(map(_literal, f.value))})")
        else:
            continue
        hyphens = hyphens or "-" in name
    if not clauses:
        return None
    text = " AND ".join(clauses)
    return f"hyphenated_props:{text}" if hyphens else text  # else a-b means a minus b


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"
