"""Journal compaction: long-lived messages must not pin many segments.

Segments are deleted oldest first, so one unconsumed message in the oldest segment keeps every
later segment on disk. Compaction copies the live messages of the oldest segment forward, as
new plain message records at the head of the log, and points their holders at the copies; the
old segment then has no live record and is reclaimed.

When: the oldest segment is copied if at most half of it is live (copying frees more than it
writes), or while the journal holds more than ``amplification`` times the bytes of its live
records plus one segment (besides the one being written) - then even a dense oldest segment
is copied, since dead records fill the segments behind it. Otherwise nothing is copied: a
backlog larger than a few segments would be copied round and round for ever (every copy lands
at the head, the next segment becomes the oldest). The journal estimates each segment's live
bytes as its live records x the bytes appended to it per hold (``Journal.live_bytes``); the
oldest segment's are measured exactly, through its holders, before it is copied.

How: the copies are the records' own bytes with the holder's key spliced in (no decoding),
appended a bounded amount per loop turn, so a segment of large records never holds the event
loop for long.

Why two phases: a copy may be pointed at only once it is durable (a failed batch rewinds the
journal and its locations are reused). Phase one appends the copies; a later tick, once they
are durable, moves each holder over and releases the old record. A holder that went away in
between (consumed) leaves an orphan copy, which is journaled as removed like any acked message.
Why per holder: a topic record fanned out to several durable subscriptions is copied once per
subscription still holding it, under that subscription's key, so replay cannot resurrect it for
subscriptions that already consumed it. A copy keeps the message id: replay keeps the newest
record of an id (see persistence/recovery.py). A durable subscription's SUB record is held like a
message and copied forward the same way (replay treats a repeated identical SUB as a no-op).

The planner only acts when it can account for every live record of the segment (the holders
found must match the journal's live count); otherwise - stream pins, acks still in flight - it
waits for a later tick. The caller (the broker) knows where holders are; this module knows the
journal.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from sluicemq.errors import StorageError
from sluicemq.storage import records
from sluicemq.storage.segment import Location
from sluicemq.storage.store import Store, TicketLike

log = logging.getLogger("sluicemq.compaction")

TURN_BYTES = 2 << 20  # copied per loop turn (at least one record)
TURN_RECORDS = 500
SPARSE = 0.5  # an oldest segment at most this much live is always worth copying
RECHECK_SECONDS = 10.0  # between exact measures of a recovered, seemingly dense oldest segment


@dataclass(frozen=True, slots=True)
class Holder:
    """One queue's hold on one stored message: its key, the id, where the message is."""

    key: str
    mid: int  # -1: the SUB record that defines durable subscription ``key``
    loc: Location
    inner: int  # offset of the message inside a transaction record, 0 for a message record


FindHolders = Callable[[int], list[Holder] | None]  # None: cannot account for the segment
Relocate = Callable[[list[tuple[Holder, TicketLike]]], list[bool]]  # found and moved?
Schedule = Callable[[Callable[[], None]], object]


