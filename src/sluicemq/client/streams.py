"""Large streams over the blocking `Client`: a writable file that sends chunks, and readable
files that reassemble them.

Flow control on both sides is the broker's own: the writer keeps at most `window` chunks
without a receipt, the reader subscribes with a prefetch of `window` and acknowledges each
chunk once the caller has handed its bytes on. Memory stays at about `window` chunks however
large the stream.

Acknowledgement rule of `StreamReader`: a chunk is ACKed when the caller comes back for more
bytes after reading all of it (it evidently processed them); the final chunk only when the
stream is closed cleanly, so the caller can finish its own work (fsync, rename) before the
broker forgets the stream. Leaving the `with` block early or on an exception NACKs every chunk
not yet acknowledged, and this reader refuses the rest of that stream, so the broker can
give it (resumed at the first unacknowledged chunk) to another consumer.
"""

from __future__ import annotations

import io
import uuid
from collections import deque
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from sluicemq.client.cursor import ChunkCursor, StreamFacts
from sluicemq.client.demux import Route, StreamDemux
from sluicemq.client.message import Message
from sluicemq.errors import ClientError
from sluicemq.protocol.numbers import natural
from sluicemq.streaming import manifest as wire
from sluicemq.streaming.chunker import Chunk, Chunker
from sluicemq.streaming.errors import (
    NoConsumerError,
    StreamGapError,
)
from sluicemq.streaming.manifest import ChunkInfo, ResumePoint

if TYPE_CHECKING:
    from sluicemq.client.sync_conn import Connection
    from sluicemq.client.sync_handles import Receipt, Subscription

DEFAULT_CHUNK_SIZE = 1 << 20
DEFAULT_WINDOW = 8


class StreamWriter(io.RawIOBase):
    """A writable binary file whose bytes become one stream on `destination`.

    `close()` (or leaving the `with` block normally) sends the final chunk and returns once
    the broker confirmed it; leaving on an exception sends no final chunk, so the stream
    stays open on the broker and a later writer with the same id and `resume=True` can
    finish it.
    """

    def __init__(self, client: Connection, destination: str, *, name: str = "",
                 chunk_size: int = DEFAULT_CHUNK_SIZE, window: int = DEFAULT_WINDOW,
                 headers: Mapping[str, str] | None = None, stream_id: str | None = None,
                 resume: bool = False, wait_for_consumer: float | None = None) -> None:
        super().__init__()
        if window < 1:
            raise ValueError("window must be at least 1")
        if resume and stream_id is None:
            raise ValueError("resume=True needs the stream_id of the stream to resume")
        self.client = client
        self.destination = destination
        self.stream_id = stream_id or uuid.uuid4().hex
        self.window = window
        self.duplicates = 0  # chunks the broker already had (re-sent after a reconnect)
        self.resume_point: ResumePoint | None = None
        self._headers = {**wire.check_user_headers(headers),
                         "content-type": wire.CONTENT_TYPE}
        self._inflight: deque[Receipt] = deque()
        if resume or wait_for_consumer is not None:
            self.resume_point = self._query(wait_for_consumer)
        point = self.resume_point if resume else None
        self.already_complete = point is not None and point.complete
        # Bytes of input the broker already had: hashed again, but not sent again.
        self.resumed_at = point.next_offset if point is not None else 0
        self._chunker = Chunker(
            self.stream_id, name, chunk_size,
            skip=point.next_offset if point else 0, first_seq=point.next_seq if point else 0)

    @property
    def bytes_written(self) -> int:
        """Bytes accepted by `write()`, including a resumed run's skipped prefix."""
        return self._chunker.bytes_in

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        """Take bytes; blocks while `window` chunks are awaiting their receipt."""
        if self.closed:
            raise ValueError("write to a closed stream")
        view = memoryview(data).cast("B")
        if self.already_complete:
            self._chunker.bytes_in += len(view)
            return len(view)
        step = self._chunker.chunk_size
        for start in range(0, len(view), step):  # one chunk at most per feed: bounded memory
            for chunk in self._chunker.feed(view[start:start + step]):
                self._send(chunk)
        return len(view)

    def close(self) -> None:
        """Send the final chunk (size and SHA-256) and wait for every receipt."""
        if self.closed:
            return
        try:
            if not self.already_complete:
                self._send(self._chunker.finish())
                while self._inflight:
                    self._settle(self._inflight.popleft())
        finally:
            super().close()

    def abort(self) -> None:
        """Stop without a final chunk: the stream stays open on the broker (resumable)."""
        self._inflight.clear()
        super().close()

    def __enter__(self) -> StreamWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def _query(self, wait_for_consumer: float | None) -> ResumePoint:
        headers = {wire.QUERY: self.stream_id}
        timeout = self.client.timeout
        if wait_for_consumer is not None:
            headers[wire.WAIT_CONSUMER] = f"{wait_for_consumer:g}"
            timeout += wait_for_consumer
        answer = self.client.send_async(self.destination, b"", headers).result(timeout)
        point = wire.parse_resume(answer)
        if wait_for_consumer is not None and point.consumers == 0:
            raise NoConsumerError(f"no consumer subscribed to {self.destination} within "
                                  f"{wait_for_consumer:g}s")
        return point

    def _send(self, chunk: Chunk) -> None:
        while len(self._inflight) >= self.window:
            self._settle(self._inflight.popleft())
        headers = {**self._headers, **chunk.info.headers()}
        self._inflight.append(self.client.send_async(self.destination, chunk.body, headers))

    def _settle(self, receipt: Receipt) -> None:
        try:
            answer = receipt.result()
        except ClientError as exc:
            raise chunk_error(exc, self.stream_id) from exc
        if answer.get(wire.DUPLICATE) == "true":
            self.duplicates += 1


