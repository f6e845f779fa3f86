"""Column batches (``protocol/columns.py``) into ``pyarrow.RecordBatch`` rows for Spark.

Why: PySpark turns tuples into Arrow in the Python worker, which cost ~40 % of its CPU, and
reading one MESSAGE frame per row cost about as much again. A column batch already has Arrow's
layout for its variable-size columns (int32 offsets + bytes), so bodies and header JSON are
wrapped as they arrived, with no copy and no loop per row; the fixed-size columns are wrapped
or computed by Arrow's kernels. Only a ``map`` header column or named header columns decode
each row's JSON.

Every argument handed to a compute kernel is an Arrow value, never a Python one: pyarrow
converts a Python scalar by first trying to import pandas and dateutil, a search of
``sys.path`` on every call where they are not installed (a fifth of a reader's time).
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
_NO_SEPARATOR = pa.scalar("")


def _wrap(cols: Columns, at: int, size: int) -> pa.Buffer:
    return pa.py_buffer(cols.body[at:at + size])


def _fixed(cols: Columns, kind: pa.DataType, at: int, width: int) -> pa.Array:
    return pa.Array.from_buffers(kind, cols.count, [None, _wrap(cols, at, width * cols.count)])


def _numbers(cols: Columns, dtype: type[np.generic], at: int) -> np.ndarray:
    return np.frombuffer(cols.body, dtype, cols.count, at)


def _bits(mask: np.ndarray) -> pa.Buffer:
    """A boolean mask as Arrow's bitmap (least significant bit first)."""
    return pa.py_buffer(np.packbits(mask, bitorder="little"))


def _repeat(value: str, n: int) -> pa.Array:
    """``value`` n times, as a string array built from its two buffers."""
    data = value.encode()
    offsets = np.arange(n + 1, dtype=np.int32) * len(data)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets),
                                                  pa.py_buffer(data * n)])


def _timestamps(cols: Columns) -> pa.Array:
    """Milliseconds (0: unknown) as Spark's microsecond TIMESTAMP, null where unknown."""
    millis = _numbers(cols, np.int64, cols.timestamp_at)
    unknown = millis == 0
    valid = _bits(~unknown) if unknown.any() else None
    micros = millis * 1000
    return pa.Array.from_buffers(TIMESTAMP, cols.count, [valid, pa.py_buffer(micros)])


def _redelivered(cols: Columns) -> pa.Array:
    flags = _numbers(cols, np.uint8, cols.flags_at)
    return pa.Array.from_buffers(pa.bool_(), cols.count,
                                 [None, _bits((flags & REDELIVERED) != 0)])


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
    arrays: dict[str, pa.Array] = {
        "message_id": pc.binary_join_element_wise(_ID_PREFIX, pc.cast(seq, pa.string()),
                                                  _NO_SEPARATOR),
        "destination": _repeat(destination, n),
    }
    header_json, bodies = _values(cols)
    parsed = [json.loads(h) for h in header_json.to_pylist()] if shape.parses_headers else []
    if shape.headers == "json":
        arrays["headers"] = header_json
    elif shape.headers == "map":
        arrays["headers"] = pa.array([list(h.items()) for h in parsed], _MAP)
    arrays["body"] = bodies
    arrays["timestamp"] = _timestamps(cols)
    arrays["redelivered"] = _redelivered(cols)
    arrays["offset"] = seq
    for name in shape.columns:
        arrays[name] = pa.array([h.get(name) for h in parsed], pa.string())
    return pa.RecordBatch.from_arrays(list(arrays.values()), names=list(arrays))
