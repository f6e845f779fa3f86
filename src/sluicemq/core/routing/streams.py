"""The broker's large streams: which stream each destination carries, and how far it got.

``core/streams/chunks.py`` holds one stream's state and the chunk headers; this table keeps
every open stream (and recently finished ones, for resume queries), checks each chunk against
its stream, pins the journal record that remembers a stream's progress, holds back chunks
under ``complete`` dispatch, and abandons streams whose producer went silent (their chunks go
to the DLQ). The broker calls in when it routes a chunk and when its queues hand chunks out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from sluicemq.config import Policy
from sluicemq.core.routing import keys
from sluicemq.core.routing.message import Message
from sluicemq.core.routing.queue import Consumer, Queue
from sluicemq.core.routing.topic import Topic
from sluicemq.core.streams.chunks import (
    ABANDONED,
    COMPLETE,
    COMPLETE_FIRST,
    DISCARDED,
    DISPATCHING,
    RESUMED_STATE,
    Chunk,
    ChunkError,
    StreamKey,
    StreamState,
    check_owner,
)
from sluicemq.storage.store import Store, TicketLike

log = logging.getLogger("sluicemq.broker")

FINISHED_KEPT = 1000  # finished streams remembered for late re-sends and resume queries


class StreamHost(Protocol):
    """What the table needs of the broker: its destinations, policies and the DLQ."""

    queues: dict[str, Queue]
    topics: dict[str, Topic]

    def policy(self, kind: str, name: str) -> Policy: ...

    def dead_letter(self, queue: Queue, msg: Message, reason: str = ...) -> None: ...


class StreamTable:
    """Open streams (``open``) and recently finished ones (``finished``), by (key, id)."""

    def __init__(self, host: StreamHost, store: Store, clock: Callable[[], float]) -> None:
        self.host = host
        self.store = store
        self._clock = clock
        self.open: dict[StreamKey, StreamState] = {}
        self.finished: dict[StreamKey, StreamState] = {}

    # -- producers ---------------------------------------------------------------------------
    def accept_chunk(self, kind: str, name: str, chunk: Chunk, body_len: int,
                     peer: str, owner: str | None = None) -> bool:
        """Check a chunk against its stream on ``kind/name``; True to store it, False for a
        duplicate. ``owner``: the sending user with security on (None: security off).

        Raises ChunkError for a gap (the producer must resend from ``next_seq``), a stream
        that was abandoned or discarded, or another user's stream.
        """
        dest = keys.kind_key(kind, name)
        key = (dest, chunk.stream_id)
        st = self.open.get(key)
        if st is None:
            done = self.finished.get(key)
            if done is not None:
                check_owner(done, owner)
                return False  # everything was stored already: a late re-send
            if chunk.seq != 0:
                raise ChunkError(f"stream gap: unknown stream {chunk.stream_id!r} must start at "
                                 f"sequence 0, got {chunk.seq}", next_seq=0)
            st = StreamState(chunk.stream_id, chunk.name, f"/{kind}/{name}", dest, owner=owner)
            self.open[key] = st
        check_owner(st, owner)
        if st.owner is None:  # known from before a restart that lost its owner: the first
            st.owner = owner  # user to carry it on holds it from now on
        if st.state in (ABANDONED, DISCARDED):
            raise ChunkError(f"stream {st.id!r} was {st.state}; start a new stream")
        if chunk.seq < st.next_seq:
            return False
        if chunk.seq > st.next_seq or chunk.offset != st.next_offset:
            raise ChunkError(f"stream gap: expected sequence {st.next_seq} at offset "
                             f"{st.next_offset}, got {chunk.seq} at {chunk.offset}",
                             next_seq=st.next_seq)
        st.next_seq += 1
        st.next_offset += body_len
        st.received_bytes += body_len
        st.chunks += 1
        st.producer = peer
        st.updated = self._clock()
        if chunk.final:
            st.size = chunk.size
            st.sha256 = chunk.sha256
            if st.state != RESUMED_STATE:
                st.state = DISPATCHING
        return True

    def check_group(self, kind: str, name: str, group: str, owner: str | None) -> None:
        """A message that would join stream ``group`` on ``kind/name`` (it ends, resumes or
        finishes it when consumed) must come from the stream's owner, in or out of a
        transaction or staged part; ChunkError if not."""
        key = (keys.kind_key(kind, name), group)
        st = self.open.get(key) or self.finished.get(key)
        if st is not None:
            check_owner(st, owner)

    def query(self, kind: str, name: str, stream_id: str,
              owner: str | None = None) -> dict[str, str]:
        """Where the stream ``stream_id`` on ``kind/name`` stands (another user's: refused)."""
        key = (keys.kind_key(kind, name), stream_id)
        st = self.open.get(key) or self.finished.get(key)
        if st is not None:
            check_owner(st, owner)
        if st is None:
            return {"sluice-stream-next-seq": "0", "sluice-stream-next-offset": "0",
                    "sluice-stream-state": "unknown"}
        state = "complete" if st.final_stored else "open"
        if st.state in (ABANDONED, DISCARDED):
            state = st.state
        return {"sluice-stream-next-seq": str(st.next_seq),
                "sluice-stream-next-offset": str(st.next_offset), "sluice-stream-state": state}

    # -- routing -----------------------------------------------------------------------------
    def of(self, kind: str, name: str, msg: Message) -> StreamState | None:
        """The open stream ``msg`` belongs to on ``kind/name``, if any."""
        if msg.group is None:
            return None
        return self.open.get((keys.kind_key(kind, name), msg.group))

    def pin_tail(self, st: StreamState, ticket: TicketLike) -> None:
        """Keep the newest chunk's record on disk while the stream is open, so that after a
        restart the broker still knows where a producer must resume even if every earlier
        chunk was consumed and its segment reclaimed."""
        old, st.last_ticket = st.last_ticket, ticket
        self.store.keep_appended(ticket, [old] if old is not None else [])

    def _unpin(self, st: StreamState) -> None:
        if st.last_ticket is not None:
            self.store.let_go([st.last_ticket])
            st.last_ticket = None

    def hold_chunk(self, st: StreamState, q: Queue, msg: Message) -> bool:
        """`complete` dispatch: chunks wait (on disk) until the final chunk is stored."""
        if q.policy.stream_dispatch != COMPLETE_FIRST:
            return False
        st.held.append((q, msg))
        if not st.final_stored:
            return True
        held, st.held = st.held, []
        for hq, hm in held:
            hq.enqueue(hm)
        return True

    # -- consumers (the queues call these through the broker) --------------------------------
    def _at(self, destination: str, stream_id: str) -> StreamState | None:
        """The stream whose chunks a queue at ``destination`` holds: its own, or for a DLQ the
        abandoned or discarded stream of the destination the chunks were moved from."""
        st = self.open.get((keys.destination_key(destination), stream_id))
        if st is not None or not destination.startswith("/queue/"):
            return st
        name = destination[len("/queue/"):]
        for candidate in self.open.values():  # only dead streams have chunks in a DLQ
            if candidate.id == stream_id and candidate.state in (ABANDONED, DISCARDED):
                origin = keys.name_of(candidate.queue_key)
                policy = self.host.policy(keys.kind_of(candidate.queue_key), origin)
                if name == f"{policy.dlq_prefix}{origin}":
                    return candidate
        return None

    def assigned(self, queue: Queue, stream_id: str, consumer: Consumer) -> None:
        st = self._at(queue.destination, stream_id)
        if st is not None:
            if st.consumer is not None and st.consumer != consumer.delivery.peer:
                st.state = RESUMED_STATE
            st.consumer = consumer.delivery.peer

    def delivered(self, msg: Message) -> None:
        st = self._at(msg.destination, msg.group) if msg.group is not None else None
        if st is not None:
            st.delivered_bytes += msg.size
            st.updated = max(st.updated, self._clock()) if not st.final_stored else st.updated

    def finish(self, queue: Queue, stream_id: str) -> None:
        st = self._at(queue.destination, stream_id)
        if st is not None:
            del self.open[st.key]
            st.state = COMPLETE
            st.consumer = None
            self._unpin(st)
            self.finished[st.key] = st
            while len(self.finished) > FINISHED_KEPT:
                del self.finished[next(iter(self.finished))]

    def discarded(self, queue: Queue, stream_id: str) -> None:
        st = self._at(queue.destination, stream_id)
        if st is not None:
            st.state = DISCARDED
            log.warning("stream %s (%s) discarded to the DLQ after its consumer left",
                        stream_id, st.name)

    # -- silence -----------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        """Abandon streams whose producer sent no chunk for the destination's stream-timeout."""
        for st in list(self.open.values()):
            if st.final_stored or st.state in (ABANDONED, DISCARDED):
                continue
            policy = self.host.policy(keys.kind_of(st.queue_key), keys.name_of(st.queue_key))
            if now - st.updated > policy.stream_timeout:
                self._abandon(st)

    def _abandon(self, st: StreamState) -> None:
        """The producer went silent: tell the consumer, move what exists to the DLQ."""
        st.state = ABANDONED
        log.warning("stream %s (%s) abandoned: no chunk for its stream-timeout", st.id, st.name)
        name, host = keys.name_of(st.queue_key), self.host
        queues = [host.queues[name]] if keys.is_queue(st.queue_key) and name in host.queues \
            else []
        if keys.is_topic(st.queue_key) and name in host.topics:
            queues = list(host.topics[name].subscribers.values())
        held, st.held = st.held, []
        for q in queues:
            doomed = [m for hq, m in held if hq is q] + q.take_group(st.id)
            owner = q.groups.pop(st.id, None)
            if owner is not None:
                doomed = [m for m in owner.inflight.values() if m.group == st.id] + doomed
                for m in doomed:
                    owner.inflight.pop(m.mid, None)
                owner.open_streams.discard(st.id)
                owner.delivery.stream_error(st.id,
                                            f"stream abandoned: {st.name!r} got no chunk for its "
                                            "stream-timeout; the partial stream was moved to "
                                            "the DLQ")
            for m in doomed:
                q.stats.dead_lettered += 1
                host.dead_letter(q, m)
        self._unpin(st)