def chunk_error(exc: ClientError, stream_id: str) -> ClientError:
    """Turn the broker's refusal of a chunk into the stream error it stands for."""
    if not wire.is_gap_error(exc.headers):
        return exc
    return StreamGapError(f"broker refused a chunk of stream {stream_id}: {exc}", exc.headers,
                          exc.body, next_seq=natural(exc.headers.get(wire.NEXT_SEQ)))


class StreamReader(StreamFacts, io.RawIOBase):
    """One delivered stream as a readable binary file (see the module doc for ACK rules).

    `offset` is where this delivery starts: 0, or more when the stream was resumed here after
    another consumer died. `size` is None until the final chunk was read. The SHA-256 is
    checked when the final chunk is read, before its bytes are returned, if this object saw
    the stream from byte 0 or was `seed()`ed with a hash of the missing prefix.
    """

    def __init__(self, source: StreamSubscription, info: ChunkInfo, first: Message) -> None:
        super().__init__()
        self.id = info.stream_id
        self.name = info.name
        self.headers = first.headers
        self.offset = info.offset
        self.final_ack: Receipt | None = None  # the confirmed ACK of a complete stream
        self._source = source
        self._cursor: ChunkCursor[Message] = ChunkCursor(info, first)

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        if self.closed:
            raise ValueError("read from a closed stream")
        if size is None or size < 0:
            return self.readall()
        cursor = self._cursor
        for message in cursor.due_acks():
            message.ack()
        while cursor.needs_chunk():
            info, message = cursor.take_first() or self._source._next_chunk(self.id)
            duplicate = cursor.place(info, message)
            if duplicate is not None:
                duplicate.ack()
        return cursor.hand_out(size)

    def readall(self) -> bytes:
        parts = []
        while data := self.read(DEFAULT_CHUNK_SIZE):
            parts.append(data)
        return b"".join(parts)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(memoryview(buffer)))
        memoryview(buffer).cast("B")[:len(data)] = data
        return len(data)

    def close(self) -> None:
        """A clean close: acknowledge what was handed on, refuse the rest."""
        self._finish(clean=True)

    def __enter__(self) -> StreamReader:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        self._finish(clean=exc_type is None)

    def _finish(self, *, clean: bool) -> None:
        if self.closed:
            return
        super().close()
        complete = clean and self._cursor.exhausted
        acks, nacks = self._cursor.settle(clean=clean)
        try:
            for i, message in enumerate(acks):
                if complete and i == len(acks) - 1:
                    # Until the broker has journaled this ACK a crash redelivers the tail: the
                    # caller may forget the stream (e.g. its resume marker) only once confirmed.
                    self.final_ack = self._source.client._acknowledge(
                        "ACK", message, None, True, wait=False)
                else:
                    message.ack()
            for message in nacks:
                message.nack()
        except ClientError:
            if self._source.client.is_open:
                raise  # otherwise the broker already redelivers everything unacknowledged
        finally:
            self._source._demux.finish(self.id, complete=complete)


