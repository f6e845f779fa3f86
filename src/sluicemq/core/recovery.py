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
"""

from __future__ import annotations

import logging
import time
from array import array
from bisect import bisect_left
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from sluicemq.core.cursor import JOURNAL, SpillFifo
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
from sluicemq.storage import records
from sluicemq.storage.segment import Location
from sluicemq.storage.store import RecoveredTicket

if TYPE_CHECKING:
    from sluicemq.core.broker import Broker

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
    """Replay every intact record; returns what was restored, for the start-up log line."""
    started = time.monotonic()
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
