"""Start-up replay: the journal's records, in order, rebuild queues and durable subscriptions.

Replay must not materialise the backlog: a million unconsumed messages would cost a Python
object each. So each journal key gets a ``_Live`` set of compact slots (parallel arrays) in
journal order; an ACK finds its message by binary search on message ids (ids grow with journal
order; the few that do not - DLQ moves keep their id, compaction rewrites old messages at the
head - go to a small side table). Only the fixed record head is decoded for most records: the
JSON headers are parsed only for topic records that a selector must see and for stream chunks.
At the end every live slot is handed to its queue's cursor as a paged-out message, and the
journal's live counts are set in one call. Transaction parts are applied only when their final
record is present.

After a clean stop none of that is needed: ``save_snapshot`` (called while the journal closes)
writes the broker's stored state as an index snapshot (``storage/snapshot.py``) and ``replay``
loads it instead of scanning, when it still matches the journal.
"""

from __future__ import annotations

import logging
import time
from array import array
from bisect import bisect_left
from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any

from sluicemq.core.cursor import JOURNAL, OBJ, SpillFifo
from sluicemq.core.message import Message
from sluicemq.core.selectors import compile_selector
from sluicemq.core.streams import (
    COMPLETE_FIRST,
    DISPATCHING,
    FINAL,
    NAME,
    OFFSET,
    SEQ,
    SHA256,
    SIZE,
    STREAM_ID,
    StreamState,
)
from sluicemq.storage import records, snapshot
from sluicemq.storage.segment import Location
from sluicemq.storage.store import RecoveredTicket

if TYPE_CHECKING:
    from sluicemq.core.broker import Broker
    from sluicemq.core.queue import Queue

log = logging.getLogger("sluicemq.recovery")

_STREAM_MARK = f'"{STREAM_ID}"'.encode()
Entry = tuple[int, int, int, int, int, int]  # seg, off, length, inner, size, priority


class _Live:
    """One journal key's unconsumed messages as compact slots, in journal (= id) order."""

    __slots__ = ("alive", "inner", "length", "mid", "off", "prio", "seg", "side", "size")

    def __init__(self) -> None:
        self.mid = array("Q")
        self.seg = array("I")
        self.off = array("Q")
        self.length = array("I")
        self.inner = array("I")
        self.size = array("I")
        self.prio = array("B")
        self.alive = bytearray()
        self.side: dict[int, Entry] = {}

    def add(self, mid: int, entry: Entry) -> None:
        if self.mid and mid <= self.mid[-1]:
            self._kill(mid)  # an older copy (compaction rewrote it): the newer record wins
            self.side[mid] = entry
            return
        seg, off, length, inner, size, prio = entry
        self.mid.append(mid)
        self.seg.append(seg)
        self.off.append(off)
        self.length.append(length)
        self.inner.append(inner)
        self.size.append(size)
        self.prio.append(prio)
        self.alive.append(1)

    def _kill(self, mid: int) -> None:
        i = bisect_left(self.mid, mid)
        if i < len(self.mid) and self.mid[i] == mid:
            self.alive[i] = 0

    def remove(self, mid: int) -> None:
        if self.side.pop(mid, None) is None:
            self._kill(mid)

    def entries(self) -> list[tuple[int, Entry]] | None:
        """Side entries merged in id order, or None when there are none (use the arrays)."""
        if not self.side:
            return None
        out = [(self.mid[i], (self.seg[i], self.off[i], self.length[i], self.inner[i],
                              self.size[i], self.prio[i]))
               for i in range(len(self.mid)) if self.alive[i]]
        out.extend(self.side.items())
        out.sort(key=lambda e: e[0])
        return out

    def mids(self) -> list[int]:
        return [self.mid[i] for i in range(len(self.mid)) if self.alive[i]] + list(self.side)


