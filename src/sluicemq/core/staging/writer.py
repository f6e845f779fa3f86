"""A staged part being written: its STAGE records go to the journal as its SENDs arrive.

Why: a sink's part is column batches of a few MiB each. Spooled until COMMIT (to a temporary
file past 256 KiB), each batch was written, read back and copied three more times before it
reached the journal. Here a batch becomes its own STAGE record at once (not final: a restart
that finds no final record of the attempt drops them), so its bytes are copied once, into the
record, and the part's COMMIT writes only the final record - with the few plain SENDs of the
part, which keep their spool.

Shares: with ``user_store_limit`` set, each record written is charged to the stager's share
of the store (``UserShares.stage``) until the part is published (its messages are then charged
one by one), discarded or abandoned (``unshare``); so staging cannot pass the share.

Pins: every record written is held until the part is published (its messages then hold
them), discarded, or abandoned (``drop``). The index snapshot lists the records of parts
still being written (``partial``), so that a final record after a snapshot finds them.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from sluicemq.core.staging.batches import Rows, encode_rows
from sluicemq.core.staging.book import ParkedPart, StagedRecord, stored_owner
from sluicemq.protocol.columns import Columns
from sluicemq.storage import records
from sluicemq.storage.staging_records import STAGE, StageMeta

if TYPE_CHECKING:
    from sluicemq.storage.store import ShareBook, Store, TicketLike

RECORD_BYTES = 4 << 20  # plain SENDs of a part are journaled in records of about this size


class PartWriter:
    """The records of one attempt at staging ``sink/batch/part``, as they are written."""

    def __init__(self, store: Store, meta: StageMeta,
                 forget: Callable[[PartWriter], None]) -> None:
        self.store = store
        self._forget = forget  # the stager's: stop listing this part as one being written
        self.meta = meta
        self.txid = meta.txid()
        self.owner = stored_owner(meta.owner)  # the sender its records name (and share)
        self._heads = (records.encode_tx_ops(self.txid, [], final=False),
                       records.encode_tx_ops(self.txid, [], final=True))
        self._first = len(self._heads[0]) + records.OP_HEAD_SIZE  # the first op's payload
        self.records: list[StagedRecord] = []
        self._ops: list[bytes | memoryview] = []
        self._pending: list[tuple[str, int, int, int]] = []
        self._size = 0
        self._pos = self._first
        self.done = False  # parked, or dropped: nothing more is written

    @property
    def tickets(self) -> list[TicketLike]:
        return [r.ticket for r in self.records]

    def add_batch(self, batch: Columns, key: str, common: dict[str, str], now_ms: int) -> int:
        """A column batch of rows for ``key``, journaled now as one record of its own; the
        rows' count. ProtocolError (nothing written) for a bad batch."""
        rows = encode_rows(batch, key, common, now_ms, prefix=self._heads[0], owner=self.owner)
        self.flush()  # the part's earlier plain SENDs first: messages keep the part's order
        self._write(rows.block, [], [(rows, 0)])
        return rows.count

    def add(self, payloads: Iterable[bytes]) -> None:
        """Plain SENDs (MSG payloads, id 0), journaled in records of ``RECORD_BYTES``."""
        for payload in payloads:
            _mid, priority, _flags, key, hpos, hlen = records.message_head(payload)
            self._ops += records.encode_op(records.MSG, payload)
            self._pending.append((key, priority, self._pos, len(payload) - hpos - hlen))
            self._pos += len(payload) + records.OP_HEAD_SIZE
            self._size += len(payload)
            if self._size >= RECORD_BYTES:
                self.flush()

    def flush(self, *, final: bool = False) -> None:
        """Journal what ``add`` collected (as the final record, which may be empty)."""
        if self._ops or final:
            head = self._heads[1 if final else 0]
            self._write(b"".join((head, *self._ops)), self._pending, [])
        self._ops, self._pending, self._size, self._pos = [], [], 0, self._first

    def finish(self) -> ParkedPart:
        """The final record; the part, ready to park."""
        self.flush(final=True)
        self.done = True
        self._forget(self)
        m = self.meta
        return ParkedPart(m.sink, m.batch, m.part, m.attempt, m.created_ms, m.owner,
                          self.records)

    def drop(self) -> None:
        """Abandoned (ABORT, a failed COMMIT, a lost connection): unpin what was written;
        the records, never finished, are ignored by a restart."""
        if self.done:
            return
        self.done = True
        self._forget(self)
        unshare(self.store.shares, self.owner, self.records)
        self.store.let_go(self.tickets)

    def _write(self, payload: bytes, pending: list[tuple[str, int, int, int]],
               blocks: list[tuple[Rows, int]]) -> None:
        import numpy as np  # here, not at import: ~15 MiB of RSS a broker may not need

        rec = StagedRecord(self.store.keep(STAGE, payload))
        for entry in pending:
            rec.add(*entry)
        for rows, at in blocks:
            inner = np.frombuffer(rows.inner, np.uint32) + np.uint32(at)
            rec.add_rows(rows.key, rows.priority, array("I", inner.tobytes()), rows.size)
        self.records.append(rec)
        shares = self.store.shares
        if shares is not None:
            shares.stage(self.owner, rec.body_bytes, len(rec))


def unshare(shares: ShareBook | None, owner: bytes, recs: list[StagedRecord]) -> None:
    """Give back what ``PartWriter`` charged for these records of ``owner``'s part (it is
    published, discarded or abandoned); nothing while no share is kept."""
    if shares is not None:
        for rec in recs:
            shares.unstage(owner, rec.body_bytes, len(rec))
