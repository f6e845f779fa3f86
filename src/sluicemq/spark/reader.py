"""Batch reads: `spark.read.format("sluice")` browses what a destination holds right now.

Nothing is consumed unless option `consume` is true; then each slice is removed from the
broker after it was read whole (a task that fails before that removes nothing, and its retry
reads the same slice again).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from pyspark.sql.datasource import DataSourceReader, Filter, InputPartition

from sluicemq.spark.options import SourceOptions
from sluicemq.spark.pushdown import SeqBounds, header_selector
from sluicemq.spark.ranges import RangePartition, connect, slices, target


class SluiceBatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.bounds = SeqBounds()  # stays unbounded unless filters were pushed
        self.selector: str | None = None  # header equalities pushed to the broker

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.opts
        with connect(opts.connection) as client:
            head = client.head(opts.destination, **target(opts))
            start, end = self.bounds.clamp(head.first, head.next)
            return slices(client, opts, start, end)

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        if not isinstance(partition, RangePartition):
            return  # nothing retained: Spark reads one `InputPartition(None)` instead of none
        from sluicemq.spark.slice_read import read_rows  # Arrow: only where tasks run

        opts = self.opts
        yield from read_rows(opts, partition, ledger=None, selector=self.selector)
        if opts.consume:
            with connect(opts.connection) as client:
                client.commit_upto(opts.destination, partition.end, ledger=opts.ledger,
                                   start=partition.start, **target(opts))


class SluicePushdownReader(SluiceBatchReader):
    """A batch read that takes filters (option ``pushdown``). Its own class because PySpark
    refuses any reader that implements ``pushFilters`` unless
    ``spark.sql.python.filterPushdown.enabled`` is true, and a source cannot see that conf."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        """Comparisons on ``offset`` narrow the range read, equalities on header columns
        become the read's selector (spark/pushdown.py); a file or stream row's offset is where
        its stream completed and its headers are the stream's, so those reads push nothing."""
        if self.opts.streams:
            return filters
        rest = list(self.bounds.take(filters))
        self.selector = header_selector(rest, self.opts.shape.columns)
        return rest
