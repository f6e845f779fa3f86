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
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterator
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING

from sluicemq.core.paging import cuts
from sluicemq.core.paging.pager import Pager
from sluicemq.core.paging.spill import JOURNAL, OBJ, Slot, SpillFifo
from sluicemq.core.routing.message import MAX_PRIORITY, Message
from sluicemq.errors import StorageError
from sluicemq.storage import slotpack
from sluicemq.storage.slotpack import Fields

_mid_of = attrgetter("mid")
_first = itemgetter(0)

if TYPE_CHECKING:
    from sluicemq.core.paging.flow import MemoryAccount
    from sluicemq.storage.segment import Location
    from sluicemq.storage.snapshot import PackedRun

REFILL_BATCH = 256
MESSAGE_OBJECT_BYTES = 1024
"""Estimated RAM of an in-memory message besides its body: the object, its headers dict and
strings (measured at roughly 1 KiB for typical STOMP headers); larger headers add what they
cost beyond that (``Message.extra``)."""


class _Lane:
    __slots__ = ("head", "tail")

    def __init__(self) -> None:
        self.head: deque[Message] = deque()
        self.tail = SpillFifo()


class PendingList:
    """Ten lanes, one per priority; cheap push, push-front (redelivery) and pop.

    ``bytes`` is the body bytes held in memory; ``stored_bytes`` those of paged-out messages;
    ``large`` those of in-memory messages whose body only the journal keeps (``held``: all
    three, a policy's ``store_limit``); ``memory`` an estimate of the RAM the in-memory
    messages cost (what the limits measure).
    """

    __slots__ = ("_in_head", "_lanes", "_order", "_size", "account", "aside", "bytes",
                 "destination", "large", "memory", "pager", "stored_bytes", "window")

    def __init__(self, pager: Pager | None = None, *, destination: str = "",
                 window: int = 2000, account: MemoryAccount | None = None) -> None:
        # A lane is made for a priority when a message first has it: an idle destination
        # costs two objects, not seventy (the cyclic GC walks every one of them).
        self._lanes: list[_Lane | None] = [None] * (MAX_PRIORITY + 1)
        self._order: list[tuple[int, _Lane]] = []  # (priority, lane) made so far, highest first
        self._size = 0
        self._in_head = 0
        self.bytes = 0
        self.stored_bytes = 0
        self.large = 0
        self.memory = 0
        self.pager = pager
        self.destination = destination
        self.window = window
        self.account = account
        self.aside: dict[int, Message] = {}  # set aside by id (see the module doc)

    def __len__(self) -> int:
        return self._size + len(self.aside)

    @property
    def held(self) -> int:
        """Body bytes of every message here, in memory or not (a policy's ``store_limit``)."""
        return self.bytes + self.stored_bytes + self.large

    @property
    def paged(self) -> int:
        """Messages currently in the tails (paged out or waiting to be)."""
        return self._size - self._in_head

    # -- accounting ----------------------------------------------------------------------------
    def _hold(self, msg: Message) -> None:
        if msg.body is not None:
            body = msg.size
        else:
            body = 0
            self.large += msg.size
        cost = body + MESSAGE_OBJECT_BYTES + msg.extra  # what it holds (once per message)
        self.memory += cost
        self.bytes += body
        account = self.account
        if account is not None:
            account.used += cost
            if account.used > account.peak:
                account.peak = account.used

    def _settled(self, msg: Message) -> None:
        """A paged-out object became a journal slot (its record is durable): it is stored now,
        no longer in memory. Without this it stayed counted, and was counted again when read
        back, so the memory account only grew."""
        self._unhold(msg)
        self.stored_bytes += msg.size

    def _unhold(self, msg: Message) -> None:
        if msg.body is not None:
            body = msg.size
        else:
            body = 0
            self.large -= msg.size
        cost = body + MESSAGE_OBJECT_BYTES + msg.extra
        self.memory -= cost
        self.bytes -= body
        if self.account is not None:
            self.account.used -= cost

    # -- producers and redelivery --------------------------------------------------------------
    def _lane(self, priority: int) -> _Lane:
        lane = self._lanes[priority]
        if lane is None:
            lane = self._lanes[priority] = _Lane()
            self._order = sorted(self._present(), key=_first, reverse=True)
        return lane

    def _present(self) -> Iterator[tuple[int, _Lane]]:
        """(priority, lane) of every lane made so far, lowest priority first."""
        for prio, lane in enumerate(self._lanes):
            if lane is not None:
                yield prio, lane

    def push(self, msg: Message) -> None:
        lane = self._lanes[msg.priority] or self._lane(msg.priority)  # once per message
        self._size += 1
        account = self.account
        # May it stay in memory? The per-destination window bounds persistent messages
        # (paging one out costs a journal read later); a non-persistent one stays while the
        # broker-wide memory budget allows, since paging it out means writing a temp file.
        # (That test, ``MemoryAccount.cursor_room`` and ``_hold`` are written out here: this
        # runs once per message.)
        if self.pager is None or (not lane.tail
                                  and (not msg.persistent or self._in_head < self.window)
                                  and (account is None
                                       or account.used + account.output + account.connections
                                       + account.objects < account.high_water)):
            lane.head.append(msg)
            self._in_head += 1
            if msg.body is not None:
                body = msg.size
            else:
                body = 0
                self.large += msg.size
            cost = body + MESSAGE_OBJECT_BYTES + msg.extra
            self.memory += cost
            self.bytes += body
            if account is not None:
                account.used += cost
                if account.used > account.peak:
                    account.peak = account.used
            return
        if self.pager.page_out(lane.tail, msg, self._settled):
            self.stored_bytes += msg.size
        else:
            self._hold(msg)

    def push_front(self, msg: Message) -> None:
        """Put a returned message back where it was: before everything of its priority."""
        self._lane(msg.priority).head.appendleft(msg)
        self._size += 1
        self._in_head += 1
        self._hold(msg)

    def adopt(self, priority: int, mid: int, seg: int, off: int, length: int, inner: int,
              size: int) -> None:
        """Recovery: append a stored message as a compact slot, without reading it."""
        self._lane(priority).tail.append(mid, JOURNAL, seg, off, length, inner, size)
        self._size += 1
        self.stored_bytes += size

    def adopt_run(self, priority: int, mid: array, seg: array, off: array, length: array,
                  inner: array, size: array) -> None:
        """``adopt`` of many stored messages of one priority (a staged publication)."""
        self._lane(priority).tail.append_run(mid, seg, off, length, inner, size)
        self._size += len(mid)
        self.stored_bytes += sum(size)

    def adopt_lane(self, priority: int, mid: array, seg: array, off: array, length: array,
                   inner: array, size: array) -> None:
        """Index snapshot: ``adopt`` for a whole lane's worth of slots at once."""
        self._lane(priority).tail.extend(mid, seg, off, length, inner, size)
        self._size += len(mid)
        self.stored_bytes += sum(size)

    def adopt_packed(self, priority: int, run: PackedRun) -> None:
        """Index snapshot: a packed block of slots, kept packed when the run is all of it."""
        fields = run.whole()
        tail = self._lane(priority).tail
        if run.skip == 0 and len(run) == len(fields[0]):
            tail.adopt_block(run.packed, fields)
            sizes = fields[6]
        else:
            a, b = run.skip, run.skip + len(run)
            mid, _src, *rest = (col[a:b] for col in fields)
            sizes = rest[-1]
            tail.extend(mid, *rest)
        self._size += len(run)
        self.stored_bytes += sum(sizes)

    def lanes(self) -> Iterator[tuple[int, deque[Message], SpillFifo]]:
        """(priority, head, tail) of each non-empty lane, in dispatch order within each."""
        for prio, lane in self._present():
            if lane.head or lane.tail:
                yield prio, lane.head, lane.tail

    # -- consumers -----------------------------------------------------------------------------
    def pop(self) -> Message | None:
        spilled = self._in_head < self._size  # else no lane has a tail worth looking at
        for prio, lane in self._order:  # pop runs per delivery: only lanes that exist
            if spilled and not lane.head and lane.tail:
                self._refill(lane, prio)
            if lane.head:
                msg = lane.head.popleft()
                self._size -= 1
                self._in_head -= 1
                if msg.body is not None:  # ``_unhold``, inlined
                    body = msg.size
                else:
                    body = 0
                    self.large -= msg.size
                cost = body + MESSAGE_OBJECT_BYTES + msg.extra
                self.memory -= cost
                self.bytes -= body
                if self.account is not None:
                    self.account.used -= cost
                return msg
        return None

    def take(self, limit: int) -> list[Message]:
        """Up to ``limit`` messages, as that many ``pop`` calls give them (``_auto_run``): with
        one priority in use and nothing paged out, off the head in one step, counted out once."""
        order = self._order
        if len(order) != 1 or self._in_head < self._size:
            taken: list[Message] = []
            while len(taken) < limit and (msg := self.pop()) is not None:
                taken.append(msg)
            return taken
        head = order[0][1].head
        count = min(limit, len(head))
        popleft = head.popleft
        taken = [popleft() for _ in range(count)]
        body = cost = large = 0
        for msg in taken:  # ``_unhold`` of each, summed
            if msg.body is not None:
                size = msg.size
            else:
                size = 0
                large += msg.size
            body += size
            cost += size + msg.extra
        cost += MESSAGE_OBJECT_BYTES * count
        self._size -= count
        self._in_head -= count
        self.memory -= cost
        self.bytes -= body
        self.large -= large
        if self.account is not None:
            self.account.used -= cost
        return taken

    def _refill(self, lane: _Lane, prio: int) -> None:
        """Page a batch of the tail into the head (its order is kept: the head was empty)."""
        assert self.pager is not None
        tail = lane.tail
        room = max(1, min(REFILL_BATCH, self.window - self._in_head))
        count = min(room, len(tail))
        records = self.pager.prefetch(tail, count)
        for k in range(count):
            slot = tail.popleft()
            try:
                msg = self.pager.page_in(tail, slot, self.destination, prio, payload=records[k])
            except StorageError as exc:
                if slot[1] != JOURNAL:
                    raise
                self.pager.unreadable(slot, self.destination, exc)
                self._size -= 1
                self.stored_bytes -= slot[6]
                continue
            if slot[1] != OBJ:
                self.stored_bytes -= slot[6]
                self._hold(msg)
            lane.head.append(msg)
            self._in_head += 1

    def restore(self, skipped: list[Message]) -> None:
        """Undo pops of messages nobody could take, keeping their original order."""
        for msg in reversed(skipped):
            self.push_front(msg)

    def set_aside(self, msg: Message) -> None:
        """Keep a popped message in memory as this queue's, out of dispatch (module doc)."""
        self.aside[msg.mid] = msg
        self._hold(msg)

    def take_aside(self, mid: int) -> Message | None:
        """The message set aside under ``mid``, taken out; None if it is not aside (an admin
        removed it, or moved it back into the lanes)."""
        msg = self.aside.pop(mid, None)
        if msg is not None:
            self._unhold(msg)
        return msg

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

    def _take_head_at(self, lane: _Lane, k: int) -> Message:
        msg = lane.head[k]
        del lane.head[k]
        self._size -= 1
        self._in_head -= 1
        self._unhold(msg)
        return msg

    def _take_slot(self, lane: _Lane, slot: Slot, prio: int) -> Message:
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

    def _take_head(self, lane: _Lane, wanted: Callable[[int], bool], room: int
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

