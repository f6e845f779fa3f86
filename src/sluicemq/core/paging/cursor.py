"""Messages waiting for a consumer, highest JMS priority first, FIFO within a priority.

This is the destination's cursor. Each of the ten priority lanes is an in-memory head (a deque
of ``Message``) followed by a paged-out tail (``SpillFifo``: compact slots pointing at journal
or temp records). Pushes go to the head while the head has room and the tail is empty, so a
consumer that keeps up is served from memory and nothing is read back; once the window (per
destination) or the broker-wide memory budget is full, pushes go to the tail, and the head is
refilled from the tail in batches as consumers drain it. Without a pager (``cursor = "vm"``)
everything stays in memory.

A message may also be *set aside*: taken out of the lanes by a broker service that will remove
it later (the scheduler holds a bucket's messages until each is due) but still the queue's -
counted against the memory budget, browsed, removed and purged by the admin API, captured in
an index snapshot and moved by compaction like any waiting message, only never popped.

The cursor is split where a message's path ends: ``lanes.py`` holds the lanes and what every
message does in them (push, pop, a run taken, a refill, set aside), compiled in the
accelerated build; ``PendingList`` here adds what works on the cursor as a whole or by id and
range - admin removals, ledger commits, purges and unsubscribes, browsing, compaction and
snapshot views - none of it per message.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterator
from operator import attrgetter
from typing import TYPE_CHECKING

from sluicemq.core.paging import cuts
from sluicemq.core.paging.lanes import Lane, Lanes
from sluicemq.core.paging.spill import OBJ, Slot, SpillFifo
from sluicemq.core.routing.message import MAX_PRIORITY, Message
from sluicemq.storage import slotpack
from sluicemq.storage.slotpack import Fields

_mid_of = attrgetter("mid")

if TYPE_CHECKING:
    from sluicemq.storage.segment import Location


class PendingList(Lanes):
    """The destination's cursor (module doc): the lanes, and taking messages out of them by
    id, by range or all at once, and looking at them whole."""

    __slots__ = ()

    # -- views ---------------------------------------------------------------------------------
    def lanes(self) -> Iterator[tuple[int, deque[Message], SpillFifo]]:
        """(priority, head, tail) of each non-empty lane, in dispatch order within each."""
        for prio, lane in self._present():
            if lane.head or lane.tail:
                yield prio, lane.head, lane.tail

    # -- admin ---------------------------------------------------------------------------------
    def remove(self, mid: int) -> Message | None:
        """Take one message out by id (admin actions, recovery); O(n), not for the hot path."""
        if mid in self.aside:
            return self.take_aside(mid)
        for prio, lane in self._present():
            for k, msg in enumerate(lane.head):
                if msg.mid == mid:
                    return self._take_head_at(lane, k)
            i = lane.tail.index_of(mid)
            if i >= 0:
                slot = lane.tail.delete(i)
                return self._take_slot(lane, slot, prio)
        return None

    def remove_ordered(self, mid: int) -> Message | None:
        """``remove`` for a queue nobody consumes from, whose lanes hold messages in the order
        they came (nothing was ever put back): each lane's head and each ascending run of its
        tail is bisected, so a removal costs O(log n), not a scan (the scheduler's queue)."""
        for prio, lane in self._present():
            head = lane.head
            if head and head[0].mid <= mid <= head[-1].mid:
                k = bisect_left(head, mid, key=_mid_of)
                if k < len(head) and head[k].mid == mid:
                    return self._take_head_at(lane, k)
            tail = lane.tail
            span = tail.indexes()  # one ascending run: removals in the middle keep it so
            k = tail.bisect(mid, span.start, span.stop)
            if k < span.stop and tail.id_at(k) == mid:
                return self._take_slot(lane, tail.delete(k), prio)
        return None

    def _take_head_at(self, lane: Lane, k: int) -> Message:
        msg = lane.head[k]
        del lane.head[k]
        self._size -= 1
        self._in_head -= 1
        self._unhold(msg)
        return msg

    def _take_slot(self, lane: Lane, slot: Slot, prio: int) -> Message:
        assert self.pager is not None
        self._size -= 1
        msg = self.pager.page_in(lane.tail, slot, self.destination, prio)
        if slot[1] == OBJ:
            self._unhold(msg)
        else:
            self.stored_bytes -= slot[6]
        return msg

    def remove_seqs(self, lo: int, hi: int, limit: int,
                    only: set[int] | None = None) -> list[Message]:
        """Take out up to ``limit`` messages whose id is in ``[lo, hi)`` (and in ``only``, if
        given): ledger commits. Paged-out ones come back as stubs, as in ``drain_stubs``:
        nothing is read back. Tails are cut by bisection (``cuts.py``)."""
        out: list[Message] = []
        for _prio, lane in self._present():
            if len(out) >= limit:
                break
            out += self._take_head(lane, lambda mid: lo <= mid < hi and (
                only is None or mid in only), limit - len(out))
            tail = lane.tail
            for x, y in cuts.tail_cuts(tail, lo, hi, limit - len(out), only):
                for slot in tail.delete_range(x, y):
                    out.append(self._take_stub(tail, slot))
        return out

    def remove_run(self, lo: int, hi: int, limit: int) -> tuple[list[Message], Fields]:
        """``remove_seqs`` of a whole range, column-wise: the message objects taken (lane
        heads, and the few tail slots that are not plain journal slots), and the columns of
        the journal slots taken, with no object per message (a ledger commit of a backlog)."""
        out: list[Message] = []
        run = slotpack.empty()
        for _prio, lane in self._present():
            if len(out) + len(run[0]) >= limit:
                break
            out += self._take_head(lane, lambda mid: lo <= mid < hi,
                                   limit - len(out) - len(run[0]))
            tail = lane.tail
            for a, b in cuts.tail_cuts(tail, lo, hi, limit - len(out) - len(run[0])):
                journal, others = cuts.split_journal(tail.discard_range(a, b))
                self._size -= len(journal[0])
                self.stored_bytes -= sum(journal[6])
                for dst, col in zip(run, journal, strict=True):
                    dst.extend(col)
                out += [self._take_stub(tail, slot) for slot in others]
        return out, run

    def _take_head(self, lane: Lane, wanted: Callable[[int], bool], room: int
                   ) -> list[Message]:
        """Up to ``room`` wanted messages out of a lane's in-memory head."""
        out, lane.head = cuts.head_cut(lane.head, wanted, room)
        for m in out:
            self._unhold(m)
        self._size -= len(out)
        self._in_head -= len(out)
        return out

    def _take_stub(self, tail: SpillFifo, slot: Slot) -> Message:
        assert self.pager is not None
        self._size -= 1
        msg = self.pager.stub(tail, slot, self.destination)
        if slot[1] == OBJ:
            self._unhold(msg)
        else:
            self.stored_bytes -= slot[6]
        return msg

    def __iter__(self) -> Iterator[Message]:
        """Dispatch order: priority 9 down to 0, after the messages set aside; paged-out
        messages are read back one by one (browsing), without leaving the cursor."""
        yield from list(self.aside.values())
        for prio in range(MAX_PRIORITY, -1, -1):
            lane = self._lanes[prio]
            if lane is None:
                continue
            yield from list(lane.head)
            tail = lane.tail
            if tail and self.pager is not None:
                for i in list(tail.indexes()):
                    if i < tail.end:
                        yield self.pager.page_in(tail, tail.slot(i), self.destination, prio,
                                                 consume=False)

    def clear(self, *, aside: bool = True) -> list[Message]:
        """Take every message out, fully read back (admin moves), those set aside first
        (``aside=False``: they stay)."""
        out = [m for mid in list(self.aside if aside else ())
               if (m := self.take_aside(mid)) is not None]
        while (m := self.pop()) is not None:
            out.append(m)
        return out

    def drain_stubs(self) -> list[Message]:
        """Take every message out without reading paged-out ones back: those come as stubs
        carrying only what journaling their removal needs (purge, unsubscribe)."""
        out = [m for mid in list(self.aside) if (m := self.take_aside(mid)) is not None]
        for _prio, lane in self._present():
            while lane.head:
                msg = lane.head.popleft()
                self._unhold(msg)
                out.append(msg)
            tail = lane.tail
            while tail:
                slot = tail.popleft()
                assert self.pager is not None
                msg = self.pager.stub(tail, slot, self.destination)
                if slot[1] == OBJ:
                    self._unhold(msg)
                out.append(msg)
        self._size = self._in_head = 0
        self.stored_bytes = 0
        return out

    def discard(self) -> list[Message]:
        """Drop every message at once (a non-durable subscription that ended): memory and
        temp records are given back in bulk, nothing is read back and no stub is made for
        a temp slot. Returns the messages whose journal records are still to be let go
        (stubs for paged-out ones), as ``drain_stubs`` does.

        Why not ``drain_stubs``: 200 subscribers that stopped reading held 400 paged
        messages each, and a stub apiece when they all closed together held the loop."""
        out = [m for mid in list(self.aside) if (m := self.take_aside(mid)) is not None]
        for _prio, lane in self._present():
            for msg in lane.head:
                self._unhold(msg)
                if msg.ticket is not None:
                    out.append(msg)
            lane.head.clear()
            if lane.tail:
                assert self.pager is not None
                objs, stubs = self.pager.discard(lane.tail, self.destination)
                for msg in objs:
                    self._unhold(msg)
                out += [m for m in objs if m.ticket is not None] + stubs
        self._size = self._in_head = 0
        self.stored_bytes = 0
        return out

    # -- journal compaction --------------------------------------------------------------------
    def journal_slots(self, segment: int) -> Iterator[tuple[int, int, int, int, int]]:
        """(mid, seg, off, length, inner) of paged-out messages stored in ``segment``."""
        for _prio, lane in self._present():
            yield from lane.tail.journal_slots(segment)

    def in_memory(self) -> Iterator[Message]:
        """Message objects this cursor holds (set aside, heads, and tail objects)."""
        yield from self.aside.values()
        for _prio, lane in self._present():
            yield from lane.head
            yield from lane.tail.objs.values()

    def relocate(self, moved: dict[tuple[int, int, int], Location]
                 ) -> set[tuple[int, int, int]]:
        """Point paged-out messages at their compacted copies; returns the keys found."""
        found: set[tuple[int, int, int]] = set()
        for _prio, lane in self._present():
            found |= lane.tail.relocate(moved)
        return found