class StreamSubscription:
    """Streams arriving on one destination; iterate to get each as a `StreamReader`.

    Moving to the next stream closes the previous one cleanly. Iteration ends when no chunk
    arrives for `timeout` seconds (None: wait forever) or the subscription ends; a stream
    that stalls for `timeout` mid-way raises ClientError from `read()`.
    """

    def __init__(self, client: Connection, destination: str, *, window: int = DEFAULT_WINDOW,
                 timeout: float | None = None, count: int | None = None) -> None:
        if window < 1:
            raise ValueError("window must be at least 1")
        self.client = client
        self.destination = destination
        self.timeout = timeout
        self._demux: StreamDemux[Message] = StreamDemux(window, count)
        self._current: StreamReader | None = None
        self._sub: Subscription = client.subscribe(
            destination, ack="client-individual", prefetch=window,
            headers=self._demux.subscribe_headers())
        self._epoch = client._track.epoch  # another one at close: a failover came between

    def __iter__(self) -> Iterator[StreamReader]:
        return self

    def __next__(self) -> StreamReader:
        if self._current is not None:
            self._current.close()
            self._current = None
        if self._demux.satisfied:
            raise StopIteration
        found = self._arrival(None)
        if found is None:
            raise StopIteration
        info, message = found
        self._demux.start(info.stream_id)
        self._current = StreamReader(self, info, message)
        return self._current

    def close(self) -> None:
        """Close the current stream (if any) cleanly and unsubscribe."""
        try:
            if self._current is not None:
                self._current.close()
        finally:
            if self.client.is_open:
                try:
                    self._settle_late_copies()
                finally:
                    self._sub.unsubscribe()

    def _settle_late_copies(self) -> None:
        """After a failover the new master redelivers what the old one had not confirmed,
        including chunks of streams read here to the end whose ACKs were in flight. Those are
        acknowledged before the UNSUBSCRIBE, which would give them back unread (the next
        receiver would get a stream this one read): first a round trip, since the broker
        writes the MESSAGEs a replayed SUBSCRIBE made deliverable before a later RECEIPT.
        Chunks of other streams are left to the UNSUBSCRIBE, which gives them back."""
        if self.client._track.epoch == self._epoch or not self._demux.finished_any:
            return
        try:
            self.client.transaction().abort()
            while (message := self._sub.get(0)) is not None:
                if self._demux.late_copy(wire.parse_chunk(message.headers)):
                    message.ack()
        except ClientError:
            return  # lost again, or an ERROR: what is left goes back to the broker, as before

    def __enter__(self) -> StreamSubscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _next_chunk(self, stream_id: str) -> tuple[ChunkInfo, Message]:
        found = self._arrival(stream_id)
        if found is None:
            raise ClientError(f"stream {stream_id} stalled: no chunk within {self.timeout}s")
        return found

    def _arrival(self, stream_id: str | None) -> tuple[ChunkInfo, Message] | None:
        """The next chunk for `stream_id` (None: the first chunk of any new stream), or None
        on timeout or once the subscription has ended."""
        while True:
            held = self._demux.take()
            if held is not None:
                return held
            try:
                message = self._sub.get(self.timeout)
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
                message.nack()
            elif route is Route.DROP:
                message.ack()
