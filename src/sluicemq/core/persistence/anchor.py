"""An anchored table: in-memory facts that must outlive the journal records they came from.

Why: the broker learns some facts from records it writes anyway (a published batch from its
STAGE_PUBLISH record, a producer's sequence number from its message record), and those records
are deleted with their segment once nothing else needs them. Rather than pinning every such
record, the table keeps one memo record of its whole content pinned: the *anchor*. Segments are
deleted oldest first, so while the anchor exists every later record exists too; whatever came
before it is in the anchor's content. Replay therefore sees the newest anchor and every fact
learnt after it.

When the anchor's segment becomes the oldest one (it is what keeps that segment on disk), a new
anchor is written at the head of the log and the old one is released once the new one is
durable. So each table costs one small record per reclaimed segment, nothing per message. An
empty table needs no anchor: whatever older records say has expired by the same rule replay
applies.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sluicemq.storage.segment import Location
from sluicemq.storage.staging_records import encode_memo
from sluicemq.storage.store import RecoveredTicket, Store, TicketLike


class Anchor:
    """The pinned memo record (type ``rtype``) of one table; ``dump`` gives the table's content
    as JSON data."""

    def __init__(self, store: Store, rtype: int, table: str, dump: Callable[[], Any]) -> None:
        self.store = store
        self.rtype = rtype
        self.table = table
        self.dump = dump
        self.ticket: TicketLike | None = None
        self.rewrites = 0

    @property
    def loc(self) -> Location | None:
        return self.ticket.loc if self.ticket is not None else None

    def ensure(self) -> None:
        """Make sure an anchor exists (call after adding facts, before their receipt)."""
        if self.ticket is None or self.ticket.loc is None:
            self.write()

    def write(self) -> None:
        """Append the table as a new anchor; the old one is released once the new one is durable."""
        old = [self.ticket] if self.ticket is not None else []
        self.ticket = self.store.keep(self.rtype, encode_memo(self.table, self.dump()),
                                      replaces=old)
        self.rewrites += 1

    def tick(self, empty: bool) -> None:
        """Once a second: drop the anchor of an empty table; move one that holds the oldest
        segment to the head of the log."""
        ticket = self.ticket
        if ticket is None or ticket.loc is None:
            self.ticket = None  # never written, or its write failed (disk full): write again
            if not empty:
                self.write()
            return
        if empty:
            self.store.let_go([ticket])
            self.ticket = None
            return
        self.move_if_oldest()

    def move_if_oldest(self) -> None:
        """Rewrite the anchor at the head of the log when its segment is the oldest one (it
        is then what keeps that segment, and every empty one after it, on disk). Called by the
        tick and after each reclaim (``Store.reclaim_watchers``)."""
        loc = self.loc
        if loc is None:
            return
        live = self.store.journal.live_counts()
        if len(live) > 1 and loc.segment == live[0][0]:
            self.write()

    def adopt(self, loc: Location | None) -> None:
        """Recovery: the anchor found on disk (already retained by the caller)."""
        self.ticket = RecoveredTicket(loc) if loc is not None else None