class _Replay:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.live: dict[str, _Live] = defaultdict(_Live)
        self.subs: dict[str, records.DurableSub] = {}
        self.sub_locs: dict[str, Location] = {}  # where each live SUB record is
        self.selectors: dict[str, Any] = {}
        self.tx_parts: dict[str, list[Any]] = defaultdict(list)
        self.max_mid = 0
        self.records = 0
        self.streams: dict[str, StreamState] = {}
        self.chunks: dict[int, str] = {}  # message id -> stream id, for stream chunks
        self.chunk_msgs: dict[tuple[str, int], Message] = {}  # complete-first held chunks

    def message(self, payload: bytes | memoryview, loc: Location, inner: int = 0) -> None:
        mid, priority, _flags, key, hpos, hlen = records.message_head(payload)
        self.max_mid = max(self.max_mid, mid)
        size = len(payload) - hpos - hlen
        sm: records.StoredMessage | None = None
        raw = payload if isinstance(payload, bytes) else bytes(payload)
        if raw.find(_STREAM_MARK, hpos, hpos + hlen) >= 0:
            sm = records.decode_message(payload)
            if STREAM_ID in sm.headers:
                self._stream_chunk(sm, RecoveredTicket(loc))
                self.chunks[mid] = sm.headers[STREAM_ID]
        kind, _, name = key.partition(":")
        if kind == "t":
            keys = []
            for k, sub in self.subs.items():
                if sub.topic != name:
                    continue
                selector = self.selectors.get(k)
                if selector is not None:
                    sm = sm or records.decode_message(payload)
                    if not selector.matches(sm.headers):
                        continue
                keys.append(k)
        else:
            keys = [key]
        entry = (loc.segment, loc.offset, loc.length, inner, size, priority)
        for k in keys:
            self.live[k].add(mid, entry)

    def _stream_chunk(self, sm: records.StoredMessage, ticket: Any) -> None:
        """A chunk on disk tells how far its stream got, even if it was consumed since."""
        h = sm.headers
        sid = h[STREAM_ID]
        st = self.streams.get(sid)
        if st is None:
            kind, _, name = sm.key.partition(":")
            st = StreamState(sid, h.get(NAME, sid), f"/{'topic' if kind == 't' else 'queue'}/"
                             f"{name}", sm.key)
            self.streams[sid] = st
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

    def acks(self, payload: bytes | memoryview) -> None:
        for key, mid in records.decode_acks(payload):
            live = self.live.get(key)
            if live is not None:
                live.remove(mid)

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
        sub = records.decode_sub(payload)
        self.sub_locs[sub.key] = loc
        if self.subs.get(sub.key) == sub:
            return  # restated by compaction: the subscription and its messages stay
        self.subs[sub.key] = sub
        self.selectors[sub.key] = compile_selector(sub.selector) if sub.selector else None
        self.live[sub.key] = _Live()

    def unsub(self, payload: bytes | memoryview) -> None:
        key = records.decode_unsub(payload)
        self.sub_locs.pop(key, None)
        self.subs.pop(key, None)
        self.selectors.pop(key, None)
        self.live.pop(key, None)

    def install(self) -> int:
        broker = self.broker
        restored = 0
        held: dict[int, int] = defaultdict(int)  # segment -> records held
        newest = (0, -1)
        for sub in self.subs.values():
            broker._install_durable(sub)
            loc = self.sub_locs[sub.key]
            broker.sub_tickets[sub.key] = RecoveredTicket(loc)
            held[loc.segment] += 1
            newest = max(newest, (loc.segment, loc.offset))
        for key, live in self.live.items():
            kind, _, name = key.partition(":")
            if kind == "q":
                queue = broker.queue(name)
            elif key in broker.durables:
                queue = broker.durables[key][1]
            else:
                continue
            complete_first = queue.policy.stream_dispatch == COMPLETE_FIRST
            merged = live.entries()
            if merged is None:
                items: Any = _compact_items(live)
            else:
                items = merged
            for mid, (seg, off, length, inner, size, prio) in items:
                restored += 1
                held[seg] += 1
                newest = max(newest, (seg, off))
                sid = self.chunks.get(mid) if self.chunks else None
                st = self.streams.get(sid) if sid is not None else None
                if complete_first and st is not None and not st.final_stored:
                    st.held.append((queue, self._materialise(queue, mid, seg, off, length,
                                                             inner, size, prio)))
                else:
                    queue.pending.adopt(prio, mid, seg, off, length, inner, size)
        broker.store.journal.retain_counts(held, newest)
        self._install_streams()
        # Ids never repeat across restarts, even after every segment was reclaimed: start no
        # lower than the clock in microseconds (ids are allocated far slower than 1 per µs).
        broker.next_mid = max(self.max_mid + 1, int(time.time() * 1_000_000))
        return restored

    def _materialise(self, queue: Any, mid: int, seg: int, off: int, length: int, inner: int,
                     size: int, prio: int) -> Message:
        slot = (mid, JOURNAL, seg, off, length, inner, size)
        return self.broker.pager.page_in(SpillFifo(), slot, queue.destination, prio)

    def _install_streams(self) -> None:
        """Open streams (and finished ones with chunks left) keep their state; the rest are
        remembered as finished so a late resume query still gets a true answer."""
        broker = self.broker
        live_groups = {self.chunks[mid] for live in self.live.values() for mid in live.mids()
                       if mid in self.chunks}
        for sid, st in self.streams.items():
            if st.final_stored and sid not in live_groups and not st.held:
                st.state = "complete"
                broker.finished_streams[sid] = st
                st.last_ticket = None
                continue
            broker.streams[sid] = st
            if st.last_ticket is not None:
                broker.store.hold(st.last_ticket)  # re-pin the tail, as while running


