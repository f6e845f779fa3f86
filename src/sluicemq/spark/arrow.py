"""Column batches (``protocol/columns.py``) into ``pyarrow.RecordBatch`` rows for Spark.

Why: PySpark turns tuples into Arrow in the Python worker, which cost ~40 % of its CPU, and
reading one MESSAGE frame per row cost about as much again. A column batch already has Arrow's
layout for its variable-size columns (int32 offsets + bytes), so bodies and header JSON are
wrapped as they arrived, with no copy and no loop per row; the fixed-size columns are wrapped
or computed by Arrow's kernels. Only a ``map`` header column or named header columns decode
each row's JSON.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluicemq.protocol.columns import REDELIVERED, SPANS, Columns
from sluicemq.spark.schema import Shape

TIMESTAMP = pa.timestamp("us", tz="UTC")  # what Spark's TIMESTAMP is in Arrow
_MAP = pa.map_(pa.string(), pa.string())
_ID_PREFIX = pa.scalar("ID:sluice-")


def _wrap(cols: Columns, at: int, size: int) -> pa.Buffer:
    return pa.py_buffer(cols.body[at:at + size])


def _fixed(cols: Columns, kind: pa.DataType, at: int, width: int) -> pa.Array:
    return pa.Array.from_buffers(kind, cols.count, [None, _wrap(cols, at, width * cols.count)])


def _varsize(cols: Columns, kind: pa.DataType, off_at: int, data_at: int) -> pa.Array:
    n = cols.count
    offsets = _wrap(cols, off_at, 4 * (n + 1))
    end = int.from_bytes(cols.body[off_at + 4 * n:off_at + 4 * n + 4], "little", signed=True)
    return pa.Array.from_buffers(kind, n, [None, offsets, _wrap(cols, data_at, end)])


def _spans(cols: Columns, kind: pa.DataType, first: int) -> pa.Array:
    """Every message's headers (``first`` 0) or bodies (1) of a spans-layout batch: the spans
    are the offsets of 3n - 1 values over the data, of which every third is wanted; Arrow's
    ``take`` copies those together in C."""
    n = cols.count
    data = pa.py_buffer(cols.body[cols.data_at:])
    values = pa.Array.from_buffers(kind, 3 * n - 1, [None, _wrap(cols, cols.spans_at, 12 * n),
                                                      data])
    return values.take(pa.array(np.arange(first, 3 * n - 1, 3, dtype=np.int32)))


def _values(cols: Columns) -> tuple[pa.Array, pa.Array]:
    """(header JSON as strings, bodies as binary) of either layout."""
    if cols.layout == SPANS:
        return _spans(cols, pa.string(), 0), _spans(cols, pa.binary(), 1)
    return (_varsize(cols, pa.string(), cols.hoff_at, cols.hdata_at),
            _varsize(cols, pa.binary(), cols.boff_at, cols.bdata_at))


def record_batch(cols: Columns, destination: str, shape: Shape) -> pa.RecordBatch:
    """The rows of one column batch in the schema ``shape.ddl()`` describes."""
    n = cols.count
    seq = _fixed(cols, pa.int64(), cols.seq_at, 8)
    millis = _fixed(cols, pa.int64(), cols.timestamp_at, 8)
    flags = _fixed(cols, pa.uint8(), cols.flags_at, 1)
    arrays: dict[str, pa.Array] = {
        "message_id": pc.binary_join_element_wise(_ID_PREFIX, pc.cast(seq, pa.string()), ""),
        "destination": pa.array([destination], pa.string()).take(
            pa.nulls(n, pa.int32()).fill_null(0)),
    }
    header_json, bodies = _values(cols)
    parsed = [json.loads(h) for h in header_json.to_pylist()] if shape.parses_headers else []
    if shape.headers == "json":
        arrays["headers"] = header_json
    elif shape.headers == "map":
        arrays["headers"] = pa.array([list(h.items()) for h in parsed], _MAP)
    arrays["body"] = bodies
    micros = pc.multiply(millis, 1000)
    arrays["timestamp"] = pc.if_else(pc.equal(millis, 0), pa.scalar(None, TIMESTAMP),
                                     micros.cast(TIMESTAMP))
    arrays["redelivered"] = pc.not_equal(pc.bit_wise_and(flags, REDELIVERED), 0)
    arrays["offset"] = seq
    for name in shape.columns:
        arrays[name] = pa.array([h.get(name) for h in parsed], pa.string())
    return pa.RecordBatch.from_arrays(list(arrays.values()), names=list(arrays))
