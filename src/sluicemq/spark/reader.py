"""Batch reads: `spark.read.format("sluice")` browses what a destination holds right now.

Nothing is consumed unless option `consume` is true; then each slice is removed from the
broker after it was read whole (a task that fails before that removes nothing, and its retry
reads the same slice again).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from pyspark.sql.datasource import DataSourceReader, InputPartition

from sluicemq.spark.options import SourceOptions
from sluicemq.spark.ranges import RangePartition, connect, read_rows, slices, target


class SluiceBatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.opts
        with connect(opts.connection) as client:
            head = client.head(opts.destination, **target(opts))
            return slices(client, opts, head.first, head.next)

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        if not isinstance(partition, RangePartition):
            return  # nothing retained: Spark reads one `InputPartition(None)` instead of none
        opts = self.opts
        yield from read_rows(opts, partition, ledger=None)
        if opts.consume:
            with connect(opts.connection) as client:
                client.commit_upto(opts.destination, partition.end, ledger=opts.ledger,
                                   start=partition.start, **target(opts))