class Compactor:
    """Copies the oldest segment's live messages forward, at most one segment at a time."""

    def __init__(self, store: Store, find_holders: FindHolders, relocate: Relocate,
                 schedule: Schedule, *, amplification: float = 1.5,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.find_holders = find_holders
        self.relocate = relocate
        self._schedule = schedule
        self.amplification = amplification  # journal bytes allowed per live byte
        self._clock = clock
        self._measured: tuple[int, int, float] | None = None  # oldest: segment, count, when
        self._todo: list[Holder] = []  # holders still to copy (phase one, paced)
        self._cache: tuple[Location, bytes] | None = None
        self._plan: list[tuple[Holder, TicketLike]] = []
        self._plan_seq = 0  # the last copy's record; 0 while copies are still being appended
        self._stopped = False
        self.compacted_segments = 0
        self.copied = 0

    @property
    def busy(self) -> bool:
        """Copies are appended but their holders not yet moved (no index snapshot now: the
        copies are retained by nobody the snapshot could name)."""
        return bool(self._plan or self._todo)

    def live_bytes(self) -> int:
        """Estimated bytes of live records in the full segments (not the active one)."""
        return sum(est for _seg, _live, est in self.store.journal.live_bytes()[:-1])

    def tick(self) -> None:
        """Once a second: maybe start a plan (one in progress goes on by itself: copies turn
        by turn, then the move once they are durable, then the next segment while
        compaction is still worth it)."""
        if not self.busy:
            self._next()

    def _next(self) -> None:
        if self._stopped:
            return
        live = self.store.journal.live_bytes()
        if len(live) < 3 or not live[0][1]:
            return
        segment, count, estimate = live[0]
        over = self._over_goal(live)
        size = self.store.journal.segment_bytes
        if not over and estimate > SPARSE * size and not self._recheck(segment, count):
            return
        holders = self.find_holders(segment)
        if holders is None or len(holders) != count:
            return
        exact = sum(length for _off, length in {(h.loc.offset, h.loc.length) for h in holders})
        self._measured = (segment, count, self._clock())
        if not over and exact > SPARSE * size:
            return
        self._todo = holders[::-1]  # popped from the end: oldest holder first
        self._copy_some()
        log.info("compacting journal segment %d: copying %d live message(s) forward (%d "
                 "bytes)", segment, count, exact)

    def _over_goal(self, live: list[tuple[int, int, int]]) -> bool:
        """Is the journal beyond ``amplification`` x its live bytes + one segment, besides
        the segment being written?"""
        full = live[:-1]
        size = self.store.journal.segment_bytes
        return len(full) * size > self.amplification * sum(est for *_, est in full) + size

    def _recheck(self, segment: int, count: int) -> bool:
        """Measure a seemingly dense oldest segment exactly? Only when its estimate is a guess
        (written before a restart: counted as full) and it changed, at most every
        ``RECHECK_SECONDS``: measuring a segment of a large backlog reads many slots."""
        if segment in self.store.journal.weighed():
            return False
        last = self._measured
        return last is None or (last[:2] != (segment, count)
                                and self._clock() - last[2] >= RECHECK_SECONDS)

    def stop(self) -> None:
        """A clean stop: no new plan; the copies of the one in progress are appended now, so
        that ``finish_durable`` can complete it once they are durable."""
        self._stopped = True
        while self._todo:
            self._copy_some()

    def finish_durable(self) -> None:
        """Move the holders of a plan whose copies are all durable, now."""
        if self._plan and self._plan_seq and self.store.durable_seq >= self._plan_seq:
            self._finish()

    # -- copying (phase one) ---------------------------------------------------------------
    def _copy_some(self) -> None:
        """Append copies for up to ``TURN_BYTES`` / ``TURN_RECORDS``; the rest on later turns."""
        copied_bytes = 0
        for _ in range(TURN_RECORDS):
            if not self._todo or copied_bytes >= TURN_BYTES:
                break
            h = self._todo.pop()
            payload = self._payload(h)
            if payload is None:
                continue
            copied_bytes += len(payload)
            if h.mid < 0:
                ticket = self.store.keep_sub(records.decode_sub(payload))
            else:
                ticket = self.store.append_record(
                    records.MSG, records.rekey_message(payload, h.key, h.mid))
                self.store.hold(ticket)
            self._plan.append((h, ticket))
        if self._todo:
            self._schedule(self._copy_some)
            return
        self._cache = None
        if self._plan:
            self._plan_seq = self.store.flush()
            self.store.after_durable(self._plan_seq, self._durable)

    def _durable(self) -> None:
        self.finish_durable()
        self._next()

    def _payload(self, h: Holder) -> bytes | memoryview | None:
        """The holder's message (or SUB) payload; None once its segment is gone (everything
        in it was consumed meanwhile)."""
        cache = self._cache
        if cache is None or cache[0] != h.loc:
            try:
                cache = self._cache = (h.loc, self.store.read(h.loc))
            except StorageError:
                return None
        return records.tx_op_at(cache[1], h.inner) if h.inner else cache[1]

    # -- moving the holders (phase two) ---------------------------------------------------
    def _finish(self) -> None:
        plan, self._plan, self._plan_seq = self._plan, [], 0
        if any(t.loc is None for _, t in plan):  # the copies' batch failed: try again later
            return
        moved = self.relocate(plan)
        journal = self.store.journal
        for (holder, ticket), found in zip(plan, moved, strict=True):
            if found:
                journal.release(holder.loc)
                self.copied += 1
            elif holder.mid < 0:  # unsubscribed meanwhile: its UNSUB follows the copy
                self.store.release_after(self.store.flush(), [ticket])
            else:  # consumed meanwhile: the copy is removed like the original was
                self.store.remove_copy(holder.key, holder.mid, ticket)
        self.compacted_segments += 1
        journal.reclaim()
