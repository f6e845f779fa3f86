"""Sorting a consumer's chunk deliveries by stream, sans-IO; shared by both clients.

With `sluice-max-streams:1` the broker sends one stream at a time, but a reader must not
trust that blindly: chunks of another stream that arrive while one is being read are held
back (bounded by the prefetch window, beyond which the broker is plainly not honouring the
limit), chunks of streams the reader refused are sent back, and late copies of streams it
finished are acknowledged and dropped. A reader that wants ``count`` streams says so
(`sluice-stream-credit`), so the broker hands it no chunk of a stream after the last.
"""

from __future__ import annotations

import enum
from collections import deque
from typing import Generic, TypeVar

from sluicemq.errors import ClientError
from sluicemq.streaming import manifest as wire
from sluicemq.streaming.errors import StreamAbandonedError, StreamProtocolError
from sluicemq.streaming.manifest import ChunkInfo

M = TypeVar("M")


class Route(enum.Enum):
    READ = "read"  # belongs to the stream being read (or starts the next one)
    HELD = "held"  # another stream's chunk, kept for later
    REFUSE = "refuse"  # a stream this reader gave up on: NACK it
    DROP = "drop"  # a late copy of a finished stream: ACK it, pass nothing on


class StreamDemux(Generic[M]):
    """Where each arriving chunk goes, given which stream (if any) is being read."""

    def __init__(self, limit: int, count: int | None = None) -> None:
        if count is not None and count < 1:
            raise ValueError("count must be at least 1")
        self.limit = limit
        self.count = count  # streams wanted in all (None: no end)
        self.started = 0
        self.reading: str | None = None
        self._held: deque[tuple[ChunkInfo, M]] = deque()
        self._refused: set[str] = set()
        self._finished: set[str] = set()

    def subscribe_headers(self) -> dict[str, str]:
        """One stream at a time, and with a ``count`` that many in all: otherwise the chunks
        of the next stream that fill the window as the last one ends would be taken unread
        (and delivered again to the next reader)."""
        headers = {wire.MAX_STREAMS: "1"}
        if self.count is not None:
            headers[wire.STREAM_CREDIT] = str(self.count)
        return headers

    @property
    def satisfied(self) -> bool:
        """``count`` streams were handed out: no more come."""
        return self.count is not None and self.started >= self.count

    def start(self, stream_id: str) -> None:
        self.reading = stream_id
        self.started += 1

    def finish(self, stream_id: str, *, complete: bool) -> None:
        """The reader closed the stream: fully read (`complete`) or given up on."""
        (self._finished if complete else self._refused).add(stream_id)
        if self.reading == stream_id:
            self.reading = None

    def sort(self, info: ChunkInfo, message: M) -> Route:
        """Route one arriving chunk; a HELD chunk is kept here until `take()` asks for it."""
        sid = info.stream_id
        if sid in self._refused:
            return Route.REFUSE
        if sid in self._finished:
            return Route.DROP
        if self.reading is None or sid == self.reading:
            return Route.READ
        if len(self._held) >= self.limit:
            raise StreamProtocolError(
                f"chunks of stream {sid} keep arriving while {self.reading} is being read: the "
                "broker is interleaving streams (does it honour sluice-max-streams:1?)")
        self._held.append((info, message))
        return Route.HELD

    @property
    def finished_any(self) -> bool:
        """At least one stream was read to its end (a failover may bring copies of it back)."""
        return bool(self._finished)

    def late_copy(self, info: ChunkInfo) -> bool:
        """Is this a chunk of a stream the reader finished (to acknowledge, not to read)?"""
        return info.stream_id in self._finished

    def take(self) -> tuple[ChunkInfo, M] | None:
        """The oldest held chunk that belongs to the stream being read (or, between
        streams, the oldest of any stream), or None."""
        for index, (info, message) in enumerate(self._held):
            if self.reading is None or info.stream_id == self.reading:
                del self._held[index]
                return info, message
        return None

    def abandon(self, stream_id: str) -> list[M]:
        """The broker gave up on a stream: forget it and return its held chunks."""
        dropped = [m for info, m in self._held if info.stream_id == stream_id]
        self._held = deque(item for item in self._held if item[0].stream_id != stream_id)
        self._refused.add(stream_id)
        return dropped

    def broker_error(self, exc: ClientError, reading: str | None) -> None:
        """An ERROR reached the subscription: re-raise it unless it abandons a stream; raise
        StreamAbandonedError when that stream is the one being read, else forget that stream."""
        abandoned = wire.abandoned_stream(exc.headers)
        if abandoned is None:
            raise exc
        if abandoned == reading:
            raise StreamAbandonedError(str(exc), exc.headers, exc.body) from None
        self.abandon(abandoned)
