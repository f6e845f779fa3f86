"""A cursor's lanes and everything a message does on its way through them, per message.

The seam of the cursor (``cursor.py``): this module is what runs for every message - a push
by a producer or a redelivery, a pop or a run taken by the dispatch pass, a refill of the
in-memory head from the paged-out tail, a message set aside by the scheduler - with the
accounting each does (``_hold``/``_unhold``: compiled, their calls are native). It is
compiled in the accelerated build (``setup.py``).
``cursor.PendingList`` adds what works on the cursor as a whole or by id and range (admin
removals, ledger commits, purges and unsubscribes, browsing, compaction, snapshots): none of
it is on a message's path, and it needs no more than the lanes' counts kept here.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Iterator
from operator import itemgetter
from typing import TYPE_CHECKING

from sluicemq.core.paging.blocks import Sealed
from sluicemq.core.paging.pager import Pager
from sluicemq.core.paging.spill import JOURNAL, OBJ, SpillFifo
from sluicemq.core.routing.message import MAX_PRIORITY, Message
from sluicemq.errors import StorageError

_first = itemgetter(0)

if TYPE_CHECKING:
    from sluicemq.core.paging.flow import MemoryAccount
    from sluicemq.storage.snapshot import PackedRun

REFILL_BATCH = 256
MESSAGE_OBJECT_BYTES = 1024
"""Estimated RAM of an in-memory message besides its body: the object, its headers dict and
strings (measured at roughly 1 KiB for typical STOMP headers); larger headers add what they
cost beyond that (``Message.extra``)."""


class Lane:
    __slots__ = ("head", "tail")

    def __init__(self) -> None:
        self.head: deque[Message] = deque()
        self.tail = SpillFifo()


class Lanes:
    """Ten lanes, one per priority; cheap push, push-front (redelivery), pop and take.

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
        self._lanes: list[Lane | None] = [None] * (MAX_PRIORITY + 1)
        self._order: list[tuple[int, Lane]] = []  # (priority, lane) made so far, highest first
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

    def settled(self, msgs: list[Message]) -> None:
        """Paged-out objects became journal slots (their records are durable): they are stored
        now, no longer in memory (``Pager.settle``'s ``Settles``). Without this they stayed
        counted, and were counted again when read back, so the memory account only grew."""
        for msg in msgs:
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
    def _lane(self, priority: int) -> Lane:
        lane = self._lanes[priority]
        if lane is None:
            lane = self._lanes[priority] = Lane()
            self._order = sorted(self._present(), key=_first, reverse=True)
        return lane

    def _present(self) -> Iterator[tuple[int, Lane]]:
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
        # (That test, ``MemoryAccount.cursor_room``, is written out here: this runs once per
        # message.)
        if self.pager is None or (not lane.tail
                                  and (not msg.persistent or self._in_head < self.window)
                                  and (account is None
                                       or account.used + account.output + account.connections
                                       + account.objects < account.high_water)):
            lane.head.append(msg)
            self._in_head += 1
            self._hold(msg)
            return
        if self.pager.page_out(lane.tail, msg, self):
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

    def adopt_sealed(self, priority: int, sealed: Sealed) -> None:
        """Index snapshot: a whole packed block whose facts replay learnt, kept packed."""
        self._lane(priority).tail.adopt_sealed(sealed)
        self._size += sealed.block.n
        self.stored_bytes += sealed.stored_bytes

    def adopt_packed(self, priority: int, run: PackedRun) -> None:
        """Index snapshot: a packed block of slots, kept packed when the run is all of it."""
        fields = run.whole()
        if run.skip == 0 and len(run) == len(fields[0]):
            self.adopt_sealed(priority, Sealed(run.packed, fields))
            return
        a, b = run.skip, run.skip + len(run)
        mid, _src, *rest = (col[a:b] for col in fields)
        self._lane(priority).tail.extend(mid, *rest)
        self._size += len(run)
        self.stored_bytes += sum(rest[-1])

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
                self._unhold(msg)
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

    def _refill(self, lane: Lane, prio: int) -> None:
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
