"""The blocking client: a `Connection` (client/sync_conn.py) plus what is built on its frames -
large streams and files, range reads and ledgers, staged publishing."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from sluicemq.client import files
from sluicemq.client.files import Progress
from sluicemq.client.ranges import (
    PendingCommit,
    RangeHead,
    RangeRead,
    open_range,
    range_headers,
    send_range,
)
from sluicemq.client.staging import PublishResult, StagedPart, abort_stage, publish_stage
from sluicemq.client.streams import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_WINDOW,
    StreamSubscription,
    StreamWriter,
)
from sluicemq.client.sync_conn import Connection
from sluicemq.client.sync_handles import Receipt, Subscription, Transaction

__all__ = ["Client", "Receipt", "Subscription", "Transaction"]


class Client(Connection):
    """A blocking STOMP client that connects on construction; safe to share between threads.

    A daemon reader thread routes MESSAGE/RECEIPT/ERROR frames and keeps heart-beats going;
    with a ``failover:(...)`` URL it moves to the next broker when the connection is lost.
    """

    def __enter__(self) -> Client:
        return self

    def stage(self, sink: str, batch: str | int, part: str | int) -> StagedPart:
        """Park a part of a batch (docs/replay-protocol.md, section 3): `with` it and `send`;
        a clean exit commits it, durable and invisible, until `publish_stage`."""
        return StagedPart(self, sink, batch, part)

    def publish_stage(self, sink: str, batch: str | int, parts: list[str] | tuple[str, ...],
                      token: str | None = None) -> PublishResult:
        """Make exactly these parts of the batch visible, atomically and once; returns
        ("published" | "duplicate", messages) with `.token`: for a duplicate, the token the
        batch was first published with. A part the broker lacks raises ClientError and
        nothing is published."""
        return publish_stage(self, sink, batch, parts, token)

    def abort_stage(self, sink: str, batch: str | int) -> int:
        """Discard the batch's parked parts; returns how many there were."""
        return abort_stage(self, sink, batch)

    # Range reads, head queries and ledgers: docs/replay-protocol.md, sections 1, 2 and 5.
    # `subscription` (+ `client_id`, default this connection's) names a durable subscription.
    def head(self, destination: str, start: int | None = None, end: int | None = None,
             max_messages: int | None = None, splits: int = 0, ledger: str | None = None,
             subscription: str | None = None, client_id: str | None = None,
             streams: bool = False) -> RangeHead:
        """Where ``destination`` stands: lowest retained seq, head, and the count (and
        ``splits`` cut points) of ``[start, end or head)``; reads no message."""
        headers = range_headers(start=start, end=end, max_messages=max_messages,
                                head_only=True, splits=splits, ledger=ledger,
                                subscription=subscription, client_id=client_id,
                                streams=streams)
        with open_range(self, destination, headers) as reader:
            return reader.result()

    def read_range(self, destination: str, start: int | None = None, end: int | None = None,
                   ledger: str | None = None, subscription: str | None = None,
                   client_id: str | None = None, max_messages: int | None = None,
                   streams: bool = False, batch_bytes: int | None = None,
                   selector: str | None = None) -> RangeRead:
        """Iterate the retained messages with seq in ``[start, end)`` in seq order, without
        consuming them; ``.head`` holds the end frame's facts after the last one. An ERROR
        (such as a range a ledger already committed) raises ClientError here.

        With ``batch_bytes`` the broker packs messages many to a frame (column batches of
        about that size, docs/replay-protocol.md section 2b): iterate ``.batches()``. With a
        ``selector`` (JMS syntax, as for a subscription) the broker sends only the messages it
        matches; the end frame's count is of those."""
        headers = range_headers(start=start, end=end, max_messages=max_messages,
                                ledger=ledger, subscription=subscription, client_id=client_id,
                                streams=streams, batch_bytes=batch_bytes, selector=selector)
        return open_range(self, destination, headers)

    def commit_upto(self, destination: str, upto: int, ledger: str,
                    subscription: str | None = None, client_id: str | None = None,
                    start: int | None = None, streams: bool = False) -> RangeHead:
        """Remove every retained message below ``upto`` (only ``[start, upto)`` with
        ``start``, and then the ledger stays) as if consumed, and move the ledger to
        ``upto``; returns once both are durable."""
        return self.send_commit(destination, upto, ledger, subscription, client_id, start,
                                streams).result()

    def send_commit(self, destination: str, upto: int, ledger: str,
                    subscription: str | None = None, client_id: str | None = None,
                    start: int | None = None, streams: bool = False) -> PendingCommit:
        """``commit_upto`` without waiting for it: the broker carries out a commit it
        received even if this connection ends; ``.result()`` waits (and raises its error)."""
        headers = range_headers(start=start, ledger=ledger, commit_upto=upto,
                                subscription=subscription, client_id=client_id,
                                streams=streams)
        return PendingCommit(self, *send_range(self, destination, headers))

    def stream_writer(self, destination: str, name: str = "", *,
                      chunk_size: int = DEFAULT_CHUNK_SIZE, window: int = DEFAULT_WINDOW,
                      headers: Mapping[str, str] | None = None, stream_id: str | None = None,
                      resume: bool = False, wait_for_consumer: float | None = None,
                      ) -> StreamWriter:
        """A writable file whose bytes become one stream; see `StreamWriter`."""
        return StreamWriter(self, destination, name=name, chunk_size=chunk_size, window=window,
                            headers=headers, stream_id=stream_id, resume=resume,
                            wait_for_consumer=wait_for_consumer)

    def streams(self, destination: str, *, window: int = DEFAULT_WINDOW,
                timeout: float | None = None, count: int | None = None) -> StreamSubscription:
        """Subscribe for streams; iterate the result for one `StreamReader` per stream (with
        `count`, that many at most: the broker then sends no chunk of the stream after)."""
        return StreamSubscription(self, destination, window=window, timeout=timeout,
                                  count=count)

    def send_file(self, destination: str, path: str | os.PathLike[str], *,
                  chunk_size: int = DEFAULT_CHUNK_SIZE, window: int = DEFAULT_WINDOW,
                  resume: bool = True, again: bool = False,
                  progress: Progress | None = None,
                  headers: Mapping[str, str] | None = None,
                  wait_for_consumer: float | None = None) -> StreamWriter:
        """Send a file as a stream, resuming an interrupted earlier send of the same file;
        one already sent to `destination` is sent again only with `again`
        (`writer.already_complete` says it was not)."""
        return files.send_file(self, destination, path, chunk_size=chunk_size, window=window,
                               resume=resume, again=again, progress=progress,
                               headers=headers, wait_for_consumer=wait_for_consumer)

    def receive_file(self, destination: str, directory: str | os.PathLike[str], *,
                     window: int = DEFAULT_WINDOW, timeout: float | None = None,
                     progress: Progress | None = None) -> Path:
        """Receive the next stream into `directory` (verified, then renamed); its path."""
        return files.receive_file(self, destination, directory, window=window,
                                  timeout=timeout, progress=progress)

