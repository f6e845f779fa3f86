"""Which filters a batch read answers itself (spark/pushdown.py): comparisons on ``offset``
narrow the seq range; everything else is left to Spark. No Spark session needed."""

from __future__ import annotations

from pyspark.sql.datasource import (
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    LessThan,
    LessThanOrEqual,
    StringStartsWith,
)

from sluicemq.spark.pushdown import SeqBounds


def test_comparisons_on_offset_become_one_range_and_are_not_left_to_spark() -> None:
    bounds = SeqBounds()
    left = list(bounds.take([GreaterThan(("offset",), 9), LessThanOrEqual(("OFFSET",), 20),
                             GreaterThanOrEqual(("offset",), 5), LessThan(("offset",), 30)]))
    assert left == []
    assert (bounds.low, bounds.high) == (10, 21)
    assert bounds.clamp(1, 100) == (10, 21)
    assert bounds.clamp(15, 18) == (15, 18)


def test_equality_reads_one_seq_and_in_reads_its_span_but_spark_still_checks_it() -> None:
    bounds = SeqBounds()
    assert list(bounds.take([EqualTo(("offset",), 7)])) == []
    assert (bounds.low, bounds.high) == (7, 8)
    listed = In(("offset",), (3, 40, 12))
    spanned = SeqBounds()
    assert list(spanned.take([listed])) == [listed]
    assert (spanned.low, spanned.high) == (3, 41)


def test_other_columns_and_odd_values_are_left_to_spark() -> None:
    others = [EqualTo(("region",), "eu"), StringStartsWith(("body",), "x"),
              EqualTo(("offset",), None), GreaterThan(("offset",), True),
              EqualTo(("headers", "offset"), 3)]
    bounds = SeqBounds()
    assert list(bounds.take(others)) == others
    assert (bounds.low, bounds.high) == (None, None)


def test_contradictory_bounds_read_nothing() -> None:
    bounds = SeqBounds()
    list(bounds.take([GreaterThan(("offset",), 50), LessThan(("offset",), 10)]))
    start, end = bounds.clamp(1, 100)
    assert start >= end