def _compact_items(live: _Live) -> Any:
    a = live
    return ((a.mid[i], (a.seg[i], a.off[i], a.length[i], a.inner[i], a.size[i], a.prio[i]))
            for i in range(len(a.mid)) if a.alive[i])


def replay(broker: Broker) -> dict[str, int]:
    """Load the index snapshot if it matches the journal, else replay every intact record;
    returns what was restored, for the start-up log line."""
    started = time.monotonic()
    counts = _from_snapshot(broker, started)
    if counts is not None:
        return counts
    r = _Replay(broker)
    for rtype, payload, ticket in broker.store.recover():
        r.records += 1
        if rtype == records.MSG:
            r.message(payload, ticket.loc)
        elif rtype == records.ACK:
            r.acks(payload)
        elif rtype == records.TX:
            r.tx(payload, ticket.loc)
        elif rtype == records.SUB:
            r.sub(payload, ticket.loc)
        elif rtype == records.UNSUB:
            r.unsub(payload)
        else:
            log.warning("skipping journal record of unknown type %d", rtype)
    restored = r.install()
    broker.store.journal.reclaim()
    if r.tx_parts:
        log.warning("discarded %d uncommitted transaction(s) found in the journal",
                    len(r.tx_parts))
    return {"records": r.records, "messages": restored, "durable_subscriptions": len(r.subs),
            "elapsed_ms": int((time.monotonic() - started) * 1000)}


# -- index snapshot ------------------------------------------------------------------------------
# Stream fields carried across a clean restart; the connection-bound ones (producer, consumer)
# are not, and ``updated`` restarts at load time, as after a scan, so no stream times out
# for the downtime.
_STREAM_FIELDS = ("next_seq", "next_offset", "size", "sha256", "received_bytes",
                  "delivered_bytes", "acked_chunks", "chunks", "state", "started")


def _from_snapshot(broker: Broker, started: float) -> dict[str, int] | None:
    """Restore from the snapshot (deleted first, whatever happens) or say why not; None: scan."""
    directory = broker.store.journal.directory
    snap, why = snapshot.take(directory)
    if snap is None and why is None:
        log.info("no index snapshot (first start or the last stop was not clean): "
                 "scanning the journal")
        return None
    if snap is not None:
        why = snapshot.check(directory, snap.position) or _unusable(snap)
    if snap is None or why is not None:
        log.warning("index snapshot ignored (%s): scanning the journal", why)
        return None
    restored = restore(broker, snap)
    elapsed = time.monotonic() - started
    log.info("index snapshot used: %d messages, %d durable subscriptions, %d streams, "
             "%d segments, no journal scan (%.3fs)", restored, len(snap.subs),
             len(snap.streams), len(snap.position.segments), elapsed)
    return {"records": 0, "messages": restored, "durable_subscriptions": len(snap.subs),
            "elapsed_ms": int(elapsed * 1000)}


def _unusable(snap: snapshot.IndexSnapshot) -> str | None:
    """Why an intact snapshot cannot be restored without a half-built broker, or None."""
    sub_keys = {sub.key for sub, _ in snap.subs}
    for key in [lane.key for lane in snap.lanes] + [h["key"] for h in snap.held]:
        if not key.startswith("q:") and key not in sub_keys:
            return f"messages for {key!r}, which has no subscription"
    pos = snap.position
    known = {s[0] for s in pos.segments} | {pos.active}
    stray = [seg for seg, n in snap.counts.items() if n and seg not in known]
    if stray:
        return f"live records in segments {stray} that do not exist"
    return None


