"""The sink's Arrow path: record batches from Spark become column batches on the wire.

Why: the row writer sends one SEND frame per row, built from a Spark ``Row`` in Python. Spark
hands an Arrow writer its rows as ``pyarrow.RecordBatch``es, whose ``body`` column already has
a column batch's layout (offsets + bytes), so a few MiB of rows become one staged SEND
(``sluice-format:columns``, docs/replay-protocol.md section 3) with C-speed steps. Only a
``headers`` map column is turned into JSON row by row; a ``headers`` string column (the
source's JSON, passed through) is sent as it is and checked by the broker.
"""

from __future__ import annotations

import json
import uuid
from array import array
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter
from zlib_ng.zlib_ng import crc32

from sluicemq.protocol import columns
from sluicemq.spark.options import SinkOptions
from sluicemq.spark.ranges import connect
from sluicemq.spark.writer import SluiceBatchWriter, SluiceStreamWriter, StagedPart

BATCH_BYTES = 4 << 20  # body bytes per staged frame
DEFAULT_PRIORITY = 4
_DIGEST_MASK = (1 << 128) - 1


def digest(destination: str, hoff: bytes, hdata: pa.Buffer, boff: bytes,
           bdata: pa.Buffer) -> int:
    """An order-free digest of a batch's messages for the publication token: the sum of each
    row's (CRC-32 of destination + headers, CRC-32 of body) mod 2^128. The row writer hashes
    rows another way; a token is only compared with the same query's own earlier publication
    of the batch, written by the same writer."""
    hs, bs = array("i"), array("i")
    hs.frombytes(hoff)
    bs.frombytes(boff)
    head, body = memoryview(hdata), memoryview(bdata)
    seed = crc32(destination.encode())
    heads = [crc32(head[a:b], seed) for a, b in pairwise(hs)]
    bodies = [crc32(body[a:b]) for a, b in pairwise(bs)]
    return ((sum(heads) << 32) + sum(bodies)) & _DIGEST_MASK  # the same as summing h<<32|b


def _offsets_and_data(arr: pa.Array) -> tuple[bytes, pa.Buffer]:
    """int32 offsets from 0 and the bytes they index, of a binary array (null = empty)."""
    if arr.null_count:
        arr = arr.fill_null(b"")
    _validity, offsets, data = arr.buffers()
    n = len(arr)
    offs = pa.Array.from_buffers(pa.int32(), n + 1, [None, offsets], offset=arr.offset)
    first, last = offs[0].as_py(), offs[n].as_py()
    if first:
        offs = pc.subtract(offs, pa.scalar(first, pa.int32()))
    raw = offs.buffers()[1].to_pybytes()[offs.offset * 4:(offs.offset + n + 1) * 4]
    body = data.slice(first, last - first) if data is not None else pa.py_buffer(b"")
    return raw, body


def _as_binary(arr: pa.Array) -> pa.Array:
    if pa.types.is_binary(arr.type):
        return arr
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type) or \
            pa.types.is_large_binary(arr.type):
        return arr.cast(pa.binary())
    raise ValueError(f"the body column must be binary or string, not {arr.type}")


def _headers_json(batch: pa.RecordBatch) -> pa.Array:
    """Each row's headers as a JSON object: from a map column, a JSON string column, or {}."""
    n = batch.num_rows
    if "headers" not in batch.schema.names:
        return pa.array(["{}"] * n, pa.string())
    col = batch.column("headers")
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        return col.cast(pa.string()).fill_null("{}")
    if pa.types.is_map(col.type):
        return _map_json(col)
    raise ValueError(f"the headers column must be map<string,string> or a JSON string, not "
                     f"{col.type}")


def _needs_escape(strings: pa.Array) -> bool:
    """Whether any byte of these strings is one JSON escapes in a string (a quote, a
    backslash, a control character): one look at their bytes, not a step per string."""
    _validity, offsets, data = strings.buffers()
    if data is None or not len(strings):
        return False
    offs = np.frombuffer(offsets, np.int32, len(strings) + 1, strings.offset * 4)
    raw = np.frombuffer(data, np.uint8)[offs[0]:offs[-1]]
    return bool(((raw < 0x20) | (raw == 0x22) | (raw == 0x5C)).any())


