"""Parked parts must not hold the journal back: their records move off the oldest segment.

Segments are deleted oldest first, so one parked part in the oldest segment would keep every
later segment on disk until it is published or times out - under load, enough to reach
``store_limit``. Like compaction for messages, the mover copies such parts (every record of
the part, in order, final last: replay then parks the copy, which supersedes the original) to
the head of the log, and once the copies are durable points the part at them and lets the
originals go. A part published or discarded in between keeps its original records; its copies
are discarded with a STAGE_DISCARD record, so replay does not park them again.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sluicemq.core.staging.book import ParkedPart, StageBook
from sluicemq.storage.segment import Location
from sluicemq.storage.staging_records import STAGE, STAGE_DISCARD, encode_discard
from sluicemq.storage.store import Store, TicketLike

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger("sluicemq.staging")


class PartMover:
    """Two phases over broker ticks: copy the oldest segment's parked parts, then switch."""

    def __init__(self, store: Store, book: Callable[[], StageBook]) -> None:
        self.store = store
        self.book = book
        self._moves: list[tuple[ParkedPart, list[TicketLike], list[TicketLike]]] = []
        self._until = 0  # the copies are durable once durable_seq reaches this
        self.moved_parts = 0

    def tick(self) -> None:
        if self._moves:
            if self.store.durable_seq >= self._until:
                self._switch()
            return
        live = self.store.journal.live_counts()
        if len(live) < 2:
            return
        oldest = live[0][0]
        for part in self.book().all_parts():
            if any(t.loc is not None and t.loc.segment == oldest for t in part.tickets):
                self._copy(part)
        if self._moves:
            self._until = self.store.flush()

    def _copy(self, part: ParkedPart) -> None:
        olds = part.tickets
        locs = [t.loc for t in olds if t.loc is not None]
        if len(locs) < len(olds):
            return
        news = [self.store.keep(STAGE, self.store.read(loc)) for loc in locs]
        self._moves.append((part, olds, news))

    def _switch(self) -> None:
        moves, self._moves = self._moves, []
        for part, olds, news in moves:
            if any(t.loc is None for t in news):  # the copies never reached the disk
                continue
            current = self.book().parts_of(part.batch_key).get(part.part)
            if current is part and part.tickets == olds:
                for rec, ticket in zip(part.records, news, strict=True):
                    rec.ticket = ticket
                self.store.let_go(olds)
                self.moved_parts += 1
                log.info("staged part %s/%s/%s moved off the oldest journal segment",
                         part.sink, part.batch, part.part)
            else:  # published, discarded or staged again meanwhile: the copies are moot
                self.store.settle(STAGE_DISCARD, encode_discard([part.ident]), news)

    def pins(self) -> list[TicketLike]:
        """The copies in flight (held besides the parts' own records)."""
        return [t for _, _, news in self._moves for t in news]

    def locations(self, part: ParkedPart) -> list[Location]:
        """Where replay will find the part: its copies once they are appended."""
        for moving, _olds, news in self._moves:
            if moving is part:
                return [t.loc for t in news if t.loc is not None]
        return [t.loc for t in part.tickets if t.loc is not None]
