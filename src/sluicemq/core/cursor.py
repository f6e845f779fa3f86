"""Paged-out messages: a compact FIFO of where they are stored, and the pager that moves them.

Why arrays: a backlog of millions of messages must not cost a Python object each. A paged-out
message is one slot in seven parallel ``array``s (~37 bytes): its id, where its record is
(``src``: the journal, the temp store, or still an object), segment/file, offset, record
length, the offset of the message inside the record (non-zero for transaction records) and
its body size. Reading it back rebuilds the full ``Message`` from the record.

A message whose record is not yet durable (or that cannot be paged: redelivered, or stored in
a record whose layout we do not know) waits in the FIFO as an object (``src == OBJ``) and is
turned into a compact slot by ``Pager.settle`` once the journal reports it durable: a failed
batch rewinds the journal, so an undurable location may later hold another record.
"""

from __future__ import annotations

import contextlib
import logging
from array import array
from collections import deque
from collections.abc import Iterator
from itertools import compress, count, islice
from operator import lt
from typing import TYPE_CHECKING

from sluicemq.core.message import Message
from sluicemq.errors import StorageError
from sluicemq.storage import records
from sluicemq.storage.segment import Location
from sluicemq.storage.store import RecoveredTicket

if TYPE_CHECKING:
    from sluicemq.storage.store import Store
    from sluicemq.storage.tempstore import TempStore

log = logging.getLogger("sluicemq.cursor")

JOURNAL, TEMP, OBJ = 0, 1, 2
Slot = tuple[int, int, int, int, int, int, int]  # mid, src, seg, off, length, inner, size
MAX_RUNS = 64  # beyond this many sorted runs, forget them and rescan when next asked