def _map_json(col: pa.MapArray) -> pa.Array:
    """A map<string,string> column as JSON objects, built by Arrow's string kernels (no step
    per row) when no key or value needs escaping, else by json.dumps row by row."""
    keys, items = col.keys.cast(pa.string()), col.items.cast(pa.string())
    if not items.null_count and not _needs_escape(keys) and not _needs_escape(items):
        pairs = pc.binary_join_element_wise('"', keys, '":"', items, '"', "")
        rows = pc.binary_join(pa.ListArray.from_arrays(col.offsets, pairs), ",")
        return pc.binary_join_element_wise("{", rows, "}", "")
    return pa.array([json.dumps({str(k): str(v) for k, v in (row or [])},
                                separators=(",", ":"), ensure_ascii=False)
                     for row in col.to_pylist()], pa.string())


def encode(batch: pa.RecordBatch, destination: str = "") -> tuple[bytes, int]:
    """One column batch of every row of ``batch`` (one destination), and its digest."""
    n = batch.num_rows
    hoff, hdata = _offsets_and_data(_as_binary(_headers_json(batch)))
    boff, bdata = _offsets_and_data(_as_binary(batch.column("body")))
    if "priority" in batch.schema.names:
        prio = pc.fill_null(batch.column("priority"), DEFAULT_PRIORITY).cast(pa.uint8())
        priority = prio.buffers()[1].to_pybytes()[prio.offset:prio.offset + n]
    else:
        priority = bytes([DEFAULT_PRIORITY]) * n
    zeros = bytes(8 * n)
    fixed = [zeros, zeros, zeros, priority, bytes(n), hoff, boff]
    body = b"".join(columns.assemble(n, fixed, [memoryview(hdata)], hdata.size,
                                     [memoryview(bdata)]))
    return body, digest(destination, hoff, hdata, boff, bdata)


def frames(batch: pa.RecordBatch, default_destination: str | None
           ) -> Iterator[tuple[str, bytes, int, int]]:
    """(destination, column batch, rows, digest) for the rows of ``batch``, a few MiB a
    frame."""
    if "body" not in batch.schema.names:
        raise ValueError("rows written to sluice need a `body` column")
    groups: list[tuple[str | None, pa.RecordBatch]] = [(default_destination, batch)]
    if "destination" in batch.schema.names:
        dest = batch.column("destination")
        if dest.null_count:
            dest = dest.fill_null(default_destination or "")
        values = pc.unique(dest).to_pylist()
        groups = [(v or default_destination, batch.filter(pc.equal(dest, v))) for v in values]
    for destination, rows in groups:
        if not destination:
            raise ValueError("no destination: add a `destination` column or option destination")
        body_bytes = pc.sum(pc.binary_length(_as_binary(rows.column("body")))).as_py() or 0
        per = max(1, int(rows.num_rows * BATCH_BYTES / max(1, body_bytes)))
        for start in range(0, rows.num_rows, per):
            part = rows.slice(start, per)
            body, sums = encode(part, destination)
            yield destination, body, part.num_rows, sums


def stage_batches(opts: SinkOptions, batch: str, batches: Iterator[pa.RecordBatch], *,
                  sink: str, owner: str) -> StagedPart:
    """Park this task's record batches as one part of (sink, batch); runs on an executor."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    where = f"p{ctx.partitionId()}-a{ctx.attemptNumber()}" if ctx is not None else "p"
    part = f"{where}-{uuid.uuid4().hex[:12]}"
    count = total = 0
    with connect(opts.connection) as client, client.stage(sink, batch, part) as staged:
        for record_batch in batches:
            for destination, body, rows, sums in frames(record_batch, opts.destination):
                staged.send_batch(destination, body, rows)
                count += rows
                total = (total + sums) & _DIGEST_MASK
    return StagedPart(part, count, sink, owner, total)


class SluiceBatchArrowWriter(SluiceBatchWriter, DataSourceArrowWriter):
    """`df.write.format("sluice")` with Arrow record batches in."""

    def write(self, iterator: Iterator[Any]) -> StagedPart:
        return stage_batches(self.opts, self.batch, iterator, sink=self.sink, owner=self.batch)


class SluiceStreamArrowWriter(SluiceStreamWriter, DataSourceStreamArrowWriter):
    """`df.writeStream.format("sluice")` with Arrow record batches in."""

    def write(self, iterator: Iterator[Any]) -> StagedPart:
        batch, sink, owner = self.task_target()
        return stage_batches(self.opts, batch, iterator, sink=sink, owner=owner)

