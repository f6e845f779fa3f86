"""The asyncio client: an `AsyncConnection` (client/aio_conn.py) plus what is built on its
frames - range reads and ledgers, large streams and files, staged publishing."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from sluicemq.client import aio_staging, aio_streams
from sluicemq.client.aio_conn import AsyncConnection
from sluicemq.client.aio_failover import READ_CHUNK
from sluicemq.client.aio_handles import AsyncReceipt, AsyncSubscription, AsyncTransaction
from sluicemq.client.aio_ranges import AsyncRangeRead, open_range
from sluicemq.client.aio_staging import AsyncStagedPart
from sluicemq.client.aio_streams import AsyncStreamSubscription, AsyncStreamWriter
from sluicemq.client.files import Progress
from sluicemq.client.ranges import RangeHead, range_headers
from sluicemq.client.staging import PublishResult
from sluicemq.client.streams import DEFAULT_CHUNK_SIZE, DEFAULT_WINDOW

__all__ = ["READ_CHUNK", "AsyncClient", "AsyncReceipt", "AsyncStagedPart", "AsyncSubscription",
           "AsyncTransaction"]


class AsyncClient(AsyncConnection):
    """An asyncio STOMP client; create it with `await AsyncClient.connect(url, ...)`."""

    # Staged publishing (docs/replay-protocol.md, section 3): the blocking client's API, awaited.
    def stage(self, sink: str, batch: str | int, part: str | int) -> AsyncStagedPart:
        """A part of a batch: `async with` it and `await part.send(...)`; a clean exit
        commits it, durable and invisible, until `publish_stage`."""
        return AsyncStagedPart(self, sink, batch, part)

    async def publish_stage(self, sink: str, batch: str | int,
                            parts: list[str] | tuple[str, ...],
                            token: str | None = None) -> PublishResult:
        """Make exactly these parts of the batch visible, atomically and once; returns
        ("published" | "duplicate", messages) with `.token`: for a duplicate, the token the
        batch was first published with. A part the broker lacks raises ClientError and
        nothing is published."""
        return await aio_staging.publish_stage(self, sink, batch, parts, token)

    async def abort_stage(self, sink: str, batch: str | int) -> int:
        """Discard the batch's parked parts; returns how many there were."""
        return await aio_staging.abort_stage(self, sink, batch)

    # Range reads, head queries and ledgers (docs/replay-protocol.md, sections 1, 2 and 5):
    # the blocking client's API, awaited.
    async def head(self, destination: str, start: int | None = None, end: int | None = None,
                   max_messages: int | None = None, splits: int = 0,
                   ledger: str | None = None, subscription: str | None = None,
                   client_id: str | None = None, streams: bool = False) -> RangeHead:
        headers = range_headers(start=start, end=end, max_messages=max_messages,
                                head_only=True, splits=splits, ledger=ledger,
                                subscription=subscription, client_id=client_id,
                                streams=streams)
        async with await open_range(self, destination, headers) as reader:
            return await reader.result()

    async def read_range(self, destination: str, start: int | None = None,
                         end: int | None = None, ledger: str | None = None,
                         subscription: str | None = None, client_id: str | None = None,
                         max_messages: int | None = None, streams: bool = False,
                         batch_bytes: int | None = None,
                         selector: str | None = None) -> AsyncRangeRead:
        """The retained messages of ``[start, end)`` in seq order (``async for``); with
        ``batch_bytes``, column batches of about that size (iterate ``.batches()``); with a
        ``selector``, only the messages it matches."""
        headers = range_headers(start=start, end=end, max_messages=max_messages,
                                ledger=ledger, subscription=subscription, client_id=client_id,
                                streams=streams, batch_bytes=batch_bytes, selector=selector)
        return await open_range(self, destination, headers)

    async def commit_upto(self, destination: str, upto: int, ledger: str,
                          subscription: str | None = None, client_id: str | None = None,
                          start: int | None = None, streams: bool = False) -> RangeHead:
        headers = range_headers(start=start, ledger=ledger, commit_upto=upto,
                                subscription=subscription, client_id=client_id,
                                streams=streams)
        async with await open_range(self, destination, headers) as reader:
            return await reader.result()

    def stream_writer(self, destination: str, name: str = "", *,
                      chunk_size: int = DEFAULT_CHUNK_SIZE, window: int = DEFAULT_WINDOW,
                      headers: Mapping[str, str] | None = None, stream_id: str | None = None,
                      resume: bool = False, wait_for_consumer: float | None = None,
                      ) -> AsyncStreamWriter:
        """A stream writer; use `async with` (it asks the broker to resume on entry)."""
        return AsyncStreamWriter(self, destination, name=name, chunk_size=chunk_size,
                                 window=window, headers=headers, stream_id=stream_id,
                                 resume=resume, wait_for_consumer=wait_for_consumer)

    def streams(self, destination: str, *, window: int = DEFAULT_WINDOW,
                timeout: float | None = None,
                count: int | None = None) -> AsyncStreamSubscription:
        """Streams on `destination`: `async for` them, one `AsyncStreamReader` each (with
        `count`, that many at most: the broker then sends no chunk of the stream after)."""
        return AsyncStreamSubscription(self, destination, window=window, timeout=timeout,
                                       count=count)

    async def send_file(self, destination: str, path: str | os.PathLike[str], *,
                        chunk_size: int = DEFAULT_CHUNK_SIZE, window: int = DEFAULT_WINDOW,
                        resume: bool = True, again: bool = False,
                        progress: Progress | None = None,
                        headers: Mapping[str, str] | None = None,
                        wait_for_consumer: float | None = None) -> AsyncStreamWriter:
        """Send a file as a stream, resuming an interrupted earlier send of the same file;
        one already sent to `destination` is sent again only with `again`."""
        return await aio_streams.send_file(
            self, destination, path, chunk_size=chunk_size, window=window, resume=resume,
            again=again, progress=progress, headers=headers,
            wait_for_consumer=wait_for_consumer)

    async def receive_file(self, destination: str, directory: str | os.PathLike[str], *,
                           window: int = DEFAULT_WINDOW, timeout: float | None = None,
                           progress: Progress | None = None) -> Path:
        """Receive the next stream into `directory` (verified, then renamed); its path."""
        return await aio_streams.receive_file(self, destination, directory, window=window,
                                              timeout=timeout, progress=progress)

