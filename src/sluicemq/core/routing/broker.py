"""The broker: destinations, durable subscriptions, routing, and the receipt/durability clock.

It owns no sockets and no threads: the transport calls it on the event-loop thread, time comes
from an injected clock and deferred work goes through an injected ``schedule`` (``call_soon``),
so the whole of it runs in tests without a network.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from sluicemq.config import BrokerConfig, Policy
from sluicemq.core.dedup.producers import Producers
from sluicemq.core.limits.admission import Admission
from sluicemq.core.limits.waits import ConsumerWaits
from sluicemq.core.paging.cursor import PendingList
from sluicemq.core.paging.flow import FlowControl, MemoryAccount, resolve_limits
from sluicemq.core.paging.pager import Pager
from sluicemq.core.paging.trim import HeapTrimmer
from sluicemq.core.persistence.parts import StatePart, check_parts
from sluicemq.core.persistence.recovery import replay
from sluicemq.core.routing.advisories import Advisories
from sluicemq.core.routing.destinations import DestinationBudget, check_durable_cap
from sluicemq.core.routing.dispatch import dispatch
from sluicemq.core.routing.message import Message
from sluicemq.core.routing.names import QUEUE, TOPIC, destination_of
from sluicemq.core.routing.queue import Consumer, Queue
from sluicemq.core.routing.temporary import TempDestinations
from sluicemq.core.routing.topic import Topic
from sluicemq.core.routing.virtual import VirtualTopicIndex
from sluicemq.core.routing.wildcards import MayRead, WildcardIndex
from sluicemq.core.selectors import Selector, compile_selector
from sluicemq.core.staging.stager import Stager
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
    destination_key,
)
from sluicemq.errors import ProtocolError
from sluicemq.storage import records
from sluicemq.storage.compaction import Compactor, Holder
from sluicemq.storage.segment import Location
from sluicemq.storage.store import Store, TicketLike
from sluicemq.storage.tempstore import TempStore

log = logging.getLogger("sluicemq.broker")

Waiter = Callable[[BaseException | None], None]
TX_RECORD_BYTES = 4 << 20  # a COMMIT larger than this is journaled as several parts + final
DISPATCH_BUDGET = 64  # deliveries per queue per loop turn



def _lag(q: Queue) -> int:
    """Body bytes ``q``'s consumers have yet to be handed (in memory and paged out)."""
    return q.pending.memory + q.pending.stored_bytes