class SpillFifo:
    """FIFO of paged-out messages in parallel arrays; pops from the front in O(1) amortised.

    Range reads find messages by id, so the FIFO also knows where its ids form ascending
    *runs*: usually one (ids are handed out in enqueue order), a few after late arrivals such
    as held stream chunks or restored unacknowledged messages. Each run is binary-searchable.
    """

    __slots__ = ("_runs", "_start", "base", "inner", "length", "mid", "objs", "off", "seg",
                 "size", "src")

    def __init__(self) -> None:
        self.mid = array("Q")
        self.src = array("B")
        self.seg = array("I")
        self.off = array("Q")
        self.length = array("I")
        self.inner = array("I")
        self.size = array("I")
        self.objs: dict[int, Message] = {}  # OBJ slots, by message id
        self._start = 0
        self.base = 0  # slots ever popped from the front: absolute position = base + index
        self._runs: list[int] | None = []  # absolute positions where ascending runs start

    def __len__(self) -> int:
        return len(self.mid) - self._start

    def append(self, mid: int, src: int, seg: int, off: int, length: int, inner: int,
               size: int) -> int:
        """Add a slot at the back; returns its absolute position (stable until removed)."""
        runs = self._runs
        if len(self.mid) == self._start:
            self._runs = [self.base]
        elif runs is not None and mid < self.mid[-1]:
            runs.append(self.base + len(self.mid) - self._start)
            if len(runs) > MAX_RUNS:
                self._runs = None
        self.mid.append(mid)
        self.src.append(src)
        self.seg.append(seg)
        self.off.append(off)
        self.length.append(length)
        self.inner.append(inner)
        self.size.append(size)
        return self.base + len(self.mid) - 1 - self._start

    def extend(self, mid: array, seg: array, off: array, length: array, inner: array,
               size: array) -> None:
        """Append journal slots in bulk, column by column (index snapshot: C speed)."""
        self._runs = None  # found by one scan when a range read first asks
        self.mid.extend(mid)
        self.src.frombytes(bytes(len(mid)))  # JOURNAL == 0
        self.seg.extend(seg)
        self.off.extend(off)
        self.length.extend(length)
        self.inner.extend(inner)
        self.size.extend(size)

    def columns(self) -> tuple[array, array, array, array, array, array, array]:
        """Copies of the live part of every column: mid, src, seg, off, length, inner, size."""
        i = self._start
        return (self.mid[i:], self.src[i:], self.seg[i:], self.off[i:], self.length[i:],
                self.inner[i:], self.size[i:])

    def append_obj(self, msg: Message) -> int:
        self.objs[msg.mid] = msg
        return self.append(msg.mid, OBJ, 0, 0, 0, 0, msg.size)

    def slot(self, i: int) -> Slot:
        """The slot at array index ``i`` (not absolute position)."""
        return (self.mid[i], self.src[i], self.seg[i], self.off[i], self.length[i],
                self.inner[i], self.size[i])

    def popleft(self) -> Slot:
        i = self._start
        s = self.slot(i)
        self._start = i + 1
        self.base += 1
        if self._start >= 4096 and self._start * 2 >= len(self.mid):
            self._trim()
        return s

    def _trim(self) -> None:
        n = self._start
        for a in (self.mid, self.src, self.seg, self.off, self.length, self.inner, self.size):
            del a[:n]
        self._start = 0

    def index_of(self, mid: int, position: int | None = None) -> int:
        """Array index of the slot for ``mid`` (hint: its absolute position), or -1."""
        if position is not None:
            i = position - self.base + self._start
            if self._start <= i < len(self.mid) and self.mid[i] == mid:
                return i
        try:
            i = self.mid.index(mid, self._start)
        except ValueError:
            return -1
        return i

    def settle(self, i: int, src: int, seg: int, off: int, length: int, inner: int) -> None:
        """An OBJ slot becomes a compact one in place."""
        self.objs.pop(self.mid[i], None)
        self.src[i], self.seg[i], self.off[i] = src, seg, off
        self.length[i], self.inner[i] = length, inner

    def delete(self, i: int) -> Slot:
        """Remove the slot at array index ``i`` (admin removals; O(n))."""
        s = self.slot(i)
        for a in (self.mid, self.src, self.seg, self.off, self.length, self.inner, self.size):
            del a[i]
        self._runs = None
        return s

    def delete_range(self, i: int, j: int) -> list[Slot]:
        """Remove the slots at array indexes ``[i, j)``; from the front this is a cheap pop."""
        out = [self.slot(k) for k in range(i, j)]
        if i == self._start:
            self._start = j
            self.base += j - i
            if self._start >= 4096 and self._start * 2 >= len(self.mid):
                self._trim()
        else:
            for a in (self.mid, self.src, self.seg, self.off, self.length, self.inner,
                      self.size):
                del a[i:j]
            self._runs = None
        return out

    def runs(self) -> list[tuple[int, int]]:
        """``[lo, hi)`` array-index windows in which ids ascend, front to back."""
        start, end = self._start, len(self.mid)
        if start == end:
            return []
        if not self._runs:  # unknown (bulk-extended, or more runs than worth tracking)
            m = self.mid
            breaks = compress(count(start + 1), map(lt, islice(m, start + 1, None),
                                                     islice(m, start, None)))
            self._runs = [self.base] + [self.base + i - start for i in breaks]
        runs = self._runs
        front = self.base
        while len(runs) > 1 and runs[1] <= front:
            del runs[0]
        out = []
        for k, pos in enumerate(runs):
            lo = max(pos, front) - front + start
            hi = runs[k + 1] - front + start if k + 1 < len(runs) else end
            if lo < hi:
                out.append((lo, hi))
        return out

    def indexes(self) -> range:
        return range(self._start, len(self.mid))

    def relocate(self, moved: dict[tuple[int, int, int], Location]) -> set[tuple[int, int, int]]:
        """Journal slots whose (seg, off, inner) is in ``moved`` now point at the new location:
        compaction rewrote the message as a plain record there. Returns the keys found."""
        found: set[tuple[int, int, int]] = set()
        segs = {key[0] for key in moved}
        for i in self.indexes():
            if self.src[i] == JOURNAL and self.seg[i] in segs:
                key = (self.seg[i], self.off[i], self.inner[i])
                new = moved.get(key)
                if new is not None:
                    self.seg[i], self.off[i], self.length[i] = new.segment, new.offset, new.length
                    self.inner[i] = 0
                    found.add(key)
        return found

    def clear(self) -> None:
        for a in (self.mid, self.src, self.seg, self.off, self.length, self.inner, self.size):
            del a[:]
        self.objs.clear()
        self._start = 0
        self._runs = []


