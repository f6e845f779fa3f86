"""Which filters a batch read answers itself (spark/pushdown.py): comparisons on ``offset``
narrow the seq range, equalities on header columns become a selector for the broker;
everything else is left to Spark. No Spark session needed."""

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

from sluicemq.core.selectors import compile_selector
from sluicemq.spark.pushdown import SeqBounds, header_selector


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


def test_header_column_equalities_become_a_selector_that_matches_what_spark_keeps() -> None:
    filters = [EqualTo(("region",), "EU"), In(("kind",), ("a", "it's")),
               GreaterThan(("offset",), 3), EqualTo(("body",), "x"),
               StringStartsWith(("region",), "E")]
    text = header_selector(filters, ("region", "kind"))
    assert text == "region = 'EU' AND kind IN ('a', 'it''s')"
    selector = compile_selector(text)
    assert selector.matches({"region": "EU", "kind": "it's"})
    assert not selector.matches({"region": "EU", "kind": "b"})
    assert not selector.matches({"kind": "a"})


def test_names_a_selector_cannot_spell_or_non_string_values_push_nothing() -> None:
    columns = ("in", "a.b", "n", "trace-id")
    assert header_selector([EqualTo(("in",), "x"), EqualTo(("a.b",), "x"),
                            EqualTo(("n",), 5), In(("n",), ("1", 2))], columns) is None
    hyphen = header_selector([EqualTo(("trace-id",), "t1")], columns)
    assert hyphen == "hyphenated_props:trace-id = 't1'"
    assert hyphen is not None and compile_selector(hyphen).matches({"trace-id": "t1"})
