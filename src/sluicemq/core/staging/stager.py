"""Staged publishing, the broker side: journal records, publication, discard and the timer.

A part is stored at its COMMIT as STAGE records (the layout of transaction records, message ids
0) and pinned; nothing is routed. Publication appends one STAGE_PUBLISH record naming the part
records in order and the first of a fresh block of message ids, then makes every message
visible in the same loop turn: a queue with a store cursor adopts compact slots pointing into
the part records (nothing is read back, however big the batch); topics and VM-cursor queues
get message objects read from the records. The parts' pins are released once the publication
record is durable; from then on the messages pin their records like a transaction's messages
do, and compaction moves them like any others.

The per-user share of the store (``user_store_limit``) counts a part's bytes from the moment its
records are written (``writer.py``) until it is discarded, expires or is published; at
publication each message is charged to the stager like a stored SEND, held by its queue (or by
each durable subscription of its topic), so consuming it gives the room back.

Replay (``core/pipeline_recovery.py``) applies a STAGE_PUBLISH record all or nothing and gives
message ``i`` the id ``base + i`` - the ids the running broker gave them.
"""

from __future__ import annotations

import itertools
import logging
import time
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Protocol

from sluicemq.core.paging.spill import JOURNAL, SpillFifo
from sluicemq.core.persistence.anchor import Anchor
from sluicemq.core.routing import keys
from sluicemq.core.routing.message import Message
from sluicemq.core.staging.book import (
    DUPLICATE,
    PUBLISHED,
    STAGED,
    BatchKey,
    ParkedPart,
    StageBook,
    StagedRecord,
    stored_owner,
)
from sluicemq.core.staging.mover import PartMover
from sluicemq.core.staging.writer import PartWriter, unshare
from sluicemq.errors import ProtocolError
from sluicemq.storage.staging_records import (
    MEMO_PUBLISHED,
    STAGE_DISCARD,
    STAGE_PUBLISH,
    Publication,
    StageMeta,
    encode_discard,
    encode_publish,
)
from sluicemq.storage.store import TicketLike

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    from sluicemq.config import BrokerConfig
    from sluicemq.core.paging.pager import Pager
    from sluicemq.core.routing.queue import Queue
    from sluicemq.core.routing.topic import Topic
    from sluicemq.storage.segment import Location
    from sluicemq.storage.store import Store

log = logging.getLogger("sluicemq.staging")

RECORD_BYTES = 4 << 20  # a part larger than this is journaled as several records
MEMORY_TABLE = "published"


class StagerHost(Protocol):
    """What publication needs of the broker: ids, destinations, the pager and the store."""

    config: BrokerConfig
    store: Store
    pager: Pager

    def now_ms(self) -> int: ...

    def allocate_mids(self, count: int) -> int: ...

    def queue(self, name: str) -> Queue: ...

    def topic(self, name: str) -> Topic: ...

    def schedule_dispatch(self, queue: Queue) -> None: ...

    def body_of(self, msg: Message) -> bytes | memoryview: ...


