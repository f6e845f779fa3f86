"""Reading one slice: what a task runs on an executor (planning is in ``ranges``)."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from sluicemq.buffers import BufferPool
from sluicemq.client.sync_conn import BODIES_KEPT
from sluicemq.spark.arrow import record_batch
from sluicemq.spark.files import file_batches
from sluicemq.spark.options import SourceOptions
from sluicemq.spark.ranges import RangePartition, connect, target
from sluicemq.spark.rows import message_row, stream_rows

# The kept frame bodies of this process's column-batch reads. PySpark builds a fresh reader
# (and so a fresh connection) for every task, but runs the tasks one after another in a
# reused worker process: a pool per connection filled 8 fresh 4 MiB buffers (a memset and
# a page fault per 4 KiB) for each task's ~30 frames; the process is what outlives a task.
TASK_BUFFERS = BufferPool(keep=BODIES_KEPT, largest=64 << 20)


def read_rows(opts: SourceOptions, part: RangePartition, *, ledger: str | None,
              selector: str | None = None) -> Iterator[tuple | pa.RecordBatch]:
    """The rows of one slice, read over a fresh connection (this runs on an executor): Arrow
    record batches built from column batches, or (option ``bulk`` false, and streams mode)
    tuples built from one MESSAGE frame each."""
    columns = opts.stream_format is None and not opts.streams and opts.batch_bytes is not None
    # Column batches become Arrow arrays over each frame's body, released once Spark took
    # them: their 4 MiB bodies can reuse a few kept buffers (no page faults per frame).
    with connect(opts.connection, reuse_buffers=TASK_BUFFERS if columns else False) as client, \
            client.read_range(
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