def restore(broker: Broker, snap: snapshot.IndexSnapshot) -> int:
    """Install a checked snapshot into a fresh broker; returns the messages restored."""
    journal = broker.store.journal
    pos = snap.position
    journal.resume([s[0] for s in pos.segments], pos.active, pos.end, pos.last)
    journal.retain_counts({seg: n for seg, n in snap.counts.items() if n}, pos.last)
    for sub, loc in snap.subs:
        broker._install_durable(sub)
        broker.sub_tickets[sub.key] = RecoveredTicket(loc)
    restored = 0
    for lane in snap.lanes:
        _queue_of(broker, lane.key).pending.adopt_lane(lane.priority, *lane.columns())
        restored += len(lane)
    for d in snap.streams:
        st = StreamState(d["id"], d["name"], d["destination"], d["queue_key"])
        for name in _STREAM_FIELDS:
            setattr(st, name, d[name])
        if d["pin"] is not None:
            st.last_ticket = RecoveredTicket(Location(*d["pin"]))
        (broker.streams if d["open"] else broker.finished_streams)[st.id] = st
    for h in snap.held:
        queue = _queue_of(broker, h["key"])
        seg, off, length = h["loc"]
        slot = (h["mid"], JOURNAL, seg, off, length, h["inner"], h["size"])
        st = broker.streams.get(h["stream"])
        if st is None:  # cannot happen for a snapshot we wrote; keep the message anyway
            queue.pending.adopt(h["priority"], h["mid"], seg, off, length, h["inner"], h["size"])
        else:
            msg = broker.pager.page_in(SpillFifo(), slot, queue.destination, h["priority"])
            st.held.append((queue, msg))  # type: ignore[arg-type]
        restored += 1
    broker.next_mid = max(snap.next_mid, int(time.time() * 1_000_000))
    journal.reclaim()
    return restored


def _queue_of(broker: Broker, key: str) -> Queue:
    kind, _, name = key.partition(":")
    return broker.queue(name) if kind == "q" else broker.durables[key][1]


def save_snapshot(broker: Broker) -> None:
    """Run by the closing journal: write the index snapshot, or log why not (next start scans).

    Never raises: a failed snapshot costs only the next start's speed.
    """
    started = time.monotonic()
    try:
        snap = capture(broker)
        if isinstance(snap, str):
            log.warning("index snapshot not written (%s): the next start scans the journal", snap)
            return
        nbytes = snapshot.save(broker.store.journal.directory, snap)
    except Exception:
        log.exception("index snapshot not written: the next start scans the journal")
        return
    log.info("index snapshot written: %d messages, %d bytes in %.3fs", snap.messages, nbytes,
             time.monotonic() - started)


def capture(broker: Broker) -> snapshot.IndexSnapshot | str:
    """The broker's stored state after ``store.close()``, as a snapshot; or why there is none.

    Every persistent message a journaled queue holds (paged-out slots, in-memory messages, ones
    a consumer has not acked, chunks held for their stream) becomes a lane entry, in dispatch
    order. Self-check: those holders, SUB records and stream pins must add up, segment by
    segment, to the journal's own live counts; anything unaccounted for (a compaction in
    flight, a failed batch) means no snapshot rather than a wrong one.
    """
    store = broker.store
    journal = store.journal
    shape = journal.position()
    if shape is None:
        return "a journal batch failed during this run"
    expected = store.settled_counts()
    if expected is None:
        return "acknowledgements wait for records that are not durable"
    counts: Counter[int] = Counter()
    subs = []
    for key, (sub, _q) in broker.durables.items():
        ticket = broker.sub_tickets.get(key)
        if ticket is None or ticket.loc is None:
            return f"durable subscription {key!r} has no stored record"
        subs.append((sub, ticket.loc))
        counts[ticket.loc.segment] += 1
    lanes: list[snapshot.Lane] = []
    queues = [*broker.queues.values(), *(q for _, q in broker.durables.values())]
    for q in queues:
        if q.durable:
            why = _capture_queue(q, lanes, counts)
            if why is not None:
                return why
    streams, held = [], []
    for st in broker.streams.values():
        pin = st.last_ticket.loc if st.last_ticket is not None else None  # type: ignore[attr-defined]
        if pin is not None:
            counts[pin.segment] += 1
        streams.append(_stream_dict(st, pin, is_open=True))
        for q, m in st.held:  # type: ignore[misc]
            loc = _stored_loc(m)
            if loc is None or not q.durable:
                continue
            held.append({"key": q.key, "stream": st.id, "mid": m.mid, "priority": m.priority,
                         "loc": [loc.segment, loc.offset, loc.length], "inner": m.inner,
                         "size": m.size})
            counts[loc.segment] += 1
    streams.extend(_stream_dict(st, None, is_open=False)
                   for st in broker.finished_streams.values())
    mine = {seg: n for seg, n in counts.items() if n}
    theirs = {seg: n for seg, n in expected.items() if n}
    if mine != theirs:
        seg = min(s for s in mine.keys() | theirs.keys() if mine.get(s) != theirs.get(s))
        return (f"holders do not add up to the journal's live records in segment {seg} "
                f"({mine.get(seg, 0)} found, {theirs.get(seg, 0)} live)")
    segments, active, end, last = shape
    position = snapshot.describe(journal.directory, segments, active, end, last)
    return snapshot.IndexSnapshot(position, mine, broker.next_mid, lanes, subs, held, streams)