class Stager:
    """Parked parts and published batches of one broker."""

    def __init__(self, broker: StagerHost) -> None:
        self.broker = broker
        self.store = broker.store
        limits = broker.config.limits
        self.timeout_ms = int(limits.stage_timeout * 1000)
        self.memory_ms = int(limits.stage_memory * 1000)
        self.book = StageBook(limits.stage_memory_batches)
        self.anchor = Anchor(broker.store, MEMO_PUBLISHED, MEMORY_TABLE,
                             lambda: self.book.dump_memory())  # the book is replaced at start-up
        self.mover = PartMover(broker.store, lambda: self.book)
        self._attempts = itertools.count(int(time.time() * 1_000_000))
        self.published_batches = 0
        self.published_messages = 0
        self.discarded_parts = 0
        # Publication records not yet durable, and those whose write failed (disk full): the
        # messages are visible and the batch counts as published, so the record is written
        # again until it sticks - else a restart would forget the publication.
        self._unsynced: list[tuple[TicketLike, BatchKey, bytes]] = []
        self._unsaved: dict[BatchKey, bytes] = {}
        self.writing: dict[int, PartWriter] = {}  # parts whose COMMIT has not come yet

    # -- staging -----------------------------------------------------------------------------
    def open_part(self, owner: str | None, sink: str, batch: str, part: str) -> PartWriter:
        """A new attempt at staging ``owner``'s part: its records are written as they come."""
        meta = StageMeta(sink, batch, part, next(self._attempts), self.broker.now_ms(), owner)
        writer = PartWriter(self.store, meta, self._stop_writing)
        self.writing[id(writer)] = writer
        return writer

    def finish_part(self, writer: PartWriter, payloads: Iterable[bytes] = ()
                    ) -> tuple[str, int]:
        """The part's COMMIT: its last plain SENDs and final record, then it is parked;
        ``(staged, n)``, or ``(duplicate, 0)`` when the batch was published already (what
        was written is dropped: publishing it again would do nothing)."""
        m = writer.meta
        if self.book.published_count(self.book.scope(m.owner, m.sink, m.batch)) is not None:
            writer.drop()
            return DUPLICATE, 0
        if any(t.loc is None for t in writer.tickets):
            writer.drop()
            raise ProtocolError(f"stage {m.sink}/{m.batch}/{m.part} was lost: a journal write "
                                "failed before its COMMIT (stage it again)", fatal=False)
        writer.add(payloads)
        parked = writer.finish()
        old = self.book.park(parked)
        if old is not None:  # a retried task staged the part again: the newer attempt wins
            self._unshare([old])
            self.store.let_go(old.tickets)
        return STAGED, parked.count

    def stage(self, owner: str | None, sink: str, batch: str, part: str,
              payloads: Iterable[bytes]) -> tuple[str, int]:
        """A whole part at once, from its messages' MSG payloads (id 0, journal key)."""
        if self.book.published_count(self.book.scope(owner, sink, batch)) is not None:
            return DUPLICATE, 0
        return self.finish_part(self.open_part(owner, sink, batch, part), payloads)

    def _stop_writing(self, writer: PartWriter) -> None:
        self.writing.pop(id(writer), None)

    def not_durable(self, key: BatchKey, names: list[str]) -> bool:
        """Are some of these parts' records still on their way to the disk?"""
        parts = self.book.parts_of(key)
        durable = self.store.durable_seq
        return any(r.ticket.seq > durable for n in names if n in parts
                   for r in parts[n].records)

    # -- publication -------------------------------------------------------------------------
    def publish(self, key: BatchKey, names: list[str],
                token: str | None = None) -> tuple[str, int, str | None]:
        """Make the listed parts of batch ``key`` (from ``book.scope``) visible at once,
        discard its other parts; ``(published, n, token)`` or, for a batch published before,
        ``(duplicate, n then, the token it was published with)``."""
        owner, sink, batch = key
        earlier = self.book.published_count(key)
        if earlier is not None:
            self._resave(key)  # its RECEIPT then covers a record that had failed
            self._discard(self.book.take_batch(key))
            return DUPLICATE, earlier, self.book.published_token(key)
        parked = self.book.parts_of(key)
        missing = [n for n in names if n not in parked]
        if missing:
            shown = ", ".join(missing[:10]) + (", ..." if len(missing) > 10 else "")
            whose = f" staged by user {owner!r}" if owner is not None else ""
            raise ProtocolError(f"stage {sink}/{batch} has no part {shown}{whose} (never "
                                "staged, expired or discarded; a user publishes only the "
                                "parts it staged itself): nothing was published", fatal=False)
        chosen = [parked[n] for n in names]
        count = sum(p.count for p in chosen)
        base = self.broker.allocate_mids(count)
        now = self.broker.now_ms()
        pub = Publication(sink, batch, base, count, now,
                          [(p.part, [(r.loc, len(r)) for r in p.records])
                           for p in chosen], token, owner)
        payload = encode_publish(pub)
        every = self.book.take_batch(key)
        self._unshare(every)  # the chosen parts' messages are charged one by one (_route)
        ticket = self.store.settle(STAGE_PUBLISH, payload, [t for p in every for t in p.tickets])
        self._unsynced.append((ticket, key, payload))
        self.book.remember(key, now, count, token)
        self.anchor.ensure()
        self._route(chosen, base)
        self.published_batches += 1
        self.published_messages += count
        self.discarded_parts += len(every) - len(chosen)
        log.info("stage %s/%s published: %d part(s), %d message(s)", sink, batch, len(chosen),
                 count)
        return PUBLISHED, count, token

    def _route(self, parts: list[ParkedPart], base: int) -> None:
        """Make the parts' messages visible, ids from ``base`` in publication order: a queue
        with a store cursor adopts each record's rows as slots, column-wise and unread; topics
        and memory-cursor queues get message objects read from the records."""
        import numpy as np  # here, not at import: ~15 MiB of RSS a broker may not need

        broker = self.broker
        shares = self.store.shares
        mid = base
        retained: Counter[int] = Counter()
        newest = (0, -1)
        woken: dict[int, Queue] = {}
        for part in parts:
            owner = stored_owner(part.owner)
            for rec in part.records:
                loc = rec.ticket.loc
                assert loc is not None
                kidx = np.frombuffer(rec.kidx, np.uint16)
                for k, key in enumerate(rec.keys):
                    rows = np.flatnonzero(kidx == k)
                    name = keys.name_of(key)
                    q = broker.queue(name) if keys.is_queue(key) else None
                    if q is not None and q.pending.pager is not None:  # slots, nothing read
                        _adopt(q, rec, loc, mid, rows)
                        if shares is not None:
                            for j in rows.tolist():
                                shares.charge(owner, mid + j, rec.size[j], 1)
                        retained[loc.segment] += len(rows)
                        newest = (loc.segment, loc.offset)
                        woken[id(q)] = q
                        continue
                    for j in rows.tolist():
                        slot = (mid + j, JOURNAL, loc.segment, loc.offset, loc.length,
                                rec.inner[j], rec.size[j])
                        if q is not None:
                            msg = self._read(slot, q.destination, rec.prio[j])
                            self.store.hold(msg.ticket)
                            if shares is not None:
                                shares.charge(owner, msg.mid, rec.size[j], 1)
                            q.enqueue(msg)
                        else:
                            held = self._to_topic(name, self._read(slot, f"/topic/{name}",
                                                                   rec.prio[j]))
                            if shares is not None and held:
                                shares.charge(owner, mid + j, rec.size[j], held)
                            self.store.shared.add(mid + j, held)  # (durable subscriptions)
                mid += len(rec)
        if retained:
            self.store.hold_rows(dict(retained), newest)
        for q in woken.values():
            if q.consumers:
                broker.schedule_dispatch(q)

    def _read(self, slot: tuple[int, int, int, int, int, int, int], destination: str,
              priority: int) -> Message:
        return self.broker.pager.page_in(SpillFifo(), slot, destination, priority)

    def _to_topic(self, name: str, msg: Message) -> int:
        """Fan out like any topic message: durable subscriptions keep a journaled copy, live
        ones get theirs in memory. Returns how many durable subscriptions hold the record."""
        topic = self.broker.topic(name)
        topic.published += 1
        held = 0
        for q in topic.targets(msg):
            copy = msg.copy_for(msg.destination)
            if q.durable:
                copy.ticket = msg.ticket
                self.store.hold(copy.ticket)
                held += 1
            else:
                copy.persistent = False
                copy.ticket = None
                if copy.body is None:
                    copy.body = bytes(self.broker.body_of(msg))
            q.enqueue(copy)
        return held

    # -- discarding --------------------------------------------------------------------------
    def abort(self, key: BatchKey) -> int:
        """Discard the batch's parked parts (nothing happens to a published batch)."""
        parts = self.book.take_batch(key)
        self._discard(parts)
        return len(parts)

    def _discard(self, parts: list[ParkedPart]) -> None:
        if not parts:
            return
        self._unshare(parts)
        self.store.settle(STAGE_DISCARD, encode_discard(p.ident for p in parts),
                          [t for p in parts for t in p.tickets])
        self.discarded_parts += len(parts)

    def tick(self, now_ms: int) -> None:
        """Discard parts older than ``stage_timeout``, forget batches older than
        ``stage_memory``, keep parked parts and the memory's anchor off the oldest segment."""
        expired = self.book.expired(now_ms, self.timeout_ms)
        for p in expired:
            self.book.take(p)
            log.warning("staged part %s/%s/%s discarded: not published within stage_timeout",
                        p.sink, p.batch, p.part)
        self._discard(expired)
        self.book.forget_older(now_ms - self.memory_ms)
        self.anchor.tick(empty=not self.book.published)
        self.mover.tick()
        durable = self.store.durable_seq
        self._unsynced = [u for u in self._unsynced if u[0].seq > durable]
        for key in list(self._unsaved):
            self._resave(key)

    def _resave(self, key: BatchKey) -> None:
        payload = self._unsaved.pop(key, None)
        if payload is not None:
            ticket = self.store.append_record(STAGE_PUBLISH, payload)
            self._unsynced.append((ticket, key, payload))

    def failed(self, first: int, last: int) -> None:
        """Records ``first..last`` never reached the disk: parts with such a record are gone;
        publication records are written again."""
        for ticket, key, payload in self._unsynced:
            if ticket.loc is None:
                self._unsaved[key] = payload
        self._unsynced = [u for u in self._unsynced if u[0].loc is not None]
        for p in self.book.all_parts():
            if any(t.loc is None for t in p.tickets):
                self.book.take(p)
                self._unshare([p])
                self.store.let_go(p.tickets)

    def _unshare(self, parts: list[ParkedPart]) -> None:
        """These parked parts leave their stager's share (published, discarded, expired)."""
        for p in parts:
            unshare(self.store.shares, stored_owner(p.owner), p.records)

    def staged(self) -> Iterator[tuple[bytes, int, int]]:
        """(owner, body bytes, messages) of each parked part (the share's recount)."""
        for p in self.book.all_parts():
            yield stored_owner(p.owner), sum(r.body_bytes for r in p.records), p.count

    @property
    def parked_parts(self) -> int:
        return len(self.book.all_parts())

    def pins(self) -> list[TicketLike]:
        """Every record this module holds on its own (index snapshot self-check)."""
        pins = [t for p in self.book.all_parts() for t in p.tickets] + self.mover.pins()
        pins += [t for w in self.writing.values() for t in w.tickets]
        if self.anchor.ticket is not None:
            pins.append(self.anchor.ticket)
        return pins


def _adopt(q: Queue, rec: StagedRecord, loc: Location, base: int, rows: NDArray[np.int64]
           ) -> None:
    """The ``rows`` of ``rec`` (ids ``base + row``) as slots of ``q``, a run per priority."""
    import numpy as np

    prio = np.frombuffer(rec.prio, np.uint8)[rows]
    for p in np.unique(prio).tolist():
        sel = rows[prio == p]
        m = len(sel)
        q.pending.adopt_run(p, array("Q", (sel + base).astype(np.uint64).tobytes()),
                            array("I", [loc.segment]) * m, array("Q", [loc.offset]) * m,
                            array("I", [loc.length]) * m,
                            array("I", np.frombuffer(rec.inner, np.uint32)[sel].tobytes()),
                            array("I", np.frombuffer(rec.size, np.uint32)[sel].tobytes()))
        q.stats.enqueued += m
