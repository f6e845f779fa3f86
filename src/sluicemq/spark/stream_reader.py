"""Streaming reads: micro-batches are ranges of broker sequence numbers.

The offset Spark checkpoints is `{"seq": n}`: everything retained below n was read. A batch
`[start, end)` is planned with `end` at or below the broker's head, so it is a fixed set of
messages that Spark can read again after a crash (the ledger keeps them until `commit`).
`commit(end)` moves the broker-side ledger: only then are the messages removed. With an
idempotent sink (Spark's file sink, or ours) that gives exactly-once results.

Spark calls `commit` late (when it plans the next batch) and not at all for the last batch
before a stop, so `latestOffset(start)` commits `start` too: in micro-batch mode Spark asks for
a new batch only once every batch ending at `start` is in its commit log (a batch planned but
not committed before a crash is re-run from the offset log first, without `latestOffset`).

A commit is sent, not waited for (removing a million messages takes the broker a quarter of a
second, which would hold up the next batch or the end of an availableNow query): the broker
carries out a commit it received even if this process dies, and one that never arrived is
sent again by the next `latestOffset(start)`. At most one is in flight; its error fails the
query at the next planning call. So the messages of the last batch leave the queue shortly
after an availableNow query returns, not before.

Planning methods run in a long-lived Python worker on the driver; it keeps one connection.
`read` runs pickled on executors and opens its own.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from sluicemq.client import Client
from sluicemq.client.ranges import PendingCommit
from sluicemq.spark.options import SourceOptions
from sluicemq.spark.ranges import RangePartition, connect, slices, target
from sluicemq.spark.rows import remove_committed
from sluicemq.spark.waiting import DestinationWatch


class SluiceStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._client: Client | None = None
        self._until: int | None = None  # Trigger.AvailableNow: the head when it started
        self._committed = -1  # the ledger position we last moved the broker to
        self._pending: PendingCommit | None = None  # that move, if not yet answered
        self._watch = DestinationWatch(opts.destination)  # logs a missing queue

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None  # executors open their own connections
        state["_pending"] = None
        return state

    def _broker(self) -> Client:
        if self._client is None or not self._client.is_open:
            self._client = connect(self.opts.connection,
                                   client_id=self.opts.connection.client_id)
            if self.opts.subscription:
                self._ensure_subscription(self._client)
        return self._client

    def _ensure_subscription(self, client: Client) -> None:
        """A durable subscription retains messages only once it exists: create it (or keep
        the existing one) before the first offset is taken."""
        sub = client.subscribe(self.opts.destination, durable_name=self.opts.subscription,
                               selector=self.opts.selector, prefetch=1, ack="client-individual")
        sub.unsubscribe(durable=False)

    def initialOffset(self) -> dict:
        opts = self.opts
        head = self._broker().head(opts.destination, ledger=opts.ledger, **target(opts))
        self._watch.observe(head.exists)
        start = head.first if opts.starting == "earliest" else head.next
        if head.committed is not None:
            start = max(start, head.committed)
        return {"seq": start}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_per_batch:
            return ReadMaxRows(self.opts.max_per_batch)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._until = self._broker().head(self.opts.destination, **target(self.opts)).next

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        opts = self.opts
        first = int(start["seq"])
        self._settle(wait=False)
        if first > self._committed:
            self._commit(first)
        most = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        head = self._broker().head(opts.destination, start=first, end=self._until,
                                   max_messages=most, **target(opts))
        self._watch.observe(head.exists)
        if head.count == 0:
            return start  # nothing new: Spark plans no batch
        return {"seq": head.end}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return slices(self._broker(), self.opts, int(start["seq"]), int(end["seq"]))

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        from sluicemq.spark.slice_read import read_rows  # Arrow: only where tasks run

        assert isinstance(partition, RangePartition)
        yield from read_rows(self.opts, partition, ledger=self.opts.ledger)

    def commit(self, end: dict) -> None:
        upto = int(end["seq"])
        if upto > self._committed:
            self._commit(upto)

    def _commit(self, upto: int) -> None:
        """Send the commit of everything below ``upto`` (see the module doc)."""
        self._settle(wait=True)
        opts = self.opts
        self._pending = self._broker().send_commit(opts.destination, upto, ledger=opts.ledger,
                                                   **target(opts))
        self._committed = upto
        if opts.delete_committed and opts.path:  # landed files of committed batches go too
            remove_committed(opts.path, upto)

    def _settle(self, *, wait: bool) -> None:
        """Raise the error of the commit in flight once it is answered (``wait``: now)."""
        pending = self._pending
        if pending is not None and (wait or pending.done()):
            self._pending = None
            pending.result()

    def stop(self) -> None:
        if self._client is not None:
            self._client.disconnect()
            self._client = None