def _capture_queue(q: Queue, lanes: list[snapshot.Lane], counts: Counter[int]) -> str | None:
    """Append the queue's lanes: unacked messages first (where their return would put them),
    then each lane's in-memory head, then its paged-out tail."""
    unacked: dict[int, list[Message]] = defaultdict(list)
    for c in q.consumers:
        for m in [*c.inflight.values(), *(m for ms in c.stream_acked.values() for m in ms)]:
            unacked[m.priority].append(m)
    heads = {prio: (head, tail) for prio, head, tail in q.pending.lanes()}
    for prio in sorted(heads.keys() | unacked.keys()):
        lane = snapshot.make_lane(q.key, prio)
        head, tail = heads.get(prio, ((), None))
        for m in [*sorted(unacked.get(prio, ()), key=lambda m: m.mid), *head]:
            if _add(lane, m, counts):
                return f"message {m.mid} of {q.key} has an unknown record layout"
        if tail is not None and _add_tail(lane, tail, counts):
            return f"a paged-out message of {q.key} has an unknown record layout"
        if len(lane):
            lanes.append(lane)
    return None


def _add_tail(lane: snapshot.Lane, tail: SpillFifo, counts: Counter[int]) -> bool:
    """Paged-out slots, whole columns at a time when all are journal slots (the usual case)."""
    mid, src, seg, off, length, inner, size = tail.columns()
    if src.count(JOURNAL) == len(src):
        for dst, col in zip(lane.columns(), (mid, seg, off, length, inner, size), strict=True):
            dst.extend(col)
        counts.update(seg)
        return False
    for i in range(len(mid)):
        if src[i] == JOURNAL:
            for dst, v in zip(lane.columns(), (mid[i], seg[i], off[i], length[i], inner[i],
                                               size[i]), strict=True):
                dst.append(v)
            counts[seg[i]] += 1
        elif src[i] == OBJ and _add(lane, tail.objs[mid[i]], counts):
            return True
    return False  # temp-store slots hold non-persistent messages: gone after any restart


def _add(lane: snapshot.Lane, m: Message, counts: Counter[int]) -> bool:
    """Add one message object if it is stored; True when its record layout is unknown."""
    loc = _stored_loc(m)
    if loc is None:
        return False
    if m.inner < 0:
        return True
    for dst, v in zip(lane.columns(), (m.mid, loc.segment, loc.offset, loc.length, m.inner,
                                       m.size), strict=True):
        dst.append(v)
    counts[loc.segment] += 1
    return False


def _stored_loc(m: Message) -> Location | None:
    """Where a message's record is, if it is a persistent message that reached the journal."""
    if not m.persistent or m.ticket is None:
        return None
    loc: Location | None = m.ticket.loc
    return loc


def _stream_dict(st: StreamState, pin: Location | None, *, is_open: bool) -> dict[str, Any]:
    d: dict[str, Any] = {"id": st.id, "name": st.name, "destination": st.destination,
                         "queue_key": st.queue_key, "open": is_open,
                         "pin": [pin.segment, pin.offset, pin.length] if pin else None}
    for name in _STREAM_FIELDS:
        d[name] = getattr(st, name)
    return d
