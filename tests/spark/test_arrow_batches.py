"""A column batch becomes one Arrow record batch in the source's schema, whichever layout the
broker sent, with no Python value handed to a compute kernel (pyarrow would look for pandas on
every such call)."""

from __future__ import annotations

import datetime as dt
import json
import sys
from collections.abc import Iterator

import pytest

pa = pytest.importorskip("pyarrow")

from sluicemq.protocol import columns  # noqa: E402
from sluicemq.spark.arrow import record_batch  # noqa: E402
from sluicemq.spark.schema import Shape  # noqa: E402

MESSAGES = [  # seq, ms timestamp (0: unknown), flags, headers, body
    (7, 1_700_000_000_123, 0, {"region": "eu"}, b""),
    (8, 0, columns.REDELIVERED, {"region": "us", "k": "v"}, b"\x00body\xff"),
    (12, 1_700_000_000_999, columns.REDELIVERED | columns.PERSISTENT, {}, b"x" * 3000),
]


def _batch(writer: columns.ColumnWriter | columns.SpanWriter) -> columns.Columns:
    for seq, ts, flags, headers, body in MESSAGES:
        writer.add(seq, ts, 0, 4, flags, json.dumps(headers).encode(), body)
    return columns.decode(b"".join(bytes(b) for b in writer.finish()))


@pytest.fixture(params=["packed", "spans"])
def batch(request: pytest.FixtureRequest) -> columns.Columns:
    writer = columns.ColumnWriter() if request.param == "packed" else columns.SpanWriter()
    return _batch(writer)


def test_every_column_holds_each_messages_value(batch: columns.Columns) -> None:
    rows = record_batch(batch, "/queue/orders", Shape()).to_pylist()
    assert [r["offset"] for r in rows] == [7, 8, 12]
    assert [r["message_id"] for r in rows] == ["ID:sluice-7", "ID:sluice-8", "ID:sluice-12"]
    assert [r["destination"] for r in rows] == ["/queue/orders"] * 3
    assert [r["body"] for r in rows] == [m[4] for m in MESSAGES]
    assert [json.loads(r["headers"]) for r in rows] == [m[3] for m in MESSAGES]
    assert [r["redelivered"] for r in rows] == [False, True, True]
    utc = dt.UTC
    assert [r["timestamp"] for r in rows] == [
        dt.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=utc), None,
        dt.datetime(2023, 11, 14, 22, 13, 20, 999000, tzinfo=utc)]


def test_the_schema_is_the_one_the_source_declares(batch: columns.Columns) -> None:
    rb = record_batch(batch, "/queue/orders", Shape())
    assert rb.schema.names == ["message_id", "destination", "headers", "body", "timestamp",
                               "redelivered", "offset"]
    assert [str(t) for t in rb.schema.types] == [
        "string", "string", "string", "binary", "timestamp[us, tz=UTC]", "bool", "int64"]
    rb.validate(full=True)


def test_header_shapes_map_none_and_named_columns(batch: columns.Columns) -> None:
    as_map = record_batch(batch, "/queue/o", Shape(headers="map")).to_pylist()
    assert [dict(r["headers"]) for r in as_map] == [m[3] for m in MESSAGES]
    named = record_batch(batch, "/queue/o", Shape(headers="none", columns=("region",)))
    assert "headers" not in named.schema.names
    assert named.column("region").to_pylist() == ["eu", "us", None]


def test_a_batch_with_every_timestamp_known_has_no_null_bitmap() -> None:
    writer = columns.SpanWriter()
    writer.add(1, 5, 0, 4, 0, b"{}", b"a")
    cols = columns.decode(b"".join(bytes(b) for b in writer.finish()))
    stamps = record_batch(cols, "/queue/q", Shape()).column("timestamp")
    assert stamps.null_count == 0 and stamps.buffers()[0] is None


class _NoImports:
    """Fails any import attempted while it is installed."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        self.asked.append(name)


@pytest.fixture
def imports() -> Iterator[_NoImports]:
    finder = _NoImports()
    sys.meta_path.insert(0, finder)
    try:
        yield finder
    finally:
        sys.meta_path.remove(finder)


def test_converting_a_batch_looks_for_no_module(batch: columns.Columns,
                                                imports: _NoImports) -> None:
    record_batch(batch, "/queue/orders", Shape())  # modules it needs are loaded by now
    imports.asked.clear()
    record_batch(batch, "/queue/orders", Shape())
    assert imports.asked == []
