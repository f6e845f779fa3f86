"""The journal: an append-only, segmented, checksummed log with group commit.

Records are opaque (rtype, payload) pairs; the record layout is in `segment.py`, startup
repair in `recovery.py`, the writer thread in `journal_writer.py`, the reads in
`journal_reads.py` and the live counts with the deletion rule in `journal_retention.py`
(mixins of this one object, sharing its state under `_lock`). This module owns the
lifecycle (recover, start, close) and the append position.
A persistent SEND may be receipted only after `on_durable` covers its
ticket, i.e. after the fdatasync that followed its write.

Threads and invariants:

- The event-loop thread calls append, read, retain, release and reclaim. append never touches
  the disk: it reserves the record's Location and queues it.
- One writer thread takes the whole pending batch at a time, writes it with pwritev, fdatasyncs
  each segment it touched once, then calls on_durable with the batch's highest seq. While it
  syncs, new appends pile up into the next batch: that is the group commit.
- A helper thread zero-fills the next segment ahead of need (`preallocate=True`), or renames
  a spare to it: reclaimed segments' files, kept up to `recycle_bytes` (`recycle.py`).
- `_lock` guards all state shared by those threads: the pending batch, the append position,
  the segment table (segment -> live count, oldest first), open fds, the durable seq. Only the
  writer writes segment files once they are in use; nothing does I/O while holding the lock
  except opening a file.
- A reclaimed segment's file is deleted or kept as a spare, and a spare becomes a segment
  numbered above every one the file was: records are checksummed with their segment number
  and offset, so what the file held before never checks out again (`recycle.py`), and keyed
  with the journal's secret (`journal.key`, `headerkey.py`), so neither does a record a
  sender laid out in a message body. Spares
  and live segments together stay within the pool's bound (the store limit), and spares are
  deleted first while the filesystem is below its free-space floor (`trim_spares`).
- Locations are assigned at append time, in seq order, so seq order is log order and a loc
  is final as soon as append() returns. A failed batch rewinds the append position to its
  first record and fails every record queued after it too (their locs assumed it was there).
- A segment is deleted only as the deletion rule allows (`journal_retention.py`): never the
  active one, nor one with live records, undurable records, or records newer than anything
  the caller has retained or released.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from sluicemq.buffers import BufferPool
from sluicemq.errors import StorageError
from sluicemq.storage.checksum import crc32, crc32_combine
from sluicemq.storage.headerkey import HeaderKey, check_key, create_key, open_key
from sluicemq.storage.journal_reads import EXTENT_BYTES, EXTENTS_KEPT, JournalReads
from sluicemq.storage.journal_retention import JournalRetention
from sluicemq.storage.journal_writer import (
    TAIL_CRC_AHEAD,
    Entry,
    JournalStats,
    JournalWriter,
    Ticket,
)
from sluicemq.storage.recovery import Recovery, RecoveryReport
from sluicemq.storage.recycle import SegmentPool
from sluicemq.storage.segment import (
    HEADER_SIZE,
    MAX_PAYLOAD,
    Location,
    segment_name,
)

__all__ = ["Journal", "JournalStats", "Location", "RecoveryReport", "Ticket"]

log = logging.getLogger(__name__)

LOCK_NAME = "journal.lock"
# Builds a named tuple from its fields in order without its generated Python ``__new__``:
# ``append`` makes a Location and an Entry for every record (a persistent SEND).
_new_tuple = tuple.__new__
_new_object = object.__new__
SMALL_BATCH = 4  # records: group commits averaging more mean the journal is loaded


class Journal(JournalReads, JournalRetention, JournalWriter):
    """See the module docstring; lifecycle: recover() (exhausted), start(), close()."""

    def __init__(
        self,
        directory: Path,
        *,
        segment_bytes: int = 64 << 20,
        preallocate: bool = True,
        sync: bool = True,
        dir_lock: bool = True,
        recycle_bytes: int = 0,
    ) -> None:
        """``dir_lock=False`` skips the flock on the directory: a lease master (whose fencing
        replaces it) must open the journal while a paused, fenced predecessor still holds it.
        ``recycle_bytes``: reclaimed segment files kept for reuse, at most (0: deleted)."""
        if segment_bytes <= HEADER_SIZE:
            raise ValueError("segment_bytes must exceed the record header size")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.segment_bytes = segment_bytes
        self.preallocate = preallocate
        self.sync = sync
        self.stats = JournalStats()
        self.pool = SegmentPool(self.directory, segment_bytes, recycle_bytes)
        self.pool.live = self.segment_count
        self.report: RecoveryReport | None = None
        self._dir_lock = _lock_directory(self.directory) if dir_lock else -1
        try:
            key = open_key(self.directory)
            if key is not None:
                check_key(self.directory, key)
        except StorageError:
            if self._dir_lock >= 0:  # refused: the directory is free again
                os.close(self._dir_lock)
            raise
        self.header_key = key if key is not None else HeaderKey()
        self._unkeyed = key is None  # written before keys: keyed after its recovery
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._state = "new"
        self._pending: list[Entry] = []
        # appended, not yet written: payload, or (payload, tail) until a read joins them
        self._unwritten: dict[Location, bytes | tuple[bytes, bytes]] = {}
        self._extents = BufferPool(keep=EXTENTS_KEPT, largest=EXTENT_BYTES)  # read_extent's
        self.unwritten_bytes = 0  # appended, not yet written: flow control bounds it
        self._writer_idle = False
        self._closing = False
        self.wake_on_append = True  # False: the caller ends each batch with kick() or commit_now()
        # Called on the writing thread before anything is written or deleted; a lease master
        # (storage/lease.py) ends the process there once its lease may have passed on.
        self.fence: Callable[[], None] | None = None
        self._seq = 0
        self._durable = 0
        self._seg = 1
        self._off = 0
        self._segs: dict[int, int] = {}
        # segment -> [bytes appended, holds ever]: their ratio estimates a live record's size
        # (compaction's estimate of the live bytes; recovered segments have none: full)
        self._weight: dict[int, list[int]] = {}
        self._last: dict[int, tuple[int, int]] = {}
        self._horizon = (0, -1)
        self._tail = (0, -1)  # (segment, offset) of the last record appended or recovered
        self._fds: dict[int, int] = {}
        self._doomed: list[int] = []
        self._undeleted: list[int] = []
        self._repair: tuple[int, int, int] | None = None
        self._prep: tuple[int, Future[int]] | None = None
        self._prep_mark = (0, 0)
        self._cached_from = (-1, 0)  # (segment, offset): see JournalWriter._drop_cached
        self._helper: ThreadPoolExecutor | None = None
        self._writer: threading.Thread | None = None
        self._on_durable: Callable[[int], None] = _ignore_durable
        self._on_failed: Callable[[int, int, BaseException], None] = _ignore_failed

    # ---------------------------------------------------------------- lifecycle

    def recover(self, after: tuple[int, int, int] | None = None
                ) -> Iterator[tuple[int, memoryview | bytes, Location]]:
        """(rtype, payload, loc) for every intact record in log order; then `self.report`.

        ``after`` = (segment, offset, end) of an intact record an index snapshot accounts for:
        only the records after it are read. Runs before start(), and may run again (a full
        scan after a snapshot turned out unusable).
        """
        for rtype, payload, segment, offset in self.recover_raw(after):
            yield rtype, payload, Location(segment, offset, len(payload))

    def recover_raw(self, after: tuple[int, int, int] | None = None
                    ) -> Iterator[tuple[int, bytes, int, int]]:
        """``recover`` as (rtype, payload, segment, offset): no object per record."""
        if self._state not in ("new", "recovered"):
            raise StorageError("recover() runs before start()")
        self._state = "recovering"
        recovery = Recovery(self.directory, self.header_key, after)
        yield from recovery.raw_records()
        self.report = recovery.report
        if self._unkeyed:  # keyed from the segment after every file it has
            self._unkeyed = False
            self.header_key = create_key(self.directory, 1 + max(
                recovery.active, recovery.spare or 0, *recovery.segments, *recovery.spares))
        self.pool.adopt(recovery.spares, recovery.reused)
        self._seg, self._off = recovery.active, recovery.end
        self._segs = dict.fromkeys(recovery.segments, 0)
        self._segs.setdefault(self._seg, 0)
        self.pool.trim()  # bounds set before recovery (the broker's) apply to spares found
        self._horizon = recovery.last
        self._tail = recovery.last
        self._state = "recovered"

    def mark(self) -> tuple[int, tuple[int, int], int] | None:
        """(seq, (segment, offset) of the last record appended or recovered, where the record
        after it goes in that segment): the log position an index snapshot is taken at. Seqs
        number this run's appends only. None right after a failed batch was rewound, until
        the next append: the last record is not known then."""
        with self._lock:
            if self._tail >= (self._seg, self._off):
                return None
            return self._seq, self._tail, self._off

    def start(
        self,
        on_durable: Callable[[int], None],
        on_failed: Callable[[int, int, BaseException], None],
    ) -> None:
        """Start the writer; both callbacks run on the writer thread (hand off, don't block)."""
        if self._state != "recovered":
            raise StorageError("start() needs a completed recover() first")
        self._on_durable = on_durable
        self._on_failed = on_failed
        if self.preallocate:
            self._helper = ThreadPoolExecutor(1, thread_name_prefix="journal-prep")
            if not self.segment_path(self._seg).exists():
                self._prepare(self._seg)
        self._writer = threading.Thread(target=self._run, name="journal-writer", daemon=True)
        self._state = "running"
        self._writer.start()

    def close(self, on_closed: Callable[[], None] | None = None) -> None:
        """Write and sync everything pending, stop the threads, close the files.

        ``on_closed`` runs after that but before the directory lock is released: an index
        snapshot written there cannot race a new process opening the journal.
        """
        if self._state == "closed":
            return
        if self._writer is not None:
            with self._lock:
                self._closing = True
                self._wake.notify()
            self._writer.join()
        if self._repair is not None:
            with contextlib.suppress(OSError):
                self._truncate_back()
        if self._writer is not None and self._seg in self._fds:
            try:
                self.pool.seal(self._seg, self._fds[self._seg], self._off, self.fence)
            except OSError:
                log.exception("journal: cannot zero what follows segment %d's end", self._seg)
        if self._prep is not None:
            with contextlib.suppress(Exception):
                os.close(self._prep[1].result())
            self._prep = None
        if self._helper is not None:
            self._helper.shutdown(wait=True)
        with self._lock:
            self._closing = True
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
        self._state = "closed"
        try:
            if on_closed is not None:
                on_closed()
        finally:
            if self._dir_lock >= 0:
                os.close(self._dir_lock)

    # ---------------------------------------------------------------- loop-thread API

    def append(self, rtype: int, payload: bytes | bytearray | memoryview,
               tail: bytes | bytearray | memoryview = b"", holds: int = 0) -> Ticket:
        """Queue a record; returns at once. Mutable buffers are copied, bytes are kept.

        The record's payload is ``payload`` followed by ``tail``, written from both buffers:
        a large message body goes to disk as it arrived, not copied into one record first
        (a copy a MiB on the loop, and twice the memory while the chunk waits for its write).
        ``holds``: ``retain`` it that many times in the same look under the lock (a queue's
        message is held from its append on: one lock and call fewer per persistent SEND).
        """
        if not 1 <= rtype <= 255:
            raise ValueError(f"rtype must be 1..255, not {rtype}")
        data = payload if type(payload) is bytes else bytes(payload)
        rest = tail if type(tail) is bytes else bytes(tail)
        length = len(data) + len(rest)
        if length > MAX_PAYLOAD:
            raise ValueError("payload larger than 4 GiB - 1")
        # (outside the lock: the writer's next batch need not wait for it)
        tail_crc = crc32(rest) if len(rest) >= TAIL_CRC_AHEAD and crc32_combine else None
        size = HEADER_SIZE + length
        with self._lock:  # (names read once into locals: every persistent SEND runs this)
            if self._state != "running" or self._closing:
                raise StorageError("journal is not running")
            seg, off = self._seg, self._off
            if off and off + size > self.segment_bytes:
                seg = self._seg = seg + 1
                off = 0
                self._segs.setdefault(seg, 0)
            loc = _new_tuple(Location, (seg, off, length))  # (``Location(...)``, in C)
            self._off = off + size
            weight = self._weight.get(seg)
            if weight is None:
                self._weight[seg] = [size, holds]
            else:
                weight[0] += size
                weight[1] += holds
            tail_at = self._tail = (seg, off)
            if holds:  # as retain: the active segment is never reclaimed, so it is there
                self._segs[seg] += holds
                self._horizon = tail_at  # nothing retained lies beyond it
            seq = self._seq = self._seq + 1
            ticket = _new_object(Ticket)  # (``Ticket(seq, loc)``, without its Python frame)
            ticket.seq = seq
            ticket.loc = loc
            self._pending.append(_new_tuple(Entry, (ticket, seq, loc, rtype, data, rest, tail_crc)))
            self._unwritten[loc] = (data, rest) if rest else data
            self.unwritten_bytes += size
            self._last[seg] = (seq, off)
            if self._writer_idle and self.wake_on_append:
                self._writer_idle = False
                self._wake.notify()
        return ticket

    def kick(self) -> None:
        """Hand everything appended so far to the writer thread (with ``wake_on_append=False``)."""
        with self._lock:
            if self._writer_idle and self._pending:
                self._writer_idle = False
                self._wake.notify()

    def commit_now(self, max_records: int = SMALL_BATCH, max_bytes: int = 256 << 10, *,
                   report: bool = True) -> bool:
        """Write and sync a small pending batch on the calling (loop) thread, if the writer is idle.

        Why: a lone synchronous producer waits for the fdatasync plus two thread hand-offs
        (loop → writer → loop); committing in place removes the hand-offs, which on this kind
        of machine are as slow as the sync itself. Under load the batch is bigger than
        ``max_records`` and goes to the writer, which keeps the loop free while the disk works;
        so does a small batch while recent batches averaged more than ``max_records``: under
        load a loop turn that happened to append a few records would otherwise stall every
        other connection for a fdatasync (8 producers x 8 in flight: 7.6 % of the loop's time).
        A caller that knows a loaded batch is complete and its loop quiet passes a larger
        ``max_records`` (``Store._end_turn``).
        Returns False (nothing done) when the caller should ``kick()`` instead. With
        ``report=False`` on_durable is not called for this batch: the caller reads
        ``durable_seq`` itself, and the loop is not woken once more for nothing.
        """
        with self._lock:
            pending = self._pending
            if (not pending or not self._writer_idle or self._doomed or self._closing
                    or self._state != "running" or len(pending) > max_records
                    or self.stats.recent_batch > max_records
                    or sum(e.loc.length for e in pending) > max_bytes):
                return False
            self._pending = []
            self._writer_idle = False  # the writer stays asleep; we are the writer for now
        try:
            self._commit(pending, report=report)
        finally:
            with self._lock:
                self._writer_idle = True
                if self._pending or self._doomed or self._closing:
                    self._writer_idle = False
                    self._wake.notify()
        return True

    @property
    def loaded(self) -> bool:
        """Have recent group commits averaged more than ``SMALL_BATCH`` records?"""
        return self.stats.recent_batch > SMALL_BATCH

    @property
    def writer_idle(self) -> bool:
        """Is the writer thread waiting for a batch (advisory: read without the lock)?"""
        return self._writer_idle

    @property
    def pending_records(self) -> int:
        """Records appended and not yet taken by a commit (advisory: read without the lock)."""
        return len(self._pending)

    def segment_path(self, segment: int) -> Path:
        return self.directory / segment_name(segment)

    def trim_spares(self) -> None:
        """Once a second (loop thread): if spares hold room their bounds want back (the store
        limit, the free-space floor: ``recycle.py``), delete them on the helper thread."""
        if not self.pool.pressed():
            return
        helper = self._helper
        if helper is None or self._state != "running":
            self.pool.trim(self.fence)
            return
        with contextlib.suppress(RuntimeError):  # shut down by a close meanwhile
            helper.submit(self.pool.trim, self.fence)

    def payload_offset(self, loc: Location) -> int:
        """Absolute offset of loc's payload in its segment file (for os.sendfile)."""
        return loc.offset + HEADER_SIZE

    @property
    def last_record(self) -> tuple[int, int]:
        """(segment, offset) of the last record appended or recovered; (0, -1): none."""
        return self._tail

    @property
    def durable_seq(self) -> int:
        """Highest seq known durable (records reported to on_failed excepted)."""
        return self._durable


def _lock_directory(directory: Path) -> int:
    """Hold an exclusive flock on the directory's lock file: two brokers, one journal = ruin."""
    fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StorageError(f"journal {directory} is in use by another process") from None
    return fd


def _ignore_durable(seq: int) -> None:
    """Placeholder until start() installs the real callback."""


def _ignore_failed(first: int, last: int, exc: BaseException) -> None:
    """Placeholder until start() installs the real callback."""
