"""Large streams: a file sent as numbered chunk messages, handled by the broker as one unit.

The chunks are ordinary persistent messages (``JMSXGroupID`` = stream id), so queues, acks and
the journal treat them like any other message. What this module adds is the stream's state:
which sequence number comes next (duplicates are stored once, gaps refused), whether the
producer finished or went silent (abandonment after ``stream-timeout``), and the per-destination
policies for a consumer that dies (``resume`` / ``restart`` / ``discard``) and for dispatch
before the stream is complete (``progressive`` / ``complete``).

Header names are the wire contract, shared with the client library (``sluice-stream-*``).

A stream is known by its destination and its id (``StreamKey``), never by the id alone: chunks
sent to another destination under the same id start a stream of their own there, so nobody can
query or pre-empt a stream through a queue they happen to be allowed to write. With security
on, a stream also belongs to the user who sent its first chunk.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from sluicemq.core.routing.message import Message
from sluicemq.protocol.numbers import MAX_DIGITS, natural
from sluicemq.storage.store import TicketLike

STREAM_ID = "sluice-stream-id"
SEQ = "sluice-stream-seq"
OFFSET = "sluice-stream-offset"
NAME = "sluice-stream-name"
FINAL = "sluice-stream-final"
SIZE = "sluice-stream-size"
SHA256 = "sluice-stream-sha256"
QUERY = "sluice-stream-query"
WAIT_CONSUMER = "sluice-stream-wait-consumer"
MAX_STREAMS = "sluice-max-streams"
STREAM_CREDIT = "sluice-stream-credit"
RESUMED = "sluice-stream-resumed"
DUPLICATE = "sluice-stream-duplicate"
NEXT_SEQ = "sluice-stream-next-seq"
NEXT_OFFSET = "sluice-stream-next-offset"
STATE = "sluice-stream-state"
CONSUMERS = "sluice-stream-consumers"
GROUP = "JMSXGroupID"  # the stream id again: what keeps a stream on one consumer

RECEIVING, DISPATCHING, COMPLETE, ABANDONED, RESUMED_STATE, DISCARDED = (
    "receiving", "dispatching", "complete", "abandoned", "resumed", "discarded")

RESUME, RESTART, DISCARD = "resume", "restart", "discard"
PROGRESSIVE, COMPLETE_FIRST = "progressive", "complete"


StreamKey = tuple[str, str]  # (routing.keys key "q:NAME" or "t:NAME", stream id)


@dataclass(slots=True)
class StreamState:
    """What the broker knows of one stream; also what the console's streams page shows."""

    id: str
    name: str
    destination: str
    queue_key: str
    next_seq: int = 0
    next_offset: int = 0
    size: int | None = None  # known once the final chunk is stored
    sha256: str | None = None
    received_bytes: int = 0
    delivered_bytes: int = 0
    acked_chunks: int = 0
    chunks: int = 0
    state: str = RECEIVING
    producer: str | None = None
    consumer: str | None = None
    started: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    # `complete` mode: (queue, chunk) not dispatched yet. The queue is routing/queue.py's
    # Queue, held as Any: naming it here would make queue and streams import each other.
    held: list[tuple[Any, Message]] = field(default_factory=list)
    last_ticket: TicketLike | None = None  # pins the journal tail that remembers our progress
    owner: str | None = None  # the user who started it (security on); None: anyone

    @property
    def key(self) -> StreamKey:
        return (self.queue_key, self.id)

    @property
    def final_stored(self) -> bool:
        return self.size is not None

    def as_dict(self) -> dict[str, object]:
        return {"id": self.id, "name": self.name, "destination": self.destination,
                "size": self.size, "received_bytes": self.received_bytes,
                "delivered_bytes": self.delivered_bytes, "chunks": self.chunks,
                "acked_chunks": self.acked_chunks, "state": self.state,
                "producer": self.producer, "consumer": self.consumer,
                "started": self.started, "updated": self.updated}


class ChunkError(ValueError):
    """A chunk the broker refuses (bad or missing stream headers, a gap in sequence)."""

    def __init__(self, message: str, next_seq: int | None = None) -> None:
        super().__init__(message)
        self.next_seq = next_seq


def check_owner(st: StreamState, owner: str | None) -> None:
    """A stream belongs to the user who started it: anyone else is refused, saying why."""
    if st.owner is not None and owner is not None and owner != st.owner:
        raise ChunkError(f"stream {st.id!r} on {st.destination} belongs to another user")


@dataclass(frozen=True, slots=True)
class Chunk:
    """The stream facts of one SEND, parsed and checked once."""

    stream_id: str
    seq: int
    offset: int
    name: str
    final: bool
    size: int | None
    sha256: str | None


def parse_chunk(headers: dict[str, str], body_len: int) -> Chunk:
    """Read the ``sluice-stream-*`` headers of a SEND; ChunkError says what is wrong."""
    sid = headers[STREAM_ID]
    if not sid or len(sid) > 200:
        raise ChunkError("sluice-stream-id must be 1-200 characters")
    seq, offset = natural(headers.get(SEQ)), natural(headers.get(OFFSET, "0"))
    if seq is None or offset is None:
        raise ChunkError("sluice-stream-seq and sluice-stream-offset must be non-negative "
                         f"integers of at most {MAX_DIGITS} digits")
    group = headers.get(GROUP)
    if group is not None and group != sid:
        raise ChunkError(f"{GROUP} must be the stream id ({STREAM_ID}) on a chunk")
    final = headers.get(FINAL) == "true"
    size = None
    sha = None
    if final:
        size = natural(headers.get(SIZE))
        if size is None:
            raise ChunkError("the final chunk needs an integer sluice-stream-size (at most "
                             f"{MAX_DIGITS} digits)")
        if size != offset + body_len:
            raise ChunkError(f"sluice-stream-size {size} does not match the final chunk's "
                             f"offset {offset} + length {body_len}")
        sha = headers.get(SHA256)
    return Chunk(sid, seq, offset, headers.get(NAME, sid), final, size, sha)


def is_chunk(msg: Message) -> bool:
    return STREAM_ID in msg.headers


def is_final(msg: Message) -> bool:
    return msg.headers.get(FINAL) == "true"