class Broker:
    """Routing and bookkeeping for every destination; sessions call in, queues call back."""

    def __init__(self, config: BrokerConfig, store: Store,
                 schedule: Callable[[Callable[[], None]], Any],
                 clock: Callable[[], float] = time.time,
                 trim_heap: Callable[[], object] | None = None,
                 parts: Sequence[type[StatePart]] = ()) -> None:
        self.config = config
        self.parts = check_parts(parts)  # state beside the queues: journal, snapshot, replay
        self.store = store
        self._schedule = schedule
        self._clock = clock
        self._policies: dict[tuple[str, str], Policy] = {}
        self.queues: dict[str, Queue] = {}
        self.topics: dict[str, Topic] = {}
        self.wildcards = WildcardIndex()  # topic subscriptions by pattern (prices.*, orders.>)
        self.virtual = VirtualTopicIndex(config.virtual_topics)  # Consumer.<g>.VirtualTopic.X
        self.temps = TempDestinations()  # /temp-queue/, /temp-topic/: owned by a connection
        self.advisories = Advisories(config.advisories.enabled, self.has_listeners,
                                     lambda name, msg: self.publish(TOPIC, name, msg),
                                     self.allocate_mid)
        self.durables: dict[str, tuple[records.DurableSub, Queue]] = {}
        self.redelivery: Callable[[Queue, list[Message]], list[Message]] | None = None
        self.sub_tickets: dict[str, TicketLike] = {}  # SUB records pin their segment
        self.client_ids: dict[tuple[str | None, str], object] = {}  # (owner, id) -> session
        self.admission = Admission(config.limits)  # connections, every transport
        self.destinations = DestinationBudget(self)  # creation caps, idle reclaiming
        self.next_mid = 1
        self._dirty: dict[int, Queue] = {}
        self._dispatch_scheduled = False
        self._waiters: list[tuple[int, int, Waiter]] = []
        self._waiter_order = itertools.count()
        self.started = clock()
        self.streams: dict[StreamKey, StreamState] = {}
        self.finished_streams: dict[StreamKey, StreamState] = {}  # recent, for resume queries
        self.consumer_waits = ConsumerWaits(config.limits, self._consumer_count)
        self.limits = resolve_limits(config.limits, config.data_dir)
        self.memory = MemoryAccount(self.limits.memory)
        self.temp = TempStore(config.data_dir / "tmp")
        self.pager = Pager(store, self.temp, config.journal.spill_bytes)
        self.flow = FlowControl(self.limits, self.memory, store.disk_estimate,
                                lambda: self.temp.bytes_used, HeapTrimmer(trim_heap),
                                lambda: store.journal.unwritten_bytes)
        self.compactor = Compactor(store, self._compaction_holders, self._compaction_relocate)
        self.stager = Stager(self)  # staged publishing (docs/replay-protocol.md, section 3)
        self.producers = Producers(store, config.limits.dedup_window)  # section 4
        store.reclaim_watchers += [self.stager.anchor.move_if_oldest,
                                   self.producers.anchor.move_if_oldest]
        store.on_durable = self._on_durable
        store.on_failed = self._on_failed

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on a later loop turn (paced work such as range reads and commits)."""
        self._schedule(fn)

    # -- destinations ------------------------------------------------------------------------
    def policy(self, kind: str, name: str) -> Policy:
        """The destination's policy; cached, since the config never changes while running."""
        key = (kind, name)
        policy = self._policies.get(key)
        if policy is None:
            policy = self._policies[key] = self.config.policy_for(kind, name)
        return policy

    def forget_policies(self) -> None:
        """Drop cached policies (destinations were reclaimed; their names need none)."""
        self._policies.clear()

    def is_dirty(self, queue: Queue) -> bool:
        """Is ``queue`` waiting for a dispatch pass?"""
        return id(queue) in self._dirty

    def make_pending(self, destination: str, policy: Policy) -> PendingList:
        """A destination's cursor: paging (``store``) unless its policy says ``vm``."""
        pager = self.pager if policy.cursor == "store" else None
        return PendingList(pager, destination=destination, window=policy.cursor_window,
                           account=self.memory)

    def room_for(self, kind: str, name: str, persistent: bool,
                 policy: Policy | None = None) -> str | None:
        """Why ``kind/name`` cannot take a message now (producer flow control), or None."""
        policy = policy or self.policy(kind, name)
        if kind == QUEUE:
            q = self.queues.get(name)
            used = q.pending.memory if q is not None else 0
            lag = _lag(q) if q is not None and q.consumers else None
        else:
            t = self.topics.get(name)
            subs = list(t.subscribers.values()) if t else []
            used = sum(q.pending.memory for q in subs)
            # Paced to the subscriber that keeps up best: a slow one must not hold the rest
            # back (it pages to temp files instead, as before).
            lags = [_lag(q) for q in subs if q.consumers]
            lag = min(lags) if lags else None
        return self.flow.full(policy, persistent, used, lag)

    def queue(self, name: str) -> Queue:
        q = self.queues.get(name)
        if q is None:
            q = Queue(self, f"q:{name}", destination_of(QUEUE, name), self.policy(QUEUE, name))
            self.queues[name] = q
            self.virtual.added(name)
            self.advisories.destination("added", QUEUE, name)
        return q

    def topic(self, name: str) -> Topic:
        t = self.topics.get(name)
        if t is None:
            t = Topic(name, destination_of(TOPIC, name))
            self.topics[name] = t
            self.advisories.destination("added", TOPIC, name)
        return t

    def allocate_mid(self) -> int:
        mid = self.next_mid
        self.next_mid += 1
        return mid

    def allocate_mids(self, count: int) -> int:
        """A block of ``count`` consecutive ids (a staged publication); returns the first."""
        first = self.next_mid
        self.next_mid += count
        return first

    # -- publishing --------------------------------------------------------------------------
    def publish(self, kind: str, name: str, msg: Message) -> None:
        """Route one message; a persistent one is journaled before any consumer sees it."""
        stream = (self.streams.get((f"{'q' if kind == QUEUE else 't'}:{name}", msg.group))
                  if msg.group is not None else None)
        if stream is not None and stream.state == DISCARDED:
            kind, name = QUEUE, f"{self.policy(kind, name).dlq_prefix}{name}"
        if kind == QUEUE:
            q = self.queue(name)
            if msg.persistent:
                msg.ticket = self._append_msg(q.key, msg)
                msg.inner = 0
                self.store.hold(msg.ticket)
                if msg.size >= self.config.journal.spill_bytes:
                    msg.body = None  # the journal has it; memory keeps the headers only
                if stream is not None:
                    self._pin_stream_tail(stream, msg.ticket)
            if stream is not None and self._hold_chunk(stream, q, msg):
                return
            q.enqueue(msg)
            return
        topic = self.topic(name)
        topic.published += 1
        targets = self._topic_targets(topic, msg)
        ticket = None
        durable = [q for q in targets if q.durable]
        if msg.persistent and durable:
            ticket = self._append_msg(f"t:{name}", msg)
            msg.inner = 0
            self.store.hold(ticket, len(durable))
        if ticket is not None and msg.size >= self.config.journal.spill_bytes:
            msg.body = None
        if stream is not None and ticket is not None:
            self._pin_stream_tail(stream, ticket)
        for q in targets:
            copy = msg.copy_for(msg.destination)
            copy.ticket = ticket if q.durable else None
            copy.persistent = msg.persistent and q.durable
            if stream is not None and self._hold_chunk(stream, q, copy):
                continue
            q.enqueue(copy)

    def body_of(self, msg: Message) -> bytes | memoryview:
        """The body, from memory or read back from the journal (large persistent messages)."""
        if msg.body is not None:
            return msg.body
        payload: bytes | memoryview = self.store.read(msg.ticket.loc)
        if msg.inner > 0:  # stored inside a transaction record
            payload = records.tx_op_at(payload, msg.inner)
        return records.message_body(payload)

    def _append_msg(self, key: str, msg: Message) -> TicketLike:
        return self.store.append_message(key, msg.mid, msg.timestamp, msg.expires,
                                         msg.priority, msg.headers, msg.loaded_body)

    # -- streams -----------------------------------------------------------------------------
    def accept_chunk(self, kind: str, name: str, chunk: Chunk, body_len: int,
                     peer: str, owner: str | None = None) -> bool:
        """Check a chunk against its stream on ``kind/name``; True to store it, False for a
        duplicate. ``owner``: the sending user with security on (None: security off).

        Raises ChunkError for a gap (the producer must resend from ``next_seq``), a stream
        that was abandoned or discarded, or another user's stream.
        """
        dest = f"q:{name}" if kind == QUEUE else f"t:{name}"
        key = (dest, chunk.stream_id)
        st = self.streams.get(key)
        if st is None:
            done = self.finished_streams.get(key)
            if done is not None:
                check_owner(done, owner)
                return False  # everything was stored already: a late re-send
            if chunk.seq != 0:
                raise ChunkError(f"stream gap: unknown stream {chunk.stream_id!r} must start at "
                                 f"sequence 0, got {chunk.seq}", next_seq=0)
            st = StreamState(chunk.stream_id, chunk.name, f"/{kind}/{name}", dest, owner=owner)
            self.streams[key] = st
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
        key = (f"q:{name}" if kind == QUEUE else f"t:{name}", group)
        st = self.streams.get(key) or self.finished_streams.get(key)
        if st is not None:
            check_owner(st, owner)

    def stream_query(self, kind: str, name: str, stream_id: str,
                     owner: str | None = None) -> dict[str, str]:
        """Where the stream ``stream_id`` on ``kind/name`` stands (another user's: refused)."""
        key = (f"q:{name}" if kind == QUEUE else f"t:{name}", stream_id)
        st = self.streams.get(key) or self.finished_streams.get(key)
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

    def _pin_stream_tail(self, st: StreamState, ticket: TicketLike) -> None:
        """Keep the newest chunk's record on disk while the stream is open, so that after a
        restart the broker still knows where a producer must resume even if every earlier
        chunk was consumed and its segment reclaimed."""
        self.store.hold(ticket)
        old, st.last_ticket = st.last_ticket, ticket
        if old is not None:
            self.store.release_after(self.store.appended_seq, [old])

    def _unpin_stream(self, st: StreamState) -> None:
        if st.last_ticket is not None:
            self.store.release_after(self.store.flush(), [st.last_ticket])
            st.last_ticket = None

    def _hold_chunk(self, st: StreamState, q: Queue, msg: Message) -> bool:
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

    def _stream_at(self, destination: str, stream_id: str) -> StreamState | None:
        """The stream whose chunks a queue at ``destination`` holds: its own, or for a DLQ the
        abandoned or discarded stream of the destination the chunks were moved from."""
        st = self.streams.get((destination_key(destination), stream_id))
        if st is not None or not destination.startswith("/queue/"):
            return st
        name = destination[len("/queue/"):]
        for candidate in self.streams.values():  # only dead streams have chunks in a DLQ
            if candidate.id == stream_id and candidate.state in (ABANDONED, DISCARDED):
                kind, _, origin = candidate.queue_key.partition(":")
                policy = self.policy(QUEUE if kind == "q" else TOPIC, origin)
                if name == f"{policy.dlq_prefix}{origin}":
                    return candidate
        return None

    def stream_assigned(self, queue: Queue, stream_id: str, consumer: Consumer) -> None:
        st = self._stream_at(queue.destination, stream_id)
        if st is not None:
            if st.consumer is not None and st.consumer != consumer.delivery.peer:
                st.state = RESUMED_STATE
            st.consumer = consumer.delivery.peer

    def stream_delivered(self, msg: Message) -> None:
        st = self._stream_at(msg.destination, msg.group) if msg.group is not None else None
        if st is not None:
            st.delivered_bytes += msg.size
            st.updated = max(st.updated, self._clock()) if not st.final_stored else st.updated

    def stream_finished(self, queue: Queue, stream_id: str) -> None:
        st = self._stream_at(queue.destination, stream_id)
        if st is not None:
            del self.streams[st.key]
            st.state = COMPLETE
            st.consumer = None
            self._unpin_stream(st)
            self.finished_streams[st.key] = st
            while len(self.finished_streams) > 1000:
                del self.finished_streams[next(iter(self.finished_streams))]

    def stream_discarded(self, queue: Queue, stream_id: str) -> None:
        st = self._stream_at(queue.destination, stream_id)
        if st is not None:
            st.state = DISCARDED
            log.warning("stream %s (%s) discarded to the DLQ after its consumer left",
                        stream_id, st.name)

    def wait_for_consumer(self, kind: str, name: str, timeout: float,
                          callback: Callable[[int], None], owner: object = None) -> None:
        """Call back with the consumer count once the destination has one, or at timeout
        (bounded per ``owner``, see core/limits/waits.py)."""
        self.consumer_waits.add(self._clock(), kind, name, timeout, callback, owner)

    def _consumer_count(self, kind: str, name: str) -> int:
        if kind == QUEUE:
            q = self.queues.get(name)
            return len(q.consumers) if q is not None else 0
        t = self.topics.get(name)
        return sum(len(q.consumers) for q in t.subscribers.values()) if t is not None else 0

    def tick(self) -> None:
        """Once a second: abandon silent streams, answer consumer waits that timed out,
        compact the journal, resume producers whose destinations have room."""
        now = self._clock()
        self.consumer_waits.check(now)
        self.compactor.tick()
        self.stager.tick(int(now * 1000))
        self.producers.tick(int(now * 1000))
        self.destinations.sweep(now)
        self.flow.tick()
        for st in list(self.streams.values()):
            if st.final_stored or st.state in (ABANDONED, DISCARDED):
                continue
            kind, _, name = st.queue_key.partition(":")
            policy = self.policy(QUEUE if kind == "q" else TOPIC, name)
            if now - st.updated > policy.stream_timeout:
                self._abandon(st)

    def _abandon(self, st: StreamState) -> None:
        """The producer went silent: tell the consumer, move what exists to the DLQ."""
        st.state = ABANDONED
        log.warning("stream %s (%s) abandoned: no chunk for its stream-timeout", st.id, st.name)
        kind, _, name = st.queue_key.partition(":")
        queues = [self.queues[name]] if kind == "q" and name in self.queues else []
        if kind == "t" and name in self.topics:
            queues = list(self.topics[name].subscribers.values())
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
                self.dead_letter(q, m)
        self._unpin_stream(st)

    # -- journal compaction ------------------------------------------------------------------
    def _journaled_queues(self) -> Iterator[Queue]:
        yield from self.queues.values()
        for _, q in self.durables.values():
            yield q

    def _held_objects(self, q: Queue) -> Iterator[Message]:
        """Every message object of a queue that may pin a journal record."""
        yield from q.pending.in_memory()
        for c in q.consumers:
            yield from c.inflight.values()
            for msgs in c.stream_acked.values():
                yield from msgs
        for st in self.streams.values():
            for hq, m in st.held:
                if hq is q:
                    yield m

    def _compaction_holders(self, segment: int) -> list[Holder] | None:
        """Who holds records of ``segment``; None when something we cannot move does."""
        for st in self.streams.values():
            pin = st.last_ticket
            if pin is not None and pin.loc is not None and pin.loc.segment == segment:
                return None
        holders = [Holder(key, -1, t.loc, 0) for key, t in self.sub_tickets.items()
                   if t.loc is not None and t.loc.segment == segment]
        for q in self._journaled_queues():
            for mid, seg, off, length, inner in q.pending.journal_slots(segment):
                holders.append(Holder(q.key, mid, Location(seg, off, length), inner))
            for m in self._held_objects(q):
                loc = m.ticket.loc if m.ticket is not None else None
                if loc is not None and loc.segment == segment:
                    if m.inner < 0:
                        return None
                    holders.append(Holder(q.key, m.mid, loc, m.inner))
        return holders

    def _compaction_relocate(self, plan: list[tuple[Holder, TicketLike]]) -> list[bool]:
        """Point each holder at its durable copy; False where the holder is gone."""
        by_key = {q.key: q for q in self._journaled_queues()}
        moved: dict[str, dict[tuple[int, int, int], Location]] = {}
        for h, t in plan:
            assert t.loc is not None
            if h.mid < 0:  # a durable subscription's SUB record
                continue
            moved.setdefault(h.key, {})[(h.loc.segment, h.loc.offset, h.inner)] = t.loc
        found: dict[str, set[tuple[int, int, int]]] = {}
        for key, locs in moved.items():
            q = by_key.get(key)
            found[key] = q.pending.relocate(locs) if q is not None else set()
        result = []
        for h, t in plan:
            if h.mid < 0:
                current = self.sub_tickets.get(h.key)
                ok = current is not None and current.loc == h.loc
                if ok:
                    self.sub_tickets[h.key] = t
                result.append(ok)
                continue
            k = (h.loc.segment, h.loc.offset, h.inner)
            ok = k in found[h.key]
            q = by_key.get(h.key)
            if not ok and q is not None:
                for m in self._held_objects(q):
                    if m.mid == h.mid and m.ticket is not None and m.ticket.loc == h.loc:
                        m.ticket, m.inner = t, 0
                        ok = True
                        break
            result.append(ok)
        return result

    # -- QueueOwner --------------------------------------------------------------------------
    def schedule_dispatch(self, queue: Queue) -> None:
        self._dirty[id(queue)] = queue
        if not self._dispatch_scheduled:
            self._dispatch_scheduled = True
            self._schedule(self.run_dispatch)

    def run_dispatch(self) -> None:
        """Dispatch every queue that changed. A queue that used its whole per-turn budget goes
        round again on the next loop turn, after the sockets were read: a busy consumer cannot
        starve producers (their receipts) or other connections."""
        self._dispatch_scheduled = False
        now = self.now_ms()
        again: list[Queue] = []
        while self._dirty:
            batch = list(self._dirty.values())
            self._dirty.clear()
            for q in batch:
                if dispatch(q, now, max_deliveries=DISPATCH_BUDGET) >= DISPATCH_BUDGET:
                    again.append(q)
        for q in again:
            self.schedule_dispatch(q)
        self.flow.poll()

    def record_removal(self, queue: Queue, msgs: Iterable[Message]) -> None:
        if not queue.durable:
            return
        for m in msgs:
            if m.persistent and m.ticket is not None:
                self.store.remove(queue.key, m.mid, m.ticket)

    def record_removal_run(self, queue: Queue, mids: array, segments: array,
                           offsets: array) -> None:
        if queue.durable:
            self.store.remove_run(queue.key, mids, segments, offsets)

    def note_expired(self, queue: Queue, msgs: list[Message]) -> None:
        """Expired before anyone took them: advisories (the removal is journaled apart)."""
        if self.advisories.enabled:
            self.advisories.expired(queue.destination, [m.message_id for m in msgs])

    def redeliver_later(self, queue: Queue, msgs: list[Message]) -> list[Message]:
        """Messages given back that the policy delays go to the scheduler (``redelivery``,
        wired by the composition root); returns the ones to redeliver at once."""
        return msgs if self.redelivery is None else self.redelivery(queue, msgs)

    def dead_letter(self, queue: Queue, msg: Message, reason: str = "redelivered") -> None:
        """Move a message that exhausted its redeliveries (or, by policy, expired) to
        ``/queue/DLQ.<name>`` atomically; an expired one never expires there."""
        origin = queue.destination.split("/", 2)[2]
        dlq = self.queue(f"{queue.policy.dlq_prefix}{origin}")
        moved = msg.moved_to(dlq.destination, self.allocate_mid())  # a fresh seq in the DLQ
        moved.body = bytes(self.body_of(msg))
        moved.headers.update({"sluice-dlq-origin": queue.destination,
                              "sluice-dlq-deliveries": str(msg.deliveries),
                              "sluice-dlq-reason": reason})
        if reason == "expired":
            moved.expires = 0
            moved.headers.pop("expires", None)
        self.advisories.dead_lettered(queue.destination, dlq.destination, msg.message_id,
                                      reason)
        if msg.persistent:
            ops: list[tuple[int, bytes]] = []
            if queue.durable and msg.ticket is not None:
                ops.append((records.ACK, records.encode_acks([(queue.key, msg.mid)])))
            ops.append((records.MSG, records.encode_message(
                dlq.key, moved.mid, moved.timestamp, moved.expires, moved.priority,
                moved.headers, moved.body)))
            ticket = self.store.append_tx(f"dlq:{msg.mid}", ops, final=True)
            moved.inner = records.tx_op_offsets(f"dlq:{msg.mid}", ops)[-1]
            if queue.durable and msg.ticket is not None:
                self.store.release_after(ticket.seq, [msg.ticket])
            moved.ticket = ticket
            self.store.hold(ticket)
        dlq.enqueue(moved)

    # -- subscriptions -----------------------------------------------------------------------
    def subscribe_queue(self, name: str) -> Queue:
        self._check_max_consumers(QUEUE, name)
        return self.queue(name)

    def _check_max_consumers(self, kind: str, name: str) -> None:
        limit = self.policy(kind, name).max_consumers
        if limit and self._consumer_count(kind, name) >= limit:
            raise ProtocolError(f"/{kind}/{name} already has its maximum of {limit} consumers",
                                fatal=False)

    def subscribe_topic(self, name: str, key: str, selector: Selector | None) -> Queue:
        """A private, non-durable queue that receives the topic's messages from now on."""
        self._check_max_consumers(TOPIC, name)
        topic = self.topic(name)
        q = Queue(self, key, topic.destination, self.policy(TOPIC, name),
                  durable=False, selector=selector)
        topic.subscribers[key] = q
        return q

    def subscribe_topic_pattern(self, pattern: str, key: str, selector: Selector | None,
                                may_read: MayRead) -> Queue:
        """A private, non-durable queue that receives the messages of every topic matching
        ``pattern`` (existing or future) that ``may_read`` allows, from now on."""
        q = Queue(self, key, destination_of(TOPIC, pattern), self.policy(TOPIC, pattern),
                  durable=False, selector=selector)
        self.wildcards.add(pattern, key, q, may_read)
        return q

    def drop_topic_subscription(self, name: str, key: str) -> None:
        topic = self.topics.get(name)
        if topic is not None:
            topic.subscribers.pop(key, None)
        self.wildcards.remove(key)

    def has_listeners(self, topic: str) -> bool:
        """Would a message published to ``topic`` reach anyone (plain or wildcard)?"""
        t = self.topics.get(topic)
        if t is not None and t.subscribers:
            return True
        probe = Message(0, "", {}, b"", persistent=False)
        return bool(self.wildcards) and bool(self.wildcards.targets(topic, probe))

    def drop_temporary(self, kind: str, name: str) -> None:
        """Its connection ended: a temporary destination goes, with what it holds."""
        if kind == QUEUE:
            q = self.queues.pop(name, None)
            if q is not None:
                q.purge()
        else:
            self.topics.pop(name, None)
        self.advisories.destination("removed", kind, name)

    def virtual_queues(self, topic: str) -> list[str]:
        """The consumer-group queues (that exist now) copying virtual topic ``topic``."""
        names = self.virtual.queues(topic)
        gone = [n for n in names if n not in self.queues]
        for n in gone:
            self.virtual.removed(n)
        return [n for n in names if n in self.queues]

    def _topic_targets(self, topic: Topic, msg: Message) -> list[Queue]:
        """The topic's own subscribers, then wildcard subscribers whose pattern matches it."""
        targets = topic.targets(msg)
        if self.wildcards:
            targets += self.wildcards.targets(topic.name, msg)
        return targets

    def durable_subscription(self, client_id: str, sub_name: str, topic_name: str,
                             selector_text: str | None) -> Queue:
        """Find or create (journaled) a durable subscription; a changed definition replaces it."""
        key = f"d:{client_id}:{sub_name}"
        self._check_max_consumers(TOPIC, topic_name)
        existing = self.durables.get(key)
        if existing is not None:
            sub, q = existing
            if sub.topic == topic_name and sub.selector == selector_text:
                return q
            if q.consumers:
                raise ProtocolError(f"durable subscription {sub_name!r} is in use", fatal=False)
            self.remove_durable(key)
        else:
            check_durable_cap(self.durables, client_id, self.config.limits)
        sub = records.DurableSub(key, topic_name, client_id, sub_name, selector_text)
        ticket = self.store.append_sub(sub)
        self.store.hold(ticket)
        self.sub_tickets[key] = ticket
        return self._install_durable(sub)

    def _install_durable(self, sub: records.DurableSub) -> Queue:
        topic = self.topic(sub.topic)
        selector = compile_selector(sub.selector) if sub.selector else None
        q = Queue(self, sub.key, topic.destination, self.policy(TOPIC, sub.topic),
                  durable=True, selector=selector)
        topic.subscribers[sub.key] = q
        self.durables[sub.key] = (sub, q)
        return q

    def remove_durable(self, key: str) -> None:
        """Delete a durable subscription and everything it still held."""
        entry = self.durables.pop(key, None)
        if entry is None:
            raise ProtocolError(f"no durable subscription {key.split(':', 2)[-1]!r}", fatal=False)
        sub, q = entry
        self.drop_topic_subscription(sub.topic, key)
        held = [m for m in q.pending.drain_stubs() if m.ticket is not None]
        ticket = self.store.append_unsub(key)
        pins = [m.ticket for m in held]
        sub_ticket = self.sub_tickets.pop(key, None)
        if sub_ticket is not None:
            pins.append(sub_ticket)
        self.store.release_after(ticket.seq, pins)

    def attach(self, consumer: Consumer) -> None:
        consumer.queue.add_consumer(consumer)
        if self.consumer_waits:
            self.consumer_waits.check(self._clock())

    # -- transactions ------------------------------------------------------------------------
    def commit(self, txid: str, messages: list[tuple[str, str, Message]],
               acks: list[tuple[Queue, list[Message]]],
               nacks: list[tuple[Queue, list[Message]]]) -> None:
        """Apply a transaction: one TX record (or parts + final for big ones), then the effects."""
        ops: list[tuple[int, bytes]] = []
        holds: list[tuple[int, list[Any]]] = []  # index into part list, messages to hold
        parts: list[list[tuple[int, bytes]]] = []
        size = 0
        routed: list[tuple[Queue, Message]] = []
        part_msgs: list[Message] = []
        pos = records.tx_op_offsets(txid, [(records.MSG, b"")])[0]  # where op payloads start

        def close_part() -> None:
            nonlocal ops, size, part_msgs, pos
            parts.append(ops)
            holds.append((len(parts) - 1, part_msgs))
            ops, size, part_msgs = [], 0, []
            pos = records.tx_op_offsets(txid, [(records.MSG, b"")])[0]

        for kind, name, msg in messages:
            if kind == QUEUE:
                q = self.queue(name)
                targets = [q]
                key = q.key
            else:
                topic = self.topic(name)
                topic.published += 1
                targets = self._topic_targets(topic, msg)
                key = f"t:{name}"
            durable_targets = [q for q in targets if q.durable]
            for q in targets:
                copy = msg if kind == QUEUE else msg.copy_for(msg.destination)
                copy.persistent = msg.persistent and q.durable
                copy.inner = pos
                routed.append((q, copy))
                if copy.persistent:
                    part_msgs.append(copy)
            if msg.persistent and durable_targets:
                payload = records.encode_message(key, msg.mid, msg.timestamp, msg.expires,
                                                 msg.priority, msg.headers, msg.loaded_body)
                ops.append((records.MSG, payload))
                size += len(payload)
                pos += len(payload) + records.OP_HEAD_SIZE
                if size >= TX_RECORD_BYTES:
                    close_part()
        removals: list[Any] = []
        ack_pairs: list[tuple[str, int]] = []
        for q, msgs in acks:
            for m in msgs:
                if q.durable and m.persistent and m.ticket is not None:
                    ack_pairs.append((q.key, m.mid))
                    removals.append(m.ticket)
        if ack_pairs:
            ops.append((records.ACK, records.encode_acks(ack_pairs)))
        if ops or parts:
            close_part()
        last_ticket = None
        for i, part in enumerate(parts):
            ticket = self.store.append_tx(txid, part, final=(i == len(parts) - 1))
            last_ticket = ticket
            for m in holds[i][1]:
                m.ticket = ticket
                self.store.hold(ticket)
        if last_ticket is not None and removals:
            self.store.release_after(last_ticket.seq, removals)
        for q, msgs in acks:
            q.acknowledge(msgs, record=False)
        for q, msgs in nacks:
            q.return_messages(msgs)
        for q, m in routed:
            q.enqueue(m)

    # -- durability --------------------------------------------------------------------------
    def when_durable(self, callback: Waiter) -> None:
        """Call back once everything appended so far is on disk (receipts wait on this)."""
        seq = self.store.flush()
        if seq <= self.store.durable_seq:
            callback(None)
            return
        heapq.heappush(self._waiters, (seq, next(self._waiter_order), callback))

    def _on_durable(self, seq: int) -> None:
        self.pager.settle(seq)
        waiters = self._waiters
        while waiters and waiters[0][0] <= seq:
            heapq.heappop(waiters)[2](None)
        self.flow.poll()

    def _on_failed(self, first: int, last: int, exc: BaseException) -> None:
        """Records [first, last] never reached the disk: their receipts become ERRORs."""
        self.stager.failed(first, last)
        self.producers.failed(first, last)
        keep = []
        for entry in self._waiters:
            if first <= entry[0] <= last:
                entry[2](exc)
            else:
                keep.append(entry)
        heapq.heapify(keep)
        self._waiters = keep

    # -- recovery ----------------------------------------------------------------------------
    def recover(self) -> dict[str, Any]:
        """Rebuild queues and durable subscriptions from the journal; returns counts."""
        return replay(self)
