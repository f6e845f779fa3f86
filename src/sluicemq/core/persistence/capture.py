"""Taking an index snapshot of a broker: its stored state as of the last journal record appended.

Runs on the event-loop thread, between two loop turns, so the state is consistent with the
journal up to ``Journal.mark()``: every record appended so far is reflected, none after. The
snapshot may be written only once those records are durable
(``persistence/checkpoint.py`` waits; at a
clean stop the journal is closed first).

Every persistent message a journaled queue holds (paged-out slots, in-memory messages, ones a
consumer has not acked, ones an ack:auto consumer took whose bytes have not left user space yet -
their removal is not journaled -, chunks held for their stream) becomes a lane entry, in dispatch
order.
Self-check (``verify``, off the loop for big snapshots): those holders, SUB records, stream pins
and the pins of every ``StatePart`` must add up, segment by segment, to the journal's own live
counts. Anything unaccounted for means no snapshot rather than a wrong one.
"""

from __future__ import annotations

import logging
import time
from array import array
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sluicemq.core.paging.spill import OBJ, SpillFifo
from sluicemq.core.streams.chunks import StreamState
from sluicemq.storage import snapshot
from sluicemq.storage.segment import Location

if TYPE_CHECKING:
    from sluicemq.core.persistence.parts import StatePart
    from sluicemq.core.routing.broker import Broker
    from sluicemq.core.routing.message import Message
    from sluicemq.core.routing.queue import Queue

log = logging.getLogger("sluicemq.recovery")

# Stream fields carried across a restart; the connection-bound ones (producer, consumer) are
# not, and ``updated`` restarts at load time, as after a scan, so no stream times out for the
# downtime.
STREAM_FIELDS = ("next_seq", "next_offset", "size", "sha256", "received_bytes",
                 "delivered_bytes", "acked_chunks", "chunks", "state", "started")
COMPACTING = "a journal compaction is in flight"
_SHORT_RANGE = 256  # count_runs counts ranges this short item by item
_NONZERO_IS_ONE = bytes([0] + [1] * 255)  # src column -> 1 where a slot is not JOURNAL (== 0)


@dataclass(slots=True)
class Capture:
    """A snapshot not yet checked: ``expected`` live records per segment (the journal's word),
    ``pins`` the records held outside the lanes (SUB records, stream pins, held chunks, parts)."""

    snap: snapshot.IndexSnapshot
    expected: dict[int, int]
    pins: list[Location]


def capture(broker: Broker, parts: Sequence[type[StatePart]],
            pinned: Iterable[Location] = ()) -> Capture | str:
    """The broker's stored state now, or why no snapshot can be taken now. ``pinned``: records
    retained by others than the broker's holders (the checkpointer's anchor pins)."""
    store = broker.store
    journal = store.journal
    broker.later.release_written()  # removals whose bytes are out: journaled, not kept
    store.flush()  # pending acks become a record: the state below includes their removals
    if broker.compactor.busy:
        return COMPACTING
    mark = journal.mark()
    if mark is None:
        return "the journal is rewinding a failed batch"
    seq, last, end = mark
    expected = store.settled_counts()
    pins: list[Location] = list(pinned)
    subs = []
    for key, (sub, _q) in broker.durables.items():
        ticket = broker.sub_tickets.get(key)
        if ticket is None or ticket.loc is None:
            return f"durable subscription {key!r} has no stored record"
        subs.append((sub, ticket.loc))
        pins.append(ticket.loc)
    lanes: list[snapshot.Lane] = []
    queues = [*broker.queues.values(), *(q for _, q in broker.durables.values())]
    unwritten = broker.later.unwritten_of()
    for q in queues:
        if q.durable:
            why = _capture_queue(q, lanes, unwritten.get(q.key, ()))
            if why is not None:
                return why
    streams: list[dict[str, Any]] = []
    held: list[dict[str, Any]] = []
    for st in broker.streams.values():
        pin = st.last_ticket.loc if st.last_ticket is not None else None
        if pin is not None:
            pins.append(pin)
        streams.append(_stream_dict(st, pin, is_open=True))
        for q, m in st.held:
            loc = _stored_loc(m)
            if loc is None or not q.durable:
                continue
            held.append({"key": q.key, "stream": st.id, "mid": m.mid, "priority": m.priority,
                         "loc": [loc.segment, loc.offset, loc.length], "inner": m.inner,
                         "size": m.size})
            pins.append(loc)
    streams.extend(_stream_dict(st, None, is_open=False)
                   for st in broker.finished_streams.values())
    sections: dict[str, Any] = {}
    for part in parts:
        data, part_pins = part.capture(broker)
        sections[part.name] = data
        pins.extend(part_pins)
    position = snapshot.Position(last, end, seq)
    snap = snapshot.IndexSnapshot(position, broker.next_mid, lanes, subs, held, streams,
                                  sections)
    return Capture(snap, expected, pins)


def verify(cap: Capture) -> str | None:
    """None when the holders add up to the journal's live counts, segment by segment."""
    counts: Counter[int] = Counter(loc.segment for loc in cap.pins)
    for lane in cap.snap.lanes:
        count_runs(lane.seg, counts)
        for run in lane.packed:
            count_runs(run.columns()[1], counts)
    mine = {seg: n for seg, n in counts.items() if n}
    theirs = {seg: n for seg, n in cap.expected.items() if n}
    if mine == theirs:
        return None
    seg = min(s for s in mine.keys() | theirs.keys() if mine.get(s) != theirs.get(s))
    return (f"holders do not add up to the journal's live records in segment {seg} "
            f"({mine.get(seg, 0)} found, {theirs.get(seg, 0)} live)")


