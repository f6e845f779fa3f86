"""Planning and reading seq ranges: what the batch and streaming readers share.

A range `[start, end)` of broker sequence numbers is a fixed set of messages once `end` is at
or below the broker's head (docs/replay-protocol.md), so it can be cut into slices that
executors read in parallel, each over its own connection, and any slice can be read again
after a failure with the same result until the ledger commits past it.

Planning only: what a task runs to read its slice is in ``slice_read`` (it needs Arrow, which
the planning processes never load).
"""

from __future__ import annotations

import itertools
from typing import Any

from pyspark.sql.datasource import InputPartition

from sluicemq.buffers import BufferPool
from sluicemq.client import Client
from sluicemq.spark.options import Connection, SourceOptions


class RangePartition(InputPartition):
    """One slice `[start, end)` of one destination: all a task needs to read it."""

    def __init__(self, start: int, end: int) -> None:
        super().__init__((start, end))
        self.start = start
        self.end = end

    def __repr__(self) -> str:
        return f"RangePartition({self.start}, {self.end})"


def connect(conn: Connection, *, client_id: str | None = None,
            reuse_buffers: bool | BufferPool = False) -> Client:
    return Client(conn.url, login=conn.login, passcode=conn.passcode, client_id=client_id,
                  timeout=conn.timeout, reuse_buffers=reuse_buffers)


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
