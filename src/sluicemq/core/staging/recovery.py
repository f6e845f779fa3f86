"""Staged publishing across restarts: journal replay and the index snapshot's section.

Replay in log order: a final STAGE record parks its part (with the records before it of the
same attempt); STAGE_PUBLISH makes the listed records' messages live with ids ``base + i`` -
read back from the part records, which are still there unless every message in them was
consumed (then only the id count advances) - and drops every parked part of the batch;
STAGE_DISCARD drops parts; a MEMO_PUBLISHED record replaces the memory of published batches.
Parts still parked at the end are read once more to rebuild their routing facts, and stay
pinned; so does the newest memo record.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sluicemq.core.persistence.parts import Replay, StatePart
from sluicemq.core.staging.book import ParkedPart, StageBook, StagedRecord
from sluicemq.errors import StorageError
from sluicemq.storage import records
from sluicemq.storage.segment import Location
from sluicemq.storage.staging_records import (
    MEMO_PUBLISHED,
    STAGE,
    STAGE_DISCARD,
    STAGE_PUBLISH,
    StageMeta,
    decode_discard,
    decode_memo,
    decode_publish,
    decode_stage,
)
from sluicemq.storage.store import RecoveredTicket

if TYPE_CHECKING:
    from sluicemq.core.routing.broker import Broker

log = logging.getLogger("sluicemq.staging")

Parked = tuple[StageMeta, list[Location]]


class StagingPart(StatePart):
    """Parked parts, published batches and the memo anchor, rebuilt for ``broker.stager``."""

    name = "staging"
    rtypes = (STAGE, STAGE_PUBLISH, STAGE_DISCARD, MEMO_PUBLISHED)

    def __init__(self, broker: Broker) -> None:
        super().__init__(broker)
        limits = broker.config.limits
        self.book = StageBook(limits.stage_memory_batches)
        self.memory_ms = int(limits.stage_memory * 1000)
        self.parked: dict[tuple[str | None, str, str, str], Parked] = {}  # owner, sink, ...
        self.partial: dict[str, list[Location]] = {}  # attempt txid -> records before the final
        self.anchor: Location | None = None

    def seed(self, data: Any) -> None:
        for sink, batch, part, attempt, created, locs, *owner in data["parked"]:
            meta = StageMeta(sink, batch, part, attempt, created, owner[0] if owner else None)
            self.parked[(meta.owner, sink, batch, part)] = (meta, [Location(*loc) for loc in locs])
        self.book.load_memory(data["memory"])
        self.anchor = Location(*data["anchor"]) if data["anchor"] else None
        for txid, locs in data.get("partial", []):  # parts still being written at the snapshot
            self.partial[txid] = [Location(*loc) for loc in locs]

    def record(self, replay: Replay, rtype: int, payload: bytes | memoryview,
               loc: Location) -> None:
        if rtype == STAGE:
            meta, txid, final, _ops = decode_stage(payload)
            locs = self.partial.setdefault(txid, [])
            locs.append(loc)
            if final:
                del self.partial[txid]
                if self.book.published_count((meta.owner, meta.sink, meta.batch)) is None:
                    self.parked[(meta.owner, meta.sink, meta.batch, meta.part)] = (meta, locs)
        elif rtype == STAGE_PUBLISH:
            self._publish(replay, payload)
        elif rtype == STAGE_DISCARD:
            for sink, batch, part, attempt, owner in decode_discard(payload):
                found = self.parked.get((owner, sink, batch, part))
                if found is not None and found[0].attempt == attempt:
                    del self.parked[(owner, sink, batch, part)]
        else:
            _table, rows = decode_memo(payload)
            self.book.load_memory(rows)
            self.anchor = loc

    def _publish(self, replay: Replay, payload: bytes | memoryview) -> None:
        pub = decode_publish(payload)
        mid = pub.base
        store = self.broker.store
        for _name, recs in pub.parts:
            for loc, count in recs:
                try:
                    _meta, txid, _final, ops = decode_stage(store.read(loc))
                except StorageError:  # deleted: every message in it was consumed since
                    mid += count
                    continue
                offsets = records.tx_op_offsets(txid, ops)
                for (_rtype, op), inner in zip(ops, offsets, strict=True):
                    replay.message(op, loc, inner, mid=mid)
                    mid += 1
        replay.max_mid = max(replay.max_mid, pub.base + pub.count - 1)
        batch = (pub.owner, pub.sink, pub.batch)
        for key in [k for k in self.parked if k[:3] == batch]:
            del self.parked[key]
        self.book.remember(batch, pub.at_ms, pub.count, pub.token)

    def install(self) -> Iterable[Location]:
        stager = self.broker.stager
        self.book.forget_older(int(time.time() * 1000) - self.memory_ms)
        pins: list[Location] = []
        for meta, locs in self.parked.values():
            part = self._rebuild(meta, locs)
            if part is not None:
                self.book.park(part)
                pins.extend(locs)
        stager.book = self.book
        stager.anchor.adopt(self.anchor)
        if self.anchor is not None:
            pins.append(self.anchor)
        if self.partial:
            log.warning("discarded %d staged part(s) whose COMMIT did not finish",
                        len(self.partial))
        return pins

    def _rebuild(self, meta: StageMeta, locs: list[Location]) -> ParkedPart | None:
        """A parked part's routing facts, read back from its records."""
        part = ParkedPart(meta.sink, meta.batch, meta.part, meta.attempt, meta.created_ms,
                          meta.owner)
        for loc in locs:
            try:
                _meta, txid, _final, ops = decode_stage(self.broker.store.read(loc))
            except StorageError as exc:
                log.error("staged part %s/%s/%s lost: %s", meta.sink, meta.batch, meta.part,
                          exc)
                return None
            rec = StagedRecord(RecoveredTicket(loc))
            for (_rtype, op), inner in zip(ops, records.tx_op_offsets(txid, ops), strict=True):
                _mid, priority, _flags, key, hpos, hlen = records.message_head(op)
                rec.add(key, priority, inner, len(op) - hpos - hlen)
            part.records.append(rec)
        return part

    @classmethod
    def capture(cls, broker: Broker) -> tuple[Any, Iterable[Location]]:
        stager = broker.stager
        parked = []
        pins = [t.loc for t in stager.pins() if t.loc is not None]
        for p in stager.book.all_parts():
            locs = stager.mover.locations(p)  # a part being moved: where replay finds it
            parked.append([p.sink, p.batch, p.part, p.attempt, p.created_ms,
                           [[loc.segment, loc.offset, loc.length] for loc in locs],
                           *([p.owner] if p.owner is not None else [])])
        partial = [[w.txid, [[t.loc.segment, t.loc.offset, t.loc.length] for t in w.tickets
                             if t.loc is not None]] for w in stager.writing.values()]
        anchor = stager.anchor.loc
        data = {"parked": parked, "memory": stager.book.dump_memory(),
                "anchor": [anchor.segment, anchor.offset, anchor.length] if anchor else None,
                "partial": partial}
        return data, pins