def count_runs(seg: array, counts: Counter[int]) -> None:
    """Add each segment number's occurrences in ``seg`` to ``counts``. A lane's segments come in
    long runs (journal order): a range whose bytes equal its first value repeated is counted in
    one memcmp, others are halved; only short ranges are counted item by item. Every step is
    one short C call, so a worker thread doing this leaves the event loop the GIL."""
    data = seg.tobytes()
    size = seg.itemsize
    ranges = [(0, len(seg))]
    while ranges:
        lo, hi = ranges.pop()
        if hi - lo <= _SHORT_RANGE:
            counts.update(seg[lo:hi])
            continue
        first = seg[lo]
        if data[lo * size:hi * size] == array(seg.typecode, (first,)).tobytes() * (hi - lo):
            counts[first] += hi - lo
            continue
        mid = (lo + hi) // 2
        ranges += [(mid, hi), (lo, mid)]


def _capture_queue(q: Queue, lanes: list[snapshot.Lane], unwritten: Iterable[Message]
                   ) -> str | None:
    """Append the queue's lanes: unacked messages, those set aside and those whose removal
    waits for their bytes first (where their return would put them: a restart from the
    snapshot gives them back), then each lane's in-memory head, then its paged-out tail."""
    unacked: dict[int, list[Message]] = defaultdict(list)
    for m in [*q.pending.aside.values(), *unwritten]:
        unacked[m.priority].append(m)
    for c in q.consumers:
        for m in [*c.inflight.values(), *(m for ms in c.stream_acked.values() for m in ms)]:
            unacked[m.priority].append(m)
    heads = {prio: (head, tail) for prio, head, tail in q.pending.lanes()}
    for prio in sorted(heads.keys() | unacked.keys()):
        lane = snapshot.make_lane(q.key, prio)
        head, tail = heads.get(prio, ((), None))
        for m in [*sorted(unacked.get(prio, ()), key=lambda m: m.mid), *head]:
            if _add(lane, m):
                return f"message {m.mid} of {q.key} has an unknown record layout"
        if tail is not None and _add_tail(lane, tail):
            return f"a paged-out message of {q.key} has an unknown record layout"
        if len(lane):
            lanes.append(lane)
    return None


def _add_tail(lane: snapshot.Lane, tail: SpillFifo) -> bool:
    """Paged-out slots, block by block. A packed block of journal slots is kept by reference
    (its bytes are immutable: the cursor packs anew when it changes a block); an open block's
    journal slots are copied column by column (memcpy speed), and the few other slots
    (messages not yet durable, or redelivered: still objects) one by one."""
    dst = lane.columns()
    for i, j, packed, fields, k in tail.pieces():
        if packed is not None:
            lane.add_packed(packed, k, j - i)
            continue
        assert fields is not None
        mids, src = fields[0], fields[1]
        with memoryview(src) as view:
            marks = view[k:k + j - i].tobytes()
        others: list[int] = []
        if marks.count(0) != len(marks):  # bytes.count: C speed, unlike array.count
            marks = marks.translate(_NONZERO_IS_ONE)
            x = marks.find(b"\x01")
            while x >= 0:
                others.append(x)
                x = marks.find(b"\x01", x + 1)
        start = 0
        for x in [*others, j - i]:
            if start < x:
                for col, field in zip(dst, (mids, *fields[2:]), strict=True):
                    col.extend(field[k + start:k + x])
            start = x + 1
            if x < j - i and src[k + x] == OBJ and _add(lane, tail.objs[mids[k + x]]):
                return True
            # TEMP slots hold non-persistent messages: gone after any restart
    return False


def _add(lane: snapshot.Lane, m: Message) -> bool:
    """Add one message object if it is stored; True when its record layout is unknown."""
    loc = _stored_loc(m)
    if loc is None:
        return False
    if m.inner < 0:
        return True
    for dst, v in zip(lane.columns(), (m.mid, loc.segment, loc.offset, loc.length, m.inner,
                                       m.size), strict=True):
        dst.append(v)
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
    if st.owner is not None:
        d["owner"] = st.owner
    for name in STREAM_FIELDS:
        d[name] = getattr(st, name)
    return d


def save_snapshot(broker: Broker, parts: Sequence[type[StatePart]],
                  pins: Iterable[Location] = ()) -> None:
    """Run by the closing journal: write the index snapshot, or log why not. ``pins``: records
    the checkpointer retains.

    Never raises: a failed snapshot costs only the next start's speed.
    """
    started = time.monotonic()
    try:
        cap = capture(broker, parts, pins)
        why = cap if isinstance(cap, str) else verify(cap)
        if why is not None:
            log.warning("index snapshot not written (%s)", why)
            return
        assert not isinstance(cap, str)
        journal = broker.store.journal
        nbytes = snapshot.save(journal.directory, cap.snap, journal.fence)
    except Exception:
        log.exception("index snapshot not written")
        return
    log.info("index snapshot written: %d messages, %d bytes in %.3fs", cap.snap.messages,
             nbytes, time.monotonic() - started)
