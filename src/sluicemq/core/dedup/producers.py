"""Duplicate detection for every producer (docs/replay-protocol.md, section 4).

A SEND with ``sluice-producer-id`` and ``sluice-producer-seq`` is dropped (its RECEIPT says
``sluice-duplicate:true``) when its number is not above the highest one accepted from that
producer id. Costs on the hot path: one dict lookup for a SEND without the headers; an int
parse, a lookup and a list update with them. No record of its own: the stored message carries
its headers (and a flag, ``records.PRODUCER_FLAG``, so replay finds them without parsing every
header block); an anchor (``core/persistence/anchor.py``) keeps the table through segment deletion.

Forgetting: an id is forgotten ``window`` seconds after its last accepted message, measured by
the messages' own timestamps, so replay reaches the same verdicts as the running broker: a
record more than a window *newer* than the entry starts a new epoch (the producer id was
forgotten and reused); one more than a window *older* belongs to a forgotten epoch (a
compaction copy or a dead-lettered message read after newer records) and is ignored.

Within a transaction the numbers are checked at COMMIT: duplicates are dropped from the
transaction, the rest commit. Staged parts refuse the headers: publication is idempotent by
itself (section 3).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from sluicemq.core.persistence.anchor import Anchor
from sluicemq.errors import ProtocolError
from sluicemq.protocol.numbers import natural
from sluicemq.storage.records import PRODUCER_HEADER
from sluicemq.storage.staging_records import MEMO_PRODUCERS

if TYPE_CHECKING:
    from sluicemq.storage.store import Store

log = logging.getLogger("sluicemq.dedup")

PRODUCER_ID = PRODUCER_HEADER  # "sluice-producer-id"
PRODUCER_SEQ = "sluice-producer-seq"
DUPLICATE = "sluice-duplicate"
DUPLICATES = "sluice-duplicates"  # on a COMMIT's RECEIPT: messages dropped from the transaction
MAX_ID = 200
MAX_SEQ = (1 << 63) - 1
TABLE = "producers"


def producer_of(headers: dict[str, str]) -> tuple[str, int] | None:
    """(id, seq) of a SEND, None without the headers; a non-fatal ProtocolError when they are
    malformed or only one of them is there."""
    pid = headers.get(PRODUCER_ID)
    raw = headers.get(PRODUCER_SEQ)
    if pid is None and raw is None:
        return None
    if pid is None or raw is None:
        raise ProtocolError(f"{PRODUCER_ID} and {PRODUCER_SEQ} go together", fatal=False)
    if not 0 < len(pid) <= MAX_ID or not pid.isprintable():
        raise ProtocolError(f"invalid {PRODUCER_ID} {pid[:50]!r}: 1-{MAX_ID} printable "
                            "characters", fatal=False)
    seq = natural(raw)
    if seq is None or seq > MAX_SEQ:
        raise ProtocolError(f"invalid {PRODUCER_SEQ} {raw[:50]!r}: a number 0..2^63-1",
                            fatal=False)
    return pid, seq


class ProducerTable:
    """Highest accepted sequence number per producer id. Sans-IO: times are passed in (ms).

    Entries are ``[seq, last_ms, journal_seq]``: ``journal_seq`` is the journal sequence number
    of the record that stored the latest accepted message (0: none), so that an entry whose
    record never reached the disk can be forgotten rather than make its retry a "duplicate".
    """

    def __init__(self, window_s: float) -> None:
        self.window_ms = int(window_s * 1000)
        self.entries: dict[str, list[int]] = {}
        self.duplicates = 0  # dropped since start (metrics)

    def __len__(self) -> int:
        return len(self.entries)

    def is_duplicate(self, pid: str, seq: int, now_ms: int) -> bool:
        e = self.entries.get(pid)
        if e is None or seq > e[0] or now_ms - e[1] > self.window_ms:
            return False
        self.duplicates += 1
        return True

    def accept(self, pid: str, seq: int, ts_ms: int, journal_seq: int = 0) -> None:
        """A message numbered ``seq`` was stored (``ts_ms``: its timestamp)."""
        e = self.entries.get(pid)
        if e is None or ts_ms - e[1] > self.window_ms:
            self.entries[pid] = [seq, ts_ms, journal_seq]
            return
        e[0] = max(e[0], seq)
        e[1] = max(e[1], ts_ms)
        e[2] = journal_seq

    def observe(self, pid: str, seq: int, ts_ms: int) -> None:
        """Replay: a stored message numbered ``seq``, in log order (see the module docstring)."""
        e = self.entries.get(pid)
        if e is not None and e[1] - ts_ms > self.window_ms:
            return  # from an epoch that was forgotten before the entry's one began
        self.accept(pid, seq, ts_ms)

    def expire(self, now_ms: int) -> int:
        """Forget ids silent for longer than the window; returns how many."""
        doomed = [pid for pid, e in self.entries.items() if now_ms - e[1] > self.window_ms]
        for pid in doomed:
            del self.entries[pid]
        return len(doomed)

    def failed(self, first: int, last: int) -> None:
        """Journal records ``first..last`` never reached the disk: forget the ids whose latest
        message was among them (their retries must be accepted; a duplicate beats a loss)."""
        doomed = [pid for pid, e in self.entries.items() if first <= e[2] <= last]
        for pid in doomed:
            del self.entries[pid]

    def dump(self) -> list[list[Any]]:
        return [[pid, e[0], e[1]] for pid, e in self.entries.items()]

    def load(self, rows: list[list[Any]]) -> None:
        """Replace the content with a dump (an anchor read back, or an index snapshot)."""
        self.entries = {pid: [seq, last, 0] for pid, seq, last in rows}


class Producers:
    """The broker's producer table and its anchor."""

    def __init__(self, store: Store, window_s: float) -> None:
        self.table = ProducerTable(window_s)
        self.anchor = Anchor(store, MEMO_PRODUCERS, TABLE,
                             lambda: self.table.dump())  # the table is replaced at start-up

    def is_duplicate(self, pid: str, seq: int, now_ms: int) -> bool:
        return self.table.is_duplicate(pid, seq, now_ms)

    def accepted(self, pid: str, seq: int, ts_ms: int, ticket: Any) -> None:
        """Remember a stored message; ``ticket`` is its journal ticket (None: not journaled)."""
        self.table.accept(pid, seq, ts_ms, ticket.seq if ticket is not None else 0)
        self.anchor.ensure()

    def tick(self, now_ms: int) -> None:
        forgotten = self.table.expire(now_ms)
        if forgotten:
            log.debug("forgot %d producer id(s) after the dedup window", forgotten)
        self.anchor.tick(empty=not self.table.entries)

    def failed(self, first: int, last: int) -> None:
        self.table.failed(first, last)

