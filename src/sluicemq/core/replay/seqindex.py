"""A queue's retained messages seen by sequence number (= message id), for range reads.

Retained means still in the queue: pending (in memory or paged out), delivered but not yet
acknowledged, or held back (a stream chunk waiting for its final chunk, a `restart` stream's
held acks). Pending order is by priority and arrival; ranges are by seq. So the view merges:

* every ascending *run* of every priority lane's paged-out tail (``SpillFifo.runs``),
  binary-searched in place (``SpillFifo.bisect``: blocks by their first id, then one block) -
  a backlog of millions costs O(log n) and one block unpacked per question, never a copy;
* the in-memory messages (lane heads, consumers' unacked ones, held chunks), bounded by the
  cursor window and prefetch, sorted once per view.

A view is only valid until the queue changes: build one per question (or per paced step of a
range read), use it, drop it. It reads nothing from disk; ``Fetcher`` does, for what is sent.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Protocol

from sluicemq.core.paging.pager import Pager
from sluicemq.core.paging.spill import JOURNAL, OBJ, SpillFifo
from sluicemq.core.routing.message import Message
from sluicemq.storage import records
from sluicemq.storage.segment import Location
from sluicemq.storage.slotpack import Fields
from sluicemq.storage.store import RecoveredTicket

if TYPE_CHECKING:
    from sluicemq.core.paging.cursor import PendingList
    from sluicemq.core.routing.queue import Consumer
    from sluicemq.storage.store import Store


class Retaining(Protocol):
    """What a view reads of a queue: its cursor and its consumers' unacknowledged messages (a
    shape, so that a spec can hand in a cursor without building a queue and its broker)."""

    @property
    def pending(self) -> PendingList: ...

    @property
    def consumers(self) -> Sequence[Consumer]: ...


@dataclass(frozen=True, slots=True)
class TailRef:
    """Where a paged-out message is right now: lane priority, its FIFO, array index."""

    priority: int
    tail: SpillFifo
    index: int


Found = Message | TailRef


def in_memory(queue: Retaining, held: Iterable[Message] = ()) -> Iterator[Message]:
    """Every retained message object of ``queue`` that is not in a tail."""
    for _prio, head, _tail in queue.pending.lanes():
        yield from head
    for c in queue.consumers:
        yield from c.inflight.values()
        for msgs in c.stream_acked.values():
            yield from msgs
    yield from held


class SeqView:
    """The retained messages of one queue, answerable by seq without touching the disk."""

    def __init__(self, queue: Retaining, held: Iterable[Message] = ()) -> None:
        self.runs: list[tuple[int, SpillFifo, int, int]] = []  # prio, tail, lo, hi
        for prio, _head, tail in queue.pending.lanes():
            for lo, hi in tail.runs():
                self.runs.append((prio, tail, lo, hi))
        mem = sorted(in_memory(queue, held), key=_mid)
        self.mem = mem
        self.mem_mids = [m.mid for m in mem]

    # -- questions ---------------------------------------------------------------------------
    def lowest(self) -> int | None:
        """The lowest retained seq, or None when nothing is retained."""
        firsts = [tail.id_at(lo) for _p, tail, lo, _hi in self.runs]
        if self.mem_mids:
            firsts.append(self.mem_mids[0])
        return min(firsts) if firsts else None

    def count(self, a: int, b: int) -> int:
        """Retained messages with seq in ``[a, b)``."""
        if a >= b:
            return 0
        n = bisect_left(self.mem_mids, b) - bisect_left(self.mem_mids, a)
        for _p, tail, lo, hi in self.runs:
            i = tail.bisect(a, lo, hi)
            n += tail.bisect(b, i, hi) - i
        return n

    def nth(self, a: int, b: int, rank: int) -> int | None:
        """The seq of the ``rank``-th (0-based) retained message in ``[a, b)``, or None."""
        if rank < 0 or rank >= self.count(a, b):
            return None
        lo, hi = a, b - 1  # the answer is the smallest x with count(a, x + 1) > rank
        while lo < hi:
            mid = (lo + hi) // 2
            if self.count(a, mid + 1) > rank:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def cuts(self, a: int, b: int, slices: int) -> list[int]:
        """Up to ``slices - 1`` seqs cutting ``[a, b)`` into slices of about equal count."""
        n = self.count(a, b)
        k = min(slices, n)
        out: list[int] = []
        for i in range(1, k):
            cut = self.nth(a, b, i * n // k)
            if cut is not None and (not out or cut > out[-1]):
                out.append(cut)
        return out

    def batch(self, a: int, b: int, limit: int) -> list[tuple[int, Found]]:
        """The (up to ``limit``) lowest retained seqs in ``[a, b)``, each with where it is."""
        if a >= b or limit <= 0:
            return []
        sources: list[Iterator[tuple[int, Found]]] = []
        i = bisect_left(self.mem_mids, a)
        j = bisect_left(self.mem_mids, b, i)
        if i < j:
            sources.append((m.mid, m) for m in self.mem[i:min(j, i + limit)])
        for prio, tail, lo, hi in self.runs:
            s = tail.bisect(a, lo, hi)
            e = min(tail.bisect(b, s, hi), s + limit)
            if s < e:
                sources.append(_tail_items(prio, tail, s, e))
        if len(sources) == 1:
            return list(sources[0])
        return list(islice(heapq.merge(*sources, key=_first), limit))

    def sources(self, a: int, b: int, limit: int
                ) -> list[list[Message] | tuple[int, SpillFifo, int, Fields]]:
        """What ``batch`` merges, unmerged: the in-memory messages of ``[a, b)`` (ascending,
        at most ``limit``) and, for each tail run, (priority, tail, array index of the first
        slot, the slot columns of its part of the range) - column batches take slots without
        an object per message."""
        if a >= b or limit <= 0:
            return []
        out: list[list[Message] | tuple[int, SpillFifo, int, Fields]] = []
        i = bisect_left(self.mem_mids, a)
        j = bisect_left(self.mem_mids, b, i)
        if i < j:
            out.append(self.mem[i:min(j, i + limit)])
        for prio, tail, lo, hi in self.runs:
            s = tail.bisect(a, lo, hi)
            e = min(tail.bisect(b, s, hi), s + limit)
            if s < e:
                out.append((prio, tail, s, tail.columns(s, e)))
        return out

    def find(self, seq: int) -> Found | None:
        """Where the retained message ``seq`` is, or None."""
        i = bisect_left(self.mem_mids, seq)
        if i < len(self.mem_mids) and self.mem_mids[i] == seq:
            return self.mem[i]
        for prio, tail, lo, hi in self.runs:
            k = tail.bisect(seq, lo, hi)
            if k < hi and tail.id_at(k) == seq:
                return TailRef(prio, tail, k)
        return None


def _mid(m: Message) -> int:
    return m.mid


def _first(item: tuple[int, Found]) -> int:
    return item[0]


def _tail_items(prio: int, tail: SpillFifo, s: int, e: int) -> Iterator[tuple[int, Found]]:
    for k, mid in enumerate(tail.ids(s, e), s):
        yield mid, TailRef(prio, tail, k)


class Fetcher:
    """Reads the messages a view found, without taking them out of their queue.

    A paged-out message is decoded from its journal record in one read (the body kept, even
    a large one: it is about to be written); the last transaction record read is cached,
    since a committed transaction stores many messages in one record.
    """

    def __init__(self, store: Store, pager: Pager, destination: str) -> None:
        self.store = store
        self.pager = pager
        self.destination = destination
        self._cached: tuple[Location, bytes] | None = None

    def message(self, found: Found) -> Message:
        if isinstance(found, Message):
            return found
        tail, k = found.tail, found.index
        slot = tail.slot(k)
        mid, src, seg, off, length, inner, size = slot
        if src != JOURNAL:
            return self.pager.page_in(tail, slot, self.destination, found.priority,
                                      consume=False)
        loc = Location(seg, off, length)
        if inner:
            cached = self._cached
            if cached is None or cached[0] != loc:
                cached = self._cached = (loc, self.store.read(loc))
            payload: bytes | memoryview = records.tx_op_at(cached[1], inner)
        else:
            payload = self.store.read(loc)
        sm = records.decode_message(payload)
        msg = Message(mid, self.destination, sm.headers, sm.body, persistent=True,
                      priority=found.priority, expires=sm.expires, timestamp=sm.timestamp)
        msg.size = size
        msg.ticket = RecoveredTicket(loc)
        msg.inner = inner
        return msg

    def headers(self, found: Found) -> dict[str, str]:
        """Just the headers (streams mode classifies messages by them)."""
        if isinstance(found, Message):
            return found.headers
        mid, src, seg, off, length, inner, _size = found.tail.slot(found.index)
        if src == OBJ:
            return found.tail.objs[mid].headers
        if src != JOURNAL:
            return self.message(found).headers
        return self.store.peek_headers(Location(seg, off, length), inner)
