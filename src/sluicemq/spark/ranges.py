"""Planning and reading seq ranges: what the batch and streaming readers share.

A range `[start, end)` of broker sequence numbers is a fixed set of messages once `end` is at
or below the broker's head (docs/replay-protocol.md), so it can be cut into slices that
executors read in parallel, each over its own connection, and any slice can be read again
after a failure with the same result until the ledger commits past it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from sluicemq.client import Client
from sluicemq.spark.arrow import record_batch
from sluicemq.spark.files import file_batches
from sluicemq.spark.options import Connection, SourceOptions
from sluicemq.spark.rows import message_row, stream_rows


class RangePartition(InputPartition):
    """One slice `[start, end)` of one destination: all a task needs to read it."""

    def __init__(self, start: int, end: int) -> None:
        super().__init__((start, end))
        self.start = start
        self.end = end

    def __repr__(self) -> str:
        return f"RangePartition({self.start}, {self.end})"


def connect(conn: Connection, *, client_id: str | None = None) -> Client:
    return Client(conn.url, login=conn.login, passcode=conn.passcode, client_id=client_id,
                  timeout=conn.timeout)


def target(opts: SourceOptions) -> dict[str, Any]:
    """The keyword arguments that name what is read: a queue, or a durable subscription."""
    return {"subscription": opts.subscription, "client_id": opts.connection.client_id,
            "streams": opts.streams}


def slices(client: Client, opts: SourceOptions, start: int, end: int) -> list[RangePartition]:
    """Cut `[start, end)` into up to `opts.partitions` slices of about equal message count."""
    if end <= start:
        return []
    if opts.partitions == 1:
        return [RangePartition(start, end)]
    head = client.head(opts.destination, start=start, end=end, splits=opts.partitions,
                       **target(opts))
    cuts = [s for s in head.splits if start < s < end]
    bounds = [start, *sorted(set(cuts)), end]
    return [RangePartition(a, b) for a, b in itertools.pairwise(bounds) if a < b]


def read_rows(opts: SourceOptions, part: RangePartition, *, ledger: str | None,
              selector: str | None = None) -> Iterator[tuple | pa.RecordBatch]:
    """The rows of one slice, read over a fresh connection (this runs on an executor): Arrow
    record batches built from column batches, or (option ``bulk`` false, and streams mode)
    tuples built from one MESSAGE frame each."""
    with connect(opts.connection) as client, client.read_range(
            opts.destination, part.start, part.end, ledger=ledger,
            batch_bytes=opts.batch_bytes, selector=selector, **target(opts)) as rng:
        if opts.stream_format is not None:
            assert opts.file_schema is not None, "set by the data source from the schema"
            yield from file_batches(rng, opts.stream_format, opts.file_schema,
                                    opts.file_options)
        elif opts.streams:
            yield from stream_rows(rng, opts.stream_output, opts.path)
        elif opts.batch_bytes is not None:
            for cols in rng.batches():
                yield record_batch(cols, opts.destination, opts.shape)
        else:
            for msg in rng:
                yield message_row(msg, opts.shape)