class Pager:
    """Moves messages between memory and their stored records, for every cursor of a broker.

    ``store`` is the journal side (persistent messages are paged by reference: their record
    already exists); ``temp`` receives non-persistent messages (None: they stay objects).
    """

    def __init__(self, store: Store, temp: TempStore | None, spill_bytes: int) -> None:
        self.store = store
        self.temp = temp
        self.spill_bytes = spill_bytes
        self._cache: tuple[Location, bytes] | None = None  # last transaction record read
        self._unsettled: deque[tuple[SpillFifo, int, Message]] = deque()
        self.paged_in = 0
        self.paged_out = 0

    def page_out(self, fifo: SpillFifo, msg: Message) -> None:
        """Append ``msg`` to ``fifo``: as a compact slot when its record is safe to point at."""
        ticket = msg.ticket
        if msg.deliveries == 0 and msg.persistent and ticket is not None and msg.inner >= 0:
            loc = ticket.loc
            if loc is not None and ticket.seq <= self.store.durable_seq:
                fifo.append(msg.mid, JOURNAL, loc.segment, loc.offset, loc.length, msg.inner,
                            msg.size)
                self.paged_out += 1
                return
            if loc is not None:
                pos = fifo.append_obj(msg)
                self._unsettled.append((fifo, pos, msg))
                return
        elif (msg.deliveries == 0 and not msg.persistent and self.temp is not None
              and msg.body is not None):
            payload = records.encode_message("", msg.mid, msg.timestamp, msg.expires,
                                             msg.priority, msg.headers, msg.body)
            f, off, length = self.temp.append(payload)
            fifo.append(msg.mid, TEMP, f, off, length, 0, msg.size)
            self.paged_out += 1
            return
        fifo.append_obj(msg)

    def settle(self, durable_seq: int) -> None:
        """Journal records up to ``durable_seq`` are on disk: their waiting objects go compact."""
        q = self._unsettled
        while q and q[0][2].ticket.seq <= durable_seq:
            fifo, pos, msg = q.popleft()
            loc = msg.ticket.loc
            if loc is None or fifo.objs.get(msg.mid) is not msg:
                continue  # its batch failed (it stays an object), or it left the cursor
            i = fifo.index_of(msg.mid, pos)
            if i >= 0 and fifo.src[i] == OBJ:
                fifo.settle(i, JOURNAL, loc.segment, loc.offset, loc.length, msg.inner)
                self.paged_out += 1

    def page_in(self, fifo: SpillFifo, slot: Slot, destination: str, priority: int,
                *, consume: bool = True) -> Message:
        """The full message for a slot; ``consume`` frees its temp record (it leaves the cursor)."""
        mid, src, seg, off, length, inner, size = slot
        if src == OBJ:
            return fifo.objs.pop(mid) if consume else fifo.objs[mid]
        self.paged_in += 1
        if src == TEMP:
            assert self.temp is not None
            sm = records.decode_message(self.temp.read(seg, off, length))
            if consume:
                self.temp.release(seg)
            msg = Message(mid, destination, sm.headers, sm.body, persistent=False,
                          priority=sm.priority, expires=sm.expires, timestamp=sm.timestamp)
            return msg
        loc = Location(seg, off, length)
        payload: bytes | memoryview
        if inner:
            cached = self._cache
            if cached is None or cached[0] != loc:
                cached = (loc, self.store.read(loc))
                self._cache = cached
            payload = records.tx_op_at(cached[1], inner)
        else:
            payload = self.store.read(loc)
        sm = records.decode_message(payload)
        body: bytes | None = sm.body if size < self.spill_bytes else None
        msg = Message(mid, destination, sm.headers, body, persistent=True, priority=priority,
                      expires=sm.expires, timestamp=sm.timestamp)
        msg.size = size
        msg.ticket = RecoveredTicket(loc)
        msg.inner = inner
        return msg

    def stub(self, fifo: SpillFifo, slot: Slot, destination: str) -> Message:
        """Just enough of a message to journal its removal (purge): no disk read."""
        mid, src, seg, off, length, inner, size = slot
        if src == OBJ:
            return fifo.objs.pop(mid)
        if src == TEMP:
            assert self.temp is not None
            self.temp.release(seg)
            return Message(mid, destination, {}, None, persistent=False)
        msg = Message(mid, destination, {}, None, persistent=True)
        msg.size = size
        msg.ticket = RecoveredTicket(Location(seg, off, length))
        msg.inner = inner
        return msg

    def unreadable(self, slot: Slot, destination: str, exc: StorageError) -> None:
        """A journal slot whose record fails its checks when read back (damage the start-up
        did not scan: before an index snapshot's anchor, or rot since): the message is lost,
        as a full scan would have lost it, and its record let go; the queue carries on."""
        mid, _src, seg, off, length, _inner, _size = slot
        log.warning("journal: dropped unreadable message %d of %s at segment %d offset %d (%s)",
                    mid, destination, seg, off, exc)
        journal = self.store.journal
        with contextlib.suppress(StorageError):
            journal.release(Location(seg, off, length))
            journal.reclaim()

    def drop(self, fifo: SpillFifo, slot: Slot) -> None:
        """Forget a slot for good (a temp record is freed)."""
        if slot[1] == OBJ:
            fifo.objs.pop(slot[0], None)
        elif slot[1] == TEMP and self.temp is not None:
            self.temp.release(slot[2])


def slots(fifo: SpillFifo) -> Iterator[Slot]:
    """Every slot front to back (a snapshot of indexes: do not mutate while iterating)."""
    for i in fifo.indexes():
        yield fifo.slot(i)

