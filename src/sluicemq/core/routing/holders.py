"""Who holds which journal records: the broker's answer to compaction.

Compaction (``storage/compaction.py``) copies the few live records of an old segment forward;
it asks who holds records of a segment (``holders``) and then points each holder at its copy
(``relocate``). Holders are queue slots (in memory or paged out), in-flight and held-back
messages, messages an ack:auto consumer took whose removal waits for their bytes to leave user
space (``StoreLater.unwritten_of``), durable subscriptions' SUB records, and open streams' tail
pins (which cannot move). ``JournalHolders`` asks these of every queue that may hold journal
records - a destination's or a durable subscription's - for compaction and start-up recounts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from sluicemq.core.paging.spill import JOURNAL
from sluicemq.core.routing.message import Message
from sluicemq.core.routing.queue import Queue
from sluicemq.core.routing.streams import StreamTable
from sluicemq.storage import slotpack
from sluicemq.storage.compaction import Holder
from sluicemq.storage.segment import Location
from sluicemq.storage.store import TicketLike


def held_objects(q: Queue, streams: StreamTable,
                 unwritten: dict[str, list[Message]]) -> Iterator[Message]:
    """Every message object of a queue that may pin a journal record."""
    yield from q.pending.in_memory()
    yield from unwritten.get(q.key, ())
    for c in q.consumers:
        yield from c.inflight.values()
        for msgs in c.stream_acked.values():
            yield from msgs
    for st in streams.open.values():
        for hq, m in st.held:
            if hq is q:
                yield m


def stored_mids(q: Queue, streams: StreamTable) -> Iterator[int]:
    """The id of every journal record ``q`` holds, paged out or not (start-up recounts).
    Paged-out slots are read a block at a time: a whole lane's columns at once (~10 MiB for
    200k slots) were left in glibc's heap once freed (core/limits/usershare.py)."""
    for m in held_objects(q, streams, {}):
        if m.persistent and m.ticket is not None and m.ticket.loc is not None:
            yield m.mid
    for _prio, _head, tail in q.pending.lanes():
        for i, j, packed, fields, k in tail.pieces():
            if fields is None:  # a sealed block of journal slots only
                assert packed is not None
                yield from slotpack.unpack(packed)[0][k:k + j - i]
                continue
            mids, srcs = fields[0][k:k + j - i], fields[1][k:k + j - i]
            yield from (mid for mid, src in zip(mids, srcs, strict=True) if src == JOURNAL)


def holders(segment: int, queues: Iterable[Queue], sub_tickets: dict[str, TicketLike],
            streams: StreamTable, unwritten: dict[str, list[Message]]) -> list[Holder] | None:
    """Who holds records of ``segment``; None when something we cannot move does."""
    for st in streams.open.values():
        pin = st.last_ticket
        if pin is not None and pin.loc is not None and pin.loc.segment == segment:
            return None
    found = [Holder(key, -1, t.loc, 0) for key, t in sub_tickets.items()
             if t.loc is not None and t.loc.segment == segment]
    for q in queues:
        for mid, seg, off, length, inner in q.pending.journal_slots(segment):
            found.append(Holder(q.key, mid, Location(seg, off, length), inner))
        for m in held_objects(q, streams, unwritten):
            loc = m.ticket.loc if m.ticket is not None else None
            if loc is not None and loc.segment == segment:
                if m.inner < 0:
                    return None
                found.append(Holder(q.key, m.mid, loc, m.inner))
    return found


def relocate(plan: list[tuple[Holder, TicketLike]], queues: Iterable[Queue],
             sub_tickets: dict[str, TicketLike], streams: StreamTable,
             unwritten: dict[str, list[Message]]) -> list[bool]:
    """Point each holder at its durable copy; False where the holder is gone."""
    by_key: dict[str, Queue] = {q.key: q for q in queues}
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
            current = sub_tickets.get(h.key)
            ok = current is not None and current.loc == h.loc
            if ok:
                sub_tickets[h.key] = t
            result.append(ok)
            continue
        k = (h.loc.segment, h.loc.offset, h.inner)
        ok = k in found[h.key]
        q = by_key.get(h.key)
        if not ok and q is not None:
            for m in held_objects(q, streams, unwritten):
                if m.mid == h.mid and m.ticket is not None and m.ticket.loc == h.loc:
                    m.ticket, m.inner = t, 0
                    ok = True
                    break
        result.append(ok)
    return result


class JournalHolders:
    """The broker's queues as holders of journal records: what compaction asks (``holders``,
    ``relocate``) and the start-up recount of records several durable subscriptions hold."""

    def __init__(self, queues: dict[str, Queue], durables: Mapping[str, tuple[object, Queue]],
                 sub_tickets: dict[str, TicketLike], streams: StreamTable,
                 unwritten_of: Callable[[], dict[str, list[Message]]]) -> None:
        self._queues = queues
        self._durables = durables  # subscription key -> (its SUB record, its queue)
        self._sub_tickets = sub_tickets
        self._streams = streams
        self._unwritten_of = unwritten_of  # StoreLater's: removals waiting for their bytes

    def queues(self) -> Iterator[Queue]:
        """Every queue that may hold journal records."""
        yield from self._queues.values()
        for _, q in self._durables.values():
            yield q

    def holders(self, segment: int) -> list[Holder] | None:
        return holders(segment, self.queues(), self._sub_tickets, self._streams,
                       self._unwritten_of())

    def relocate(self, plan: list[tuple[Holder, TicketLike]]) -> list[bool]:
        return relocate(plan, self.queues(), self._sub_tickets, self._streams,
                        self._unwritten_of())

    def shared_mids(self) -> Iterator[int]:
        """The id of each record a durable subscription holds, once per holder; nothing below
        two subscriptions (a record has one holder at most: no pass over the backlog)."""
        if len(self._durables) < 2:
            return
        for _, q in self._durables.values():
            yield from stored_mids(q, self._streams)
