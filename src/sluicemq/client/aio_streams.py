"""Large streams over `AsyncClient`: the same writer, reader and file helpers as
`sluicemq.client.streams` / `files`, with awaited I/O (same names, same ACK rules).

File reads and writes run in a worker thread so a slow disk never stalls the event loop
(and with it heart-beats and other subscriptions).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sluicemq.client.cursor import ChunkCursor, StreamFacts
from sluicemq.client.demux import Route, StreamDemux
from sluicemq.client.files import Landing, Progress, expected_total, file_identity, takes_copy
from sluicemq.client.message import AsyncMessage
from sluicemq.client.streams import DEFAULT_CHUNK_SIZE, DEFAULT_WINDOW, chunk_error
from sluicemq.errors import ClientError
from sluicemq.streaming import manifest as wire
from sluicemq.streaming.chunker import Chunk, Chunker
from sluicemq.streaming.errors import (
    NoConsumerError,
    StreamIntegrityError,
)
from sluicemq.streaming.manifest import ChunkInfo, ResumePoint

if TYPE_CHECKING:
    from sluicemq.client.aio_conn import AsyncConnection
    from sluicemq.client.aio_handles import AsyncSubscription


class AsyncStreamWriter:
    """`async with client.stream_writer(...) as w: await w.write(data)`; see StreamWriter."""

    def __init__(self, client: AsyncConnection, destination: str, *, name: str = "",
                 chunk_size: int = DEFAULT_CHUNK_SIZE, window: int = DEFAULT_WINDOW,
                 headers: Mapping[str, str] | None = None, stream_id: str | None = None,
                 resume: bool = False, wait_for_consumer: float | None = None) -> None:
        if window < 1 or chunk_size < 1:
            raise ValueError("window and chunk_size must be at least 1")
        if resume and stream_id is None:
            raise ValueError("resume=True needs the stream_id of the stream to resume")
        self.client = client
        self.destination = destination
        self.name = name
        self.stream_id = stream_id or uuid.uuid4().hex
        self.window = window
        self.chunk_size = chunk_size
        self.resume = resume
        self.wait_for_consumer = wait_for_consumer
        self.duplicates = 0
        self.resume_point: ResumePoint | None = None
        self.already_complete = False
        self.resumed_at = 0
        self.closed = False
        self._headers = {**wire.check_user_headers(headers), "content-type": wire.CONTENT_TYPE}
        self._inflight: deque[asyncio.Future[dict[str, str]]] = deque()
        self._chunker: Chunker | None = None

    async def open(self) -> AsyncStreamWriter:
        """Ask the broker where to resume (and wait for a consumer) if asked to; idempotent."""
        if self._chunker is not None:
            return self
        if self.resume or self.wait_for_consumer is not None:
            self.resume_point = await self._query()
        point = self.resume_point if self.resume else None
        self.already_complete = point is not None and point.complete
        self.resumed_at = point.next_offset if point is not None else 0
        self._chunker = Chunker(self.stream_id, self.name, self.chunk_size,
                                skip=self.resumed_at, first_seq=point.next_seq if point else 0)
        return self

    @property
    def bytes_written(self) -> int:
        return self._chunker.bytes_in if self._chunker is not None else 0

    async def write(self, data: Any) -> int:
        """Take bytes; waits while `window` chunks are awaiting their receipt."""
        if self.closed:
            raise ValueError("write to a closed stream")
        chunker = (await self.open())._chunker
        assert chunker is not None
        view = memoryview(data).cast("B")
        if self.already_complete:
            chunker.bytes_in += len(view)
            return len(view)
        for start in range(0, len(view), self.chunk_size):
            for chunk in chunker.feed(view[start:start + self.chunk_size]):
                await self._send(chunk)
        return len(view)

    async def close(self) -> None:
        """Send the final chunk and wait for every receipt."""
        if self.closed:
            return
        chunker = (await self.open())._chunker
        assert chunker is not None
        self.closed = True
        if not self.already_complete:
            await self._send(chunker.finish())
            while self._inflight:
                await self._settle(self._inflight.popleft())

    def abort(self) -> None:
        """Stop without a final chunk: the stream stays open on the broker (resumable)."""
        self.closed = True
        self._inflight.clear()

    async def __aenter__(self) -> AsyncStreamWriter:
        return await self.open()

    async def __aexit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if exc_type is None:
            await self.close()
        else:
            self.abort()

    async def _query(self) -> ResumePoint:
        headers = {wire.QUERY: self.stream_id}
        timeout = self.client.timeout
        wait = self.wait_for_consumer
        if wait is not None:
            headers[wire.WAIT_CONSUMER] = f"{wait:g}"
            timeout += wait
        future = self.client.send_async(self.destination, b"", headers)
        point = wire.parse_resume(await self.client._settle(future, timeout))
        if wait is not None and point.consumers == 0:
            raise NoConsumerError(f"no consumer subscribed to {self.destination} within "
                                  f"{wait:g}s")
        return point

    async def _send(self, chunk: Chunk) -> None:
        while len(self._inflight) >= self.window:
            await self._settle(self._inflight.popleft())
        headers = {**self._headers, **chunk.info.headers()}
        self._inflight.append(self.client.send_async(self.destination, chunk.body, headers))
        await self.client.drain()

    async def _settle(self, future: asyncio.Future[dict[str, str]]) -> None:
        try:
            answer = await self.client._settle(future)
        except ClientError as exc:
            raise chunk_error(exc, self.stream_id) from exc
        if answer.get(wire.DUPLICATE) == "true":
            self.duplicates += 1


class AsyncStreamReader(StreamFacts):
    """One delivered stream; `await read(n)` inside `async with`; see StreamReader."""

    def __init__(self, source: AsyncStreamSubscription, info: ChunkInfo,
                 first: AsyncMessage) -> None:
        self.id = info.stream_id
        self.name = info.name
        self.headers = first.headers
        self.offset = info.offset
        self.closed = False
        self._source = source
        self._cursor: ChunkCursor[AsyncMessage] = ChunkCursor(info, first)

    async def read(self, size: int = -1) -> bytes:
        if self.closed:
            raise ValueError("read from a closed stream")
        if size < 0:
            parts = []
            while data := await self.read(DEFAULT_CHUNK_SIZE):
                parts.append(data)
            return b"".join(parts)
        cursor = self._cursor
        for message in cursor.due_acks():
            await message.ack()
        while cursor.needs_chunk():
            info, message = cursor.take_first() or await self._source._next_chunk(self.id)
            duplicate = cursor.place(info, message)
            if duplicate is not None:
                await duplicate.ack()
        return cursor.hand_out(size)

    async def close(self, *, clean: bool = True) -> None:
        """Acknowledge what was handed on; NACK the rest (everything, if not `clean`)."""
        if self.closed:
            return
        self.closed = True
        complete = clean and self._cursor.exhausted
        acks, nacks = self._cursor.settle(clean=clean)
        try:
            for i, message in enumerate(acks):
                # As in the blocking reader: the last ACK of a complete stream is confirmed.
                await message.ack(receipt=complete and i == len(acks) - 1)
            for message in nacks:
                await message.nack()
        except ClientError:
            if self._source.client.is_open:
                raise
        finally:
            self._source._demux.finish(self.id, complete=complete)

    async def __aenter__(self) -> AsyncStreamReader:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        await self.close(clean=exc_type is None)


class AsyncStreamSubscription:
    """Streams on one destination: `async with client.streams(d) as s: async for stream in s`.

    Subscribes on entry (or on the first iteration); see StreamSubscription for semantics.
    """

    def __init__(self, client: AsyncConnection, destination: str, *, window: int = DEFAULT_WINDOW,
                 timeout: float | None = None, count: int | None = None) -> None:
        if window < 1:
            raise ValueError("window must be at least 1")
        self.client = client
        self.destination = destination
        self.window = window
        self.timeout = timeout
        self._demux: StreamDemux[AsyncMessage] = StreamDemux(window, count)
        self._current: AsyncStreamReader | None = None
        self._sub: AsyncSubscription | None = None
        self._epoch = 0  # the connection subscribed on; another one at close: a failover

    async def open(self) -> AsyncStreamSubscription:
        if self._sub is None:
            self._sub = await self.client.subscribe(
                self.destination, ack="client-individual", prefetch=self.window,
                headers=self._demux.subscribe_headers())
            self._epoch = self.client._track.epoch
        return self

    def __aiter__(self) -> AsyncStreamSubscription:
        return self

    async def __anext__(self) -> AsyncStreamReader:
        await self.open()
        if self._current is not None:
            await self._current.close()
            self._current = None
        if self._demux.satisfied:
            raise StopAsyncIteration
        found = await self._arrival(None)
        if found is None:
            raise StopAsyncIteration
        info, message = found
        self._demux.start(info.stream_id)
        self._current = AsyncStreamReader(self, info, message)
        return self._current

    async def close(self) -> None:
        try:
            if self._current is not None:
                await self._current.close()
        finally:
            if self._sub is not None and self.client.is_open:
                try:
                    await self._settle_late_copies(self._sub)
                finally:
                    await self._sub.unsubscribe()

    async def _settle_late_copies(self, sub: AsyncSubscription) -> None:
        """Acknowledge the copies a new master redelivered of streams read here to the end,
        before the UNSUBSCRIBE gives them back unread (see StreamSubscription)."""
        if self.client._track.epoch == self._epoch or not self._demux.finished_any:
            return
        try:
            barrier = await self.client.transaction().begin()  # they came before its RECEIPT
            await barrier.abort()
            while (message := await sub.get(0)) is not None:
                if self._demux.late_copy(wire.parse_chunk(message.headers)):
                    await message.ack()
        except ClientError:
            return  # lost again, or an ERROR: what is left goes back to the broker, as before

    async def __aenter__(self) -> AsyncStreamSubscription:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _next_chunk(self, stream_id: str) -> tuple[ChunkInfo, AsyncMessage]:
        found = await self._arrival(stream_id)
        if found is None:
            raise ClientError(f"stream {stream_id} stalled: no chunk within {self.timeout}s")
        return found

    async def _arrival(self, stream_id: str | None) -> tuple[ChunkInfo, AsyncMessage] | None:
        assert self._sub is not None
        while True:
            held = self._demux.take()
            if held is not None:
                return held
            try:
                message = await self._sub.get(self.timeout)
            except ClientError as exc:
                self._demux.broker_error(exc, stream_id)
                continue
            if message is None:
                return None
            info = wire.parse_chunk(message.headers)
            route = self._demux.sort(info, message)
            if route is Route.READ:
                return info, message
            if route is Route.REFUSE:
                await message.nack()
            elif route is Route.DROP:
                await message.ack()


async def send_file(client: AsyncConnection, destination: str, path: str | os.PathLike[str], *,
                    chunk_size: int = DEFAULT_CHUNK_SIZE, window: int = DEFAULT_WINDOW,
                    resume: bool = True, again: bool = False, progress: Progress | None = None,
                    headers: Mapping[str, str] | None = None,
                    wait_for_consumer: float | None = None) -> AsyncStreamWriter:
    """Send one file as a stream (resuming an earlier interrupted send of it); see
    `files.send_file` for `again`, `resume` and `already_complete`."""
    copy = 0
    while True:
        absolute, stream_id, size = file_identity(path, destination, copy)
        future = client.send_async(destination, b"", {wire.QUERY: stream_id})
        point = wire.parse_resume(await client._settle(future, client.timeout))
        if takes_copy(point, again=again, resume=resume):
            break
        copy += 1
    writer = AsyncStreamWriter(
        client, destination, name=absolute.name, chunk_size=chunk_size, window=window,
        headers={wire.FILE_SIZE: str(size), **(headers or {})}, stream_id=stream_id,
        resume=point.state != "unknown", wait_for_consumer=wait_for_consumer)
    with open(absolute, "rb") as src:
        async with writer:
            while not writer.already_complete and (
                    block := await asyncio.to_thread(src.read, chunk_size)):
                await writer.write(block)
                if progress is not None:
                    progress(writer.bytes_written, size)
    if progress is not None:
        progress(writer.bytes_written, writer.bytes_written)
    return writer


async def save_stream(stream: AsyncStreamReader, directory: str | os.PathLike[str],
                      progress: Progress | None = None) -> Path:
    """Write one delivered stream into `directory`; see `files.save_stream`."""
    landing = Landing(directory, stream.id, stream.name)
    async with stream:
        f, prefix = await asyncio.to_thread(landing.open, stream.offset)
        try:
            if prefix is not None:
                stream.seed(prefix, stream.offset)
            done = stream.offset
            while data := await stream.read(DEFAULT_CHUNK_SIZE):
                await asyncio.to_thread(_write_through, f, data)
                done += len(data)
                if progress is not None:
                    progress(done, expected_total(stream.size, stream.headers))
            if not stream.verified:
                raise StreamIntegrityError(f"stream {stream.id} could not be verified")
            final = await asyncio.to_thread(landing.commit, f)
        finally:
            f.close()
    landing.settled()
    return final


async def receive_file(client: AsyncConnection, destination: str,
                       directory: str | os.PathLike[str], *, window: int = DEFAULT_WINDOW,
                       timeout: float | None = None, progress: Progress | None = None) -> Path:
    """Receive the next stream on `destination` into `directory`; returns its path."""
    async with AsyncStreamSubscription(client, destination, window=window, timeout=timeout,
                                       count=1) as streams:
        async for stream in streams:
            return await save_stream(stream, directory, progress)
    raise ClientError(f"no stream arrived on {destination} within {timeout}s")


def _write_through(f: Any, data: bytes) -> None:
    f.write(data)
    f.flush()
