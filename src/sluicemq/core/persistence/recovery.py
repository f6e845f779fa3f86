"""Start-up: the index snapshot plus the journal records after it rebuild queues, durable
subscriptions, streams and every registered ``StatePart``; without a usable snapshot, every
journal record does.

Replay must not materialise the backlog: a million unconsumed messages would cost a Python
object each. Messages are compact slots (``persistence/live.py``): the snapshot's lanes as they were
captured, and the messages found in records, in journal order. Only the fixed record head is
decoded for most records (``records.message_head``'s fields, with one struct unpack and a cache
of queue keys): the JSON headers are parsed only for topic records a selector must see and for
stream chunks. At the end every slot is handed to its queue's cursor a lane at a time and the
journal's live counts are set in one call. Transaction parts are applied only when their final
record is present.

Record types map to handlers in ``Replay.handlers``: the built-in ones, then every registered
``StatePart`` (``core/persistence/parts.py``), which is how new kinds of stored state plug in.

The snapshot is trusted only if the record it ends with is intact (``snapshot.check``) and every
segment its surviving entries point into still exists once the tail is applied; otherwise it is
deleted and the whole journal is scanned, which is always correct.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from sluicemq.config import match_destination
from sluicemq.core.paging.blocks import Sealed
from sluicemq.core.paging.spill import JOURNAL, SpillFifo
from sluicemq.core.persistence import capture as capturing
from sluicemq.core.persistence.live import BaseLanes, Entry, LiveSlots
from sluicemq.core.persistence.parts import StatePart
from sluicemq.core.routing import keys
from sluicemq.core.routing.message import Message
from sluicemq.core.routing.wildcards import is_pattern
from sluicemq.core.selectors import compile_selector
from sluicemq.core.streams.chunks import (
    COMPLETE_FIRST,
    DISPATCHING,
    FINAL,
    NAME,
    OFFSET,
    SEQ,
    SHA256,
    SIZE,
    STREAM_ID,
    StreamKey,
    StreamState,
)
from sluicemq.errors import StorageError
from sluicemq.storage import records, snapshot
from sluicemq.storage.segment import Location
from sluicemq.storage.store import RecoveredTicket

if TYPE_CHECKING:
    from sluicemq.core.routing.broker import Broker
    from sluicemq.core.routing.queue import Queue

log = logging.getLogger("sluicemq.recovery")

_STREAM_MARK = f'"{STREAM_ID}"'.encode()
_HEAD = records.MSG_HEAD  # records.encode_message's fixed head
Handler = Callable[[bytes | memoryview, Location], None]


class Replay:
    """What the journal says the broker holds, built record by record in log order, optionally
    on top of an index snapshot (``snap``)."""

    def __init__(self, broker: Broker, parts: Sequence[type[StatePart]],
                 snap: snapshot.IndexSnapshot | None = None) -> None:
        self.broker = broker
        self.live: dict[str, LiveSlots] = defaultdict(LiveSlots)
        self.base: dict[str, BaseLanes] = {}
        self.base_mid = 0  # ids below this may be in the snapshot's lanes
        self.subs: dict[str, records.DurableSub] = {}
        self.sub_locs: dict[str, Location] = {}  # where each live SUB record is
        self.selectors: dict[str, Any] = {}
        self.patterns: dict[str, Callable[[str], bool]] = {}  # wildcard durables: topic test
        self.tx_parts: dict[str, list[Location]] = defaultdict(list)
        self.max_mid = 0
        self.records = 0
        self.streams: dict[StreamKey, StreamState] = {}
        self.base_open: set[StreamKey] = set()  # streams the snapshot had open
        self.base_finished: set[StreamKey] = set()
        self.chunks: dict[int, StreamKey] = {}  # message id -> its stream, for chunks in records
        self.parts: list[StatePart] = [part(broker) for part in parts]
        self.handlers: dict[int, Handler] = {
            records.MSG: self.message, records.ACK: self.acks_record, records.TX: self.tx,
            records.SUB: self.sub, records.UNSUB: self.unsub}
        for part in self.parts:
            for rtype in part.rtypes:
                self.handlers[rtype] = self._part_handler(part, rtype)
        self._flagged = [(p.flags, p.message) for p in self.parts if p.flags]
        self._keys: dict[bytes, tuple[str, bool]] = {}  # key bytes -> (key, a topic's?)
        self._unknown: Counter[int] = Counter()
        self._counts: Counter[int] = Counter()
        # whole packed runs unpacked once by ``settle``, by id() of the run (the snapshot's
        # lanes keep each run alive until ``install`` takes it)
        self._sealed: dict[int, Sealed] = {}
        if snap is not None:
            self._seed(snap)

    def _part_handler(self, part: StatePart, rtype: int) -> Handler:
        return lambda payload, loc: part.record(self, rtype, payload, loc)

    # -- the snapshot ------------------------------------------------------------------------
    def _seed(self, snap: snapshot.IndexSnapshot) -> None:
        for sub, loc in snap.subs:
            self._add_sub(sub, loc)
        for lane in snap.lanes:
            self.base.setdefault(lane.key, BaseLanes()).lanes.append(lane)
        for h in snap.held:
            self.base.setdefault(h["key"], BaseLanes()).held.append(h)
        self.base_mid = snap.next_mid
        self.max_mid = snap.next_mid - 1
        for d in snap.streams:
            st = StreamState(d["id"], d["name"], d["destination"], d["queue_key"],
                             owner=d.get("owner"))
            for name in capturing.STREAM_FIELDS:
                setattr(st, name, d[name])
            if d["pin"] is not None:
                st.last_ticket = RecoveredTicket(Location(*d["pin"]))
            self.streams[st.key] = st
            (self.base_open if d["open"] else self.base_finished).add(st.key)
        for part in self.parts:
            if part.name in snap.parts:
                part.seed(snap.parts[part.name])

    # -- records -----------------------------------------------------------------------------
    def run(self, after: tuple[int, int, int] | None) -> None:
        """Apply every journal record after ``after`` (all of them for None)."""
        journal = self.broker.store.journal
        handlers = self.handlers
        msg = self._message
        n = 0
        for rtype, payload, seg, off in journal.recover_raw(after):
            n += 1
            if rtype == records.MSG:
                msg(payload, seg, off, len(payload), 0, None)
                continue
            handler = handlers.get(rtype)
            if handler is None:
                self._unknown[rtype] += 1
            else:
                handler(payload, Location(seg, off, len(payload)))
        self.records += n
        for rtype, count in self._unknown.items():
            log.warning("skipped %d journal record(s) of unknown type %d", count, rtype)

    def message(self, payload: bytes | memoryview, loc: Location, inner: int = 0,
                mid: int | None = None) -> None:
        """A stored message: ``payload`` a MSG record (or a message op inside the record at
        ``loc``, ``inner`` bytes in); ``mid`` overrides the id in the payload."""
        self._message(payload, loc.segment, loc.offset, loc.length, inner, mid)

    def _message(self, payload: bytes | memoryview, seg: int, off: int, length: int, inner: int,
                 mid: int | None) -> None:
        stored_mid, _ts, _exp, priority, flags, klen, hlen = _HEAD.unpack_from(payload, 0)
        if mid is None:
            mid = stored_mid
        kpos = _HEAD.size
        if flags & records.OWNER_FLAG:
            kpos += records.owner_prefix(payload, flags)
        hpos = kpos + klen
        raw = payload if type(payload) is bytes else bytes(payload)
        if flags:
            for bits, see in self._flagged:
                if flags & bits:
                    see(raw)
        kb = raw[kpos:hpos]
        known = self._keys.get(kb)
        if known is None:
            decoded = kb.decode()
            known = self._keys[kb] = (decoded, keys.is_topic(decoded))
        key, topic = known
        if mid > self.max_mid:
            self.max_mid = mid
        sm: records.StoredMessage | None = None
        if raw.find(_STREAM_MARK, hpos, hpos + hlen) >= 0:
            sm = records.decode_message(raw)
            if STREAM_ID in sm.headers:
                self._stream_chunk(sm, RecoveredTicket(Location(seg, off, length)))
                self.chunks[mid] = (sm.key, sm.headers[STREAM_ID])
        size = len(raw) - hpos - hlen
        if not topic:
            if mid >= self.base_mid:  # the common case, without an entry tuple
                self.live[key].append(mid, seg, off, length, inner, size, priority)
            else:
                self._add(key, mid, (seg, off, length, inner, size, priority))
            return
        entry = (seg, off, length, inner, size, priority)
        name = keys.name_of(key)
        for k, sub in self.subs.items():
            if sub.topic != name and not (k in self.patterns and self.patterns[k](name)):
                continue
            selector = self.selectors.get(k)
            if selector is not None:
                sm = sm or records.decode_message(raw)
                if not selector.matches(sm.headers):
                    continue
            self._add(k, mid, entry)

    def _add(self, key: str, mid: int, entry: Entry) -> None:
        if mid < self.base_mid:
            base = self.base.get(key)
            if base is not None and mid not in base.gone and not self.live[key].has(mid):
                base.moved[mid] = entry  # compaction rewrote a snapshot message (settled later)
                return
        self.live[key].add(mid, entry)

    def _stream_chunk(self, sm: records.StoredMessage, ticket: Any) -> None:
        """A chunk on disk tells how far its stream got, even if it was consumed since."""
        h = sm.headers
        sid = h[STREAM_ID]
        st = self.streams.get((sm.key, sid))
        if st is None:
            st = StreamState(sid, h.get(NAME, sid), keys.destination_of(sm.key), sm.key)
            self.streams[st.key] = st
        try:
            seq, offset = int(h.get(SEQ, "0")), int(h.get(OFFSET, "0"))
        except ValueError:
            return
        if seq + 1 > st.next_seq:
            st.next_seq = seq + 1
            st.next_offset = offset + len(sm.body)
            st.last_ticket = ticket
        st.chunks += 1
        st.received_bytes += len(sm.body)
        if h.get(FINAL) == "true":
            st.size = int(h.get(SIZE, st.next_offset))
            st.sha256 = h.get(SHA256)
            st.state = DISPATCHING

    def acks_record(self, payload: bytes | memoryview, loc: Location) -> None:
        self.acks(payload)

    def acks(self, payload: bytes | memoryview) -> None:
        """An ACK record's (or op's) removals."""
        for key, mid in records.decode_acks(payload):
            self.remove(key, mid)

    def remove(self, key: str, mid: int) -> None:
        """Message ``mid`` left queue ``key`` (consumed, expired, moved)."""
        live = self.live.get(key)
        if live is not None and live.remove(mid):
            return
        if mid < self.base_mid:
            base = self.base.get(key)
            if base is not None:
                base.remove(mid)

    def tx(self, payload: bytes | memoryview, loc: Location) -> None:
        txid, final, ops = records.decode_tx(payload)
        if not final:
            self.tx_parts[txid].append(loc)
            return
        for part in self.tx_parts.pop(txid, []):
            _, _, part_ops = records.decode_tx(self.broker.store.read(part))
            self.apply_ops(txid, part_ops, part)
        self.apply_ops(txid, ops, loc)

    def apply_ops(self, txid: str, ops: list[tuple[int, memoryview]], loc: Location) -> None:
        offsets = records.tx_op_offsets(txid, ops)
        for (rtype, op), inner in zip(ops, offsets, strict=True):
            if rtype == records.MSG:
                self.message(op, loc, inner)
            elif rtype == records.ACK:
                self.acks(op)

    def sub(self, payload: bytes | memoryview, loc: Location) -> None:
        self._add_sub(records.decode_sub(payload), loc)

    def _add_sub(self, sub: records.DurableSub, loc: Location) -> None:
        self.sub_locs[sub.key] = loc
        if self.subs.get(sub.key) == sub:
            return  # restated by compaction: the subscription and its messages stay
        self.subs[sub.key] = sub
        self.selectors[sub.key] = compile_selector(sub.selector) if sub.selector else None
        if is_pattern(sub.topic):  # as at publish time: matching topics its owner may read
            self.patterns[sub.key] = _reaches(sub.topic, self.broker.durable_reader(sub.key))
        self.live[sub.key] = LiveSlots()
        self.base.pop(sub.key, None)

    def unsub(self, payload: bytes | memoryview, loc: Location) -> None:
        key = records.decode_unsub(payload)
        self.sub_locs.pop(key, None)
        self.subs.pop(key, None)
        self.patterns.pop(key, None)
        self.selectors.pop(key, None)
        self.live.pop(key, None)
        self.base.pop(key, None)

    # -- the result --------------------------------------------------------------------------
    def settle(self) -> str | None:
        """Apply the tail to the snapshot's lanes and check that every record the result points
        at still exists; returns why not (the snapshot is then unusable)."""
        for key, base in self.base.items():
            for mid, entry in base.settle().items():
                self.live[key].add(mid, entry)
        counts: Counter[int] = Counter()
        for key, base in self.base.items():
            if self._wanted(key):
                for lane in base.lanes:
                    counts.update(lane.seg)
                    for run in lane.packed:
                        self._count_run(run, counts)
                counts.update(h["loc"][0] for h in base.held)
        for key in list(self.subs):
            counts[self.sub_locs[key].segment] += 1
        live = set(self.broker.store.journal.live_segments())
        missing = sorted(seg for seg in counts if seg not in live)
        if missing:
            return f"entries in segments {missing}, which are gone"
        self._counts = counts
        return None

    def _count_run(self, run: snapshot.PackedRun, counts: Counter[int]) -> None:
        """Count the segments of a packed run's slots. A whole block (the usual run) is
        unpacked here once: what the cursor needs to take it packed is learnt in the same pass
        (``blocks.Sealed``, kept for ``install``)."""
        fields = run.whole()
        if run.skip or run.count != len(fields[0]):
            capturing.count_runs(fields[2][run.skip:run.skip + run.count], counts)
            return
        mine: Counter[int] = Counter()
        capturing.count_runs(fields[2], mine)
        counts.update(mine)
        self._sealed[id(run)] = Sealed(run.packed, fields, (min(mine), max(mine)) if mine
                                       else None)

    def _wanted(self, key: str) -> bool:
        return keys.is_queue(key) or key in self.subs

    def install(self) -> int:
        """Hand everything to the broker (after ``settle``); returns the messages restored."""
        broker = self.broker
        counts = self._counts
        for sub in self.subs.values():
            broker.durable_subs.install(sub)
            broker.sub_tickets[sub.key] = RecoveredTicket(self.sub_locs[sub.key])
        restored = 0
        for key in [*self.base, *(k for k in self.live if k not in self.base)]:
            if not self._wanted(key):
                continue
            queue = _queue_of(broker, key)
            base = self.base.get(key)
            if base is not None:
                for lane in base.lanes:
                    for piece in lane.pieces():
                        if isinstance(piece, snapshot.PackedRun):
                            sealed = self._sealed.pop(id(piece), None)
                            if sealed is not None:
                                queue.pending.adopt_sealed(lane.priority, sealed)
                            else:
                                queue.pending.adopt_packed(lane.priority, piece)
                        else:
                            queue.pending.adopt_lane(lane.priority, *piece)
                    restored += len(lane)
                restored += self._install_held(queue, base.held)
            live = self.live.get(key)
            if live is not None:
                restored += self._install_live(queue, live, counts)
        self._install_streams(counts)
        for part in self.parts:
            for loc in part.install():
                counts[loc.segment] += 1
        journal = broker.store.journal
        journal.retain_counts({seg: n for seg, n in counts.items() if n}, journal.last_record)
        # Ids never repeat across restarts, even after every segment was reclaimed: start no
        # lower than the clock in microseconds (ids are allocated far slower than 1 per µs).
        broker.next_mid = max(self.max_mid + 1, int(time.time() * 1_000_000))
        return restored

    def _install_live(self, queue: Queue, live: LiveSlots, counts: Counter[int]) -> int:
        held_back = queue.policy.stream_dispatch == COMPLETE_FIRST and self.chunks
        restored = 0
        for prio, cols in live.lanes():
            mid, seg, off, length, inner, size = cols
            counts.update(seg)
            restored += len(mid)
            if not held_back:
                queue.pending.adopt_lane(prio, *cols)
                continue
            for i in range(len(mid)):
                st = self.streams.get(self.chunks.get(mid[i], ("", "")))
                if st is not None and not st.final_stored:
                    st.held.append((queue, self._materialise(
                        queue, mid[i], seg[i], off[i], length[i], inner[i], size[i], prio)))
                else:
                    queue.pending.adopt(prio, mid[i], seg[i], off[i], length[i], inner[i],
                                        size[i])
        return restored

    def _install_held(self, queue: Queue, held: list[dict[str, Any]]) -> int:
        """Chunks the snapshot held back for their stream (``complete`` dispatch)."""
        for h in held:
            seg, off, length = h["loc"]
            st = self.streams.get((keys.destination_key(queue.destination), h["stream"]))
            if st is not None and not st.final_stored:
                st.held.append((queue, self._materialise(
                    queue, h["mid"], seg, off, length, h["inner"], h["size"], h["priority"])))
            else:
                queue.pending.adopt(h["priority"], h["mid"], seg, off, length, h["inner"],
                                    h["size"])
        return len(held)

    def _materialise(self, queue: Any, mid: int, seg: int, off: int, length: int, inner: int,
                     size: int, prio: int) -> Message:
        slot = (mid, JOURNAL, seg, off, length, inner, size)
        return self.broker.pager.page_in(SpillFifo(), slot, queue.destination, prio)

    def _install_streams(self, counts: Counter[int]) -> None:
        """Open streams (and finished ones with chunks left) keep their state and pin their
        newest chunk; the rest are remembered as finished so a late resume query still gets a
        true answer."""
        broker = self.broker
        live_groups: set[StreamKey] = set()
        if self.chunks:
            live_groups = {self.chunks[mid] for live in self.live.values() for mid in live.mids()
                           if mid in self.chunks}
        for sid, st in self.streams.items():  # sid: (destination key, stream id)
            if sid in self.base_finished or (
                    st.final_stored and sid not in live_groups and not st.held
                    and not self._final_chunk_kept(st)):
                if sid not in self.base_finished:
                    st.state = "complete"
                broker.finished_streams[sid] = st
                st.last_ticket = None
                continue
            broker.streams[sid] = st
            pin = st.last_ticket.loc if st.last_ticket is not None else None
            if pin is not None:
                counts[pin.segment] += 1

    def _final_chunk_kept(self, st: StreamState) -> bool:
        """Is the final chunk of a stream the snapshot had open still stored? (Its earlier
        chunks are slots without headers; the final one is the stream's pinned record.)"""
        loc = st.last_ticket.loc if st.last_ticket is not None else None
        if st.key not in self.base_open or loc is None:
            return False
        try:
            mid, _prio, _flags, key, _h, _n = records.message_head(self.broker.store.read(loc))
        except (StorageError, ValueError, UnicodeDecodeError):
            return True  # cannot tell: keep it open, as the snapshot had it
        if key != st.queue_key:
            return True
        holders = [key] if keys.is_queue(key) else [
            k for k, sub in self.subs.items() if keys.topic_key(sub.topic) == key]
        return any(self.live[k].has(mid) or (k in self.base and self.base[k].has(mid))
                   for k in holders)


def _reaches(pattern: str, may_read: Callable[[str], bool]) -> Callable[[str], bool]:
    """Does a wildcard durable subscription take a message published to ``topic``?"""
    return lambda topic: match_destination(pattern, topic) and may_read(topic)


def _queue_of(broker: Broker, key: str) -> Queue:
    return broker.queue(keys.name_of(key)) if keys.is_queue(key) else broker.durables[key][1]


def replay(broker: Broker, parts: Sequence[type[StatePart]] = ()) -> dict[str, Any]:
    """Restore from the index snapshot and the journal after it, or from the whole journal,
    with the state ``parts`` beside the queues; returns what was restored, for the log."""
    started = time.monotonic()
    directory = broker.store.journal.directory
    snap, why = snapshot.load(directory)
    r: Replay | None = None
    captured = snap.messages if snap is not None else 0
    if snap is not None:
        why = snapshot.check(directory, snap.position, broker.store.journal.header_key)
        if why is None:
            r = Replay(broker, parts, snap)
            r.run(snap.position.anchor)
            why = r.settle()
    if why is not None:
        log.warning("index snapshot ignored (%s): scanning the whole journal", why)
        snapshot.remove(directory)
        r = None
    elif snap is None:
        log.info("no index snapshot: scanning the whole journal")
    used = r is not None
    if r is None:
        r = Replay(broker, parts)
        r.run(None)
        inconsistent = r.settle()
        if inconsistent is not None:
            raise StorageError(f"journal replay is inconsistent: {inconsistent}")
    restored = r.install()
    if used and snap is not None and snap.position.anchor is not None:
        # The anchor stays pinned (persistence/checkpoint.py adopts the pin): a crash before the
        # next snapshot must find it, and every record after it.
        broker.store.journal.retain(Location(*snap.position.last, 0))
    broker.store.journal.reclaim()
    if r.tx_parts:
        log.warning("discarded %d uncommitted transaction(s) found in the journal",
                    len(r.tx_parts))
    elapsed = time.monotonic() - started
    if used:
        assert snap is not None
        log.info("index snapshot used: %d messages as of segment %d offset %d, then %d journal "
                 "records replayed (%.3fs)", captured, snap.position.last[0],
                 snap.position.last[1], r.records, elapsed)
    return {"records": r.records, "messages": restored, "durable_subscriptions": len(r.subs),
            "elapsed_ms": int(elapsed * 1000), "snapshot": int(used),
            "anchor": snap.position.last if used and snap is not None
            and snap.position.anchor is not None else None}
