"""Journal compaction: long-lived messages must not pin many segments.

Segments are deleted oldest first, so one unconsumed message in the oldest segment keeps every
later segment on disk. Compaction copies the live messages of the oldest segment forward, as
new plain message records at the head of the log, and points their holders at the copies; the
old segment then has no live record and is reclaimed.

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
from collections.abc import Callable
from dataclasses import dataclass

from sluicemq.storage import records
from sluicemq.storage.segment import Location
from sluicemq.storage.store import Store, TicketLike

log = logging.getLogger("sluicemq.compaction")


@dataclass(frozen=True, slots=True)
class Holder:
    """One queue's hold on one stored message: its key, the id, where the message is."""

    key: str
    mid: int  # -1: the SUB record that defines durable subscription ``key``
    loc: Location
    inner: int  # offset of the message inside a transaction record, 0 for a message record


FindHolders = Callable[[int], list[Holder] | None]  # None: cannot account for the segment
Relocate = Callable[[list[tuple[Holder, TicketLike]]], list[bool]]  # found and moved?


class Compactor:
    """Copies the oldest segment's live messages forward, at most one segment at a time."""

    def __init__(self, store: Store, find_holders: FindHolders, relocate: Relocate, *,
                 min_segments: int = 4, max_live: int = 10_000) -> None:
        self.store = store
        self.find_holders = find_holders
        self.relocate = relocate
        self.min_segments = min_segments  # compact only when this many segments are on disk
        self.max_live = max_live  # and the oldest holds no more records than this
        self._plan: list[tuple[Holder, TicketLike]] = []
        self._plan_seq = 0
        self.compacted_segments = 0
        self.copied = 0

    @property
    def busy(self) -> bool:
        """Copies are appended but their holders not yet moved (no index snapshot now: the
        copies are retained by nobody the snapshot could name)."""
        return bool(self._plan)

    def tick(self) -> None:
        """Advance: finish a durable plan, or start one for the oldest segment."""
        if self._plan:
            if self.store.durable_seq >= self._plan_seq:
                self._finish()
            return
        journal = self.store.journal
        live = journal.live_counts()
        if len(live) < self.min_segments:
            return
        segment, count = live[0]
        if count == 0 or count > self.max_live:
            return
        holders = self.find_holders(segment)
        if holders is None or len(holders) != count:
            return
        self._start(holders)

    def _start(self, holders: list[Holder]) -> None:
        cache: tuple[Location, bytes] | None = None
        for h in holders:
            if cache is None or cache[0] != h.loc:
                cache = (h.loc, self.store.read(h.loc))
            payload = records.tx_op_at(cache[1], h.inner) if h.inner else cache[1]
            if h.mid < 0:
                ticket = self.store.append_sub(records.decode_sub(payload))
            else:
                sm = records.decode_message(payload)
                ticket = self.store.append_message(h.key, h.mid, sm.timestamp, sm.expires,
                                                   sm.priority, sm.headers, sm.body)
            self.store.hold(ticket)
            self._plan.append((h, ticket))
        self._plan_seq = self.store.flush()
        log.info("compacting journal segment %d: copying %d live message(s) forward",
                 holders[0].loc.segment, len(holders))

    def _finish(self) -> None:
        plan, self._plan = self._plan, []
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
                self.store.remove(holder.key, holder.mid, ticket)
        self.compacted_segments += 1
        journal.reclaim()
