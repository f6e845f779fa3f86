"""Spec of the sink's Arrow encoding (spark/arrow_sink.py), in-process: record batches as Spark
hands them to an Arrow writer become column batches that decode to the same rows, whatever
their body type, slicing, nulls, header form or destinations."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicemq.protocol import columns
from sluicemq.spark import arrow_sink

MAP = pa.map_(pa.string(), pa.string())


def decoded(body: bytes) -> list[tuple[dict, bytes, int]]:
    b = columns.decode(body)
    return [(json.loads(b.headers_json(i)), b.body_of(i), b.priority[i]) for i in range(b.count)]


def test_binary_and_string_bodies_with_map_headers_round_trip() -> None:
    batch = pa.RecordBatch.from_pydict({
        "body": pa.array([b"a", None, b"ccc"], pa.binary()),
        "headers": pa.array([[("k", "1")], None, [("k", "3"), ("x", "y")]], MAP)})
    [(dest, body, n, _sum)] = list(arrow_sink.frames(batch, "/queue/out"))
    assert (dest, n) == ("/queue/out", 3)
    assert decoded(body) == [({"k": "1"}, b"a", 4), ({}, b"", 4),
                             ({"k": "3", "x": "y"}, b"ccc", 4)]
    text = pa.RecordBatch.from_pydict({"body": pa.array(["é", "z"], pa.string())})
    [(_d, body, _n, _s)] = list(arrow_sink.frames(text, "/queue/out"))
    assert decoded(body) == [({}, "é".encode(), 4), ({}, b"z", 4)]


def test_a_sliced_batch_is_rebased_and_json_header_strings_pass_through() -> None:
    batch = pa.RecordBatch.from_pydict({
        "body": pa.array([b"skip", b"b1", b"b2"], pa.binary()),
        "headers": pa.array(['{"s":"0"}', '{"s":"1"}', None], pa.string()),
        "priority": pa.array([1, 9, None], pa.int32())}).slice(1, 2)
    [(_d, body, n, _s)] = list(arrow_sink.frames(batch, "/queue/out"))
    assert n == 2
    assert decoded(body) == [({"s": "1"}, b"b1", 9), ({}, b"b2", 4)]


def test_rows_go_to_their_destination_column_and_large_inputs_are_cut() -> None:
    n = 3000
    batch = pa.RecordBatch.from_pydict({
        "body": pa.array([bytes(5000)] * n, pa.binary()),
        "destination": pa.array(["/queue/a" if i % 3 else None for i in range(n)])})
    out = list(arrow_sink.frames(batch, "/queue/default"))
    assert {d for d, _b, _n, _s in out} == {"/queue/a", "/queue/default"}
    assert sum(k for _d, _b, k, _s in out) == n
    assert all(len(b) < 2 * arrow_sink.BATCH_BYTES for _d, b, _n, _s in out)
    assert len(out) >= n * 5000 // arrow_sink.BATCH_BYTES


def test_rows_without_body_or_destination_are_refused() -> None:
    with pytest.raises(ValueError, match="need a `body` column"):
        list(arrow_sink.frames(pa.RecordBatch.from_pydict({"x": [1]}), "/queue/a"))
    with pytest.raises(ValueError, match="no destination"):
        list(arrow_sink.frames(pa.RecordBatch.from_pydict({"body": [b"x"]}), None))
    with pytest.raises(ValueError, match="must be binary or string"):
        list(arrow_sink.frames(pa.RecordBatch.from_pydict({"body": [1]}), "/queue/a"))


def test_the_digest_does_not_depend_on_row_order_or_cuts_but_on_content() -> None:
    rows = [(f"h{i}", bytes([i]) * i) for i in range(50)]

    def total(batches: list[pa.RecordBatch]) -> int:
        return sum(s for b in batches for *_x, s in arrow_sink.frames(b, "/queue/o")) % (1 << 128)

    def batch(part: list[tuple[str, bytes]]) -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict({
            "body": pa.array([b for _h, b in part], pa.binary()),
            "headers": pa.array([[("k", h)] for h, _b in part], MAP)})

    whole = total([batch(rows)])
    assert total([batch(rows[::-1][:20]), batch(rows[::-1][20:])]) == whole
    changed = [*rows[:-1], ("h49", b"other")]
    assert total([batch(changed)]) != whole


@given(st.lists(st.one_of(st.none(), st.dictionaries(st.text(max_size=6), st.text(max_size=6),
                                                      max_size=4)), max_size=20),
       st.integers(0, 5))
def test_map_headers_become_the_json_object_of_their_entries(rows, skip: int) -> None:
    """Arrow's string kernels build the JSON where nothing needs escaping; quotes, backslashes
    and control characters take json.dumps: either way each row reads back as its map."""
    col = pa.array([None if r is None else list(r.items()) for r in rows], MAP)
    col = col.slice(min(skip, len(rows)))
    texts = arrow_sink._map_json(col).to_pylist()
    assert [json.loads(t) for t in texts] == [r or {} for r in rows[min(skip, len(rows)):]]
