"""The journal's writer thread: group commit, failure rewind, segment files and deletion.

``Journal`` (``journal.py``) is the loop thread's side: append, retain/release, reclaim. This
is the other thread's side, a mixin of the same object: it takes the whole pending batch,
writes it with one ``pwritev`` per contiguous run (large records with O_DIRECT, several in
flight: ``direct.py``), fdatasyncs each touched segment once and reports the batch's highest
seq; a failed batch is cut back from the files and reported with
everything queued after it. It shares the journal's state under ``_lock`` (declared below).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from sluicemq.storage.direct import ALIGN, DirectWrites
from sluicemq.storage.headerkey import HeaderKey
from sluicemq.storage.recycle import SegmentPool
from sluicemq.storage.segment import (
    HEADER_SIZE,
    REUSED,
    Location,
    create_segment,
    encode_header,
    fsync_dir,
    write_all,
)

log = logging.getLogger("sluicemq.storage.journal")


class Ticket:
    """Handed out by append: the record's seq and its (already final) location."""

    __slots__ = ("loc", "seq")

    def __init__(self, seq: int, loc: Location | None) -> None:
        self.seq = seq
        self.loc = loc

    def __repr__(self) -> str:
        return f"Ticket(seq={self.seq}, loc={self.loc})"


@dataclass
class JournalStats:
    """Counters kept by the writer thread; read them from anywhere (they are only advisory)."""

    records: int = 0  # records made durable
    bytes: int = 0  # bytes written, headers included
    direct_bytes: int = 0  # of them written with O_DIRECT (``direct.py``)
    fsyncs: int = 0
    batches: int = 0
    last_batch: int = 0
    max_batch: int = 0
    failures: int = 0  # batches reported to on_failed
    recent_batch: float = 0.0  # records per batch, moving average over the last ~8 batches
    fsync_latency_s: deque[float] = field(default_factory=lambda: deque(maxlen=1024))

    @property
    def mean_batch(self) -> float:
        return self.records / self.batches if self.batches else 0.0


class Entry(NamedTuple):
    """One appended record on its way to disk: its payload is ``payload`` + ``tail``;
    ``tail_crc`` is ``crc32(tail)`` when it was computed at append (``TAIL_CRC_AHEAD``).

    A named tuple (as ``Location``): ``Journal.append`` makes one for every record and builds
    it with ``tuple.__new__`` in C, where a class's ``__init__`` was one more Python call."""

    ticket: Ticket
    seq: int
    loc: Location
    rtype: int
    payload: bytes
    tail: bytes
    tail_crc: int | None


TAIL_CRC_AHEAD = 64 << 10
"""A tail (a large message body) from this size is checksummed by ``Journal.append``, on the
appending (loop) thread, and the writer only combines that CRC with its header's
(``crc32_combine``). Why: in a stream the writer is the busy stage (trace of a 1 GiB stream
without a consumer, 2026-11-26: busy 96 % of the time, ~0.9 ms a MiB against the disk's
~0.5 ms), and its CRC of each MiB cost it 0.22 ms of wall time for 0.085 ms of CPU - zlib-ng
releases the GIL for it, and the writer then waited for the loop to give the GIL back. On the
loop it costs 0.06-0.09 ms a MiB, while the writer may run."""

LARGE_RECORD = 256 << 10
"""Average record size from which the next segment is allocated rather than zero-filled."""


def zero_fill(records: int, nbytes: int) -> bool:
    """Zero-fill the next segment, given the records (and their bytes) written since the last
    one was prepared? Yes unless they averaged ``LARGE_RECORD``: small records need the
    fastest fdatasync (no extent to update), a stream of large ones the disk's full rate."""
    return records == 0 or nbytes < records * LARGE_RECORD


SYNC_FILE_RANGE_WRITE = 2  # linux/fs.h: start writeback of the range's dirty pages, no wait


@functools.cache
def _sync_file_range() -> Callable[..., int] | None:
    """libc's sync_file_range (Linux; ``os`` has no binding), or None where there is none."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    return fn


def start_writeback(fd: int, start: int, end: int) -> None:
    """Have the disk start on ``start:end`` now, without waiting for it. Why, for large
    records: the writer copies a batch into the page cache, then fdatasyncs it, so the disk
    sat idle while each batch was copied (a stream's batch is ~4 chunks: 266 batches a GiB).
    Started chunk by chunk, the disk writes one while the next is copied, and the fdatasync
    that still follows (and still comes before the report) waits only for the rest."""
    fn = _sync_file_range()
    if fn is not None:
        fn(fd, start, end - start, SYNC_FILE_RANGE_WRITE)  # only advice: errors ignored


FOLIO = 2 << 20
"""The largest page-cache folio we expect (x86-64's PMD size): the kernel drops a folio only
when the advised range covers all of it."""


def drop_cached(fd: int, start: int, end: int) -> None:
    """Advise the kernel to drop the page cache of ``start:end``, bytes already durable (it
    drops the folios wholly inside). Why, for large records: a VM with free page reporting (as
    here) hands pages the guest left free back to its host, and taking such a page again costs
    a host fault - a stream's fresh page cache cost the journal writer 1.4-2.7 s of system time
    a GiB, 0.2-0.4 s once each batch's cache is dropped (the pages just freed are the ones the
    next batch takes). Reading such a record again goes to the disk, which a large record can
    afford; small records keep their cache."""
    with contextlib.suppress(OSError):  # only advice: a filesystem may refuse it
        os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_DONTNEED)


Span = tuple[int, int, int, int]  # (segment, fd, start, end) of records written together


class JournalWriter:
    """The writer thread's methods; the state is the journal's (``Journal.__init__``)."""

    directory: Path
    segment_bytes: int
    preallocate: bool
    sync: bool
    stats: JournalStats
    pool: SegmentPool
    header_key: HeaderKey
    fence: Callable[[], None] | None
    unwritten_bytes: int
    _lock: threading.Lock
    _wake: threading.Condition
    _pending: list[Entry]
    _unwritten: dict[Location, bytes | tuple[bytes, bytes]]
    _writer_idle: bool
    _closing: bool
    _seg: int
    _off: int
    _durable: int
    _fds: dict[int, int]
    _doomed: list[int]
    _undeleted: list[int]
    _repair: tuple[int, int, int] | None
    _prep: tuple[int, Future[int]] | None
    _prep_mark: tuple[int, int]  # stats (records, bytes) when the last segment was prepared
    _cached_from: tuple[int, int]  # (segment, offset): large records perhaps still cached from
    _helper: ThreadPoolExecutor | None
    _on_durable: Callable[[int], None]
    _on_failed: Callable[[int, int, BaseException], None]
    _direct: DirectWrites | None = None  # made on the first batch (``_write``)

    def segment_path(self, segment: int) -> Path:
        raise NotImplementedError

    def _run(self) -> None:
        while True:
            with self._lock:
                while not (self._pending or self._doomed or self._closing):
                    self._writer_idle = True
                    self._wake.wait()
                self._writer_idle = False
                batch, self._pending = self._pending, []
                doomed, self._doomed = self._doomed, []
                closing = self._closing
            if batch:
                self._commit(batch)
            if doomed or self._undeleted:
                self._delete(doomed)
            if closing and not batch and not doomed:
                if self._direct is not None:
                    self._direct.close()
                return
            # Not held while the writer waits: the last batch's payloads (a stream's last
            # chunks, MiBs) would stay alive, and a record at the top of glibc's heap kept a
            # trim from shrinking it after a burst (census of 2026-11-25: 58 MiB heap, 5.6 MiB
            # in use, its top block the writer's last Entry).
            batch, doomed = [], []

    def _commit(self, batch: list[Entry], *, report: bool = True) -> None:
        if self.fence is not None:
            self.fence()
        try:
            if self._repair is not None:
                self._truncate_back()
            touched, nbytes, large = self._write(batch)
            if self.sync:
                started = time.perf_counter()
                for fd in touched:
                    os.fdatasync(fd)
                self.stats.fsync_latency_s.append(time.perf_counter() - started)
                self.stats.fsyncs += len(touched)
        except Exception as exc:
            self._fail(batch, exc)
            return
        last = batch[-1].seq
        with self._lock:
            for entry in batch:
                del self._unwritten[entry.loc]
            self.unwritten_bytes -= nbytes
            self._durable = last
        stats = self.stats
        stats.records += len(batch)
        stats.bytes += nbytes
        stats.batches += 1
        stats.last_batch = len(batch)
        stats.max_batch = max(stats.max_batch, len(batch))
        stats.recent_batch += (len(batch) - stats.recent_batch) / 8
        if report:
            try:
                self._on_durable(last)
            except Exception:
                log.exception("journal on_durable callback failed")
        if self.sync:  # after the report: the receipts need not wait for it
            for span in large:
                self._drop_cached(*span)

    def _write(self, batch: list[Entry]) -> tuple[list[int], int, list[Span]]:
        """Write the batch as one pwritev per contiguous run of small records; each large
        record goes out on its own as soon as it is reached: with O_DIRECT (``direct.py``),
        else buffered with its writeback started at once (``start_writeback``). Returns (fds
        touched, bytes, the (segment, fd, start, end) spans of large records written
        buffered, for ``drop_cached``) once every write is complete."""
        touched: list[int] = []
        large: list[Span] = []
        direct = self._direct
        if direct is None:
            direct = self._direct = DirectWrites()
        try:
            total = self._write_runs(batch, direct, touched, large)
        finally:
            direct.wait(tail_direct=True)  # all complete before the fdatasync or a rewind
        return touched, total, large

    def _write_runs(self, batch: list[Entry], direct: DirectWrites, touched: list[int],
                    large: list[Span]) -> int:
        total = 0
        buffers: list[bytes] = []
        fd = -1
        run_start = run_end = -1
        run_seg = flags = 0
        seeds = (0, 0)
        for entry in batch:
            loc = entry.loc
            if loc.segment != run_seg or loc.offset != run_end:
                if buffers:
                    total += self._buffered(run_seg, fd, buffers, run_start)
                    buffers = []
                if loc.segment != run_seg:
                    fd = self._writer_fd(loc.segment)
                    touched.append(fd)
                    run_seg = loc.segment
                    flags = REUSED if self.pool.reused(run_seg) else 0
                    seeds = self.header_key.seeds(run_seg)
                run_start = run_end = loc.offset
            tail = entry.tail
            head = encode_header(entry.rtype, entry.payload, loc.segment, loc.offset, tail, flags,
                                 seeds=seeds, tail_crc=entry.tail_crc)
            end = run_end + HEADER_SIZE + loc.length
            if loc.length >= LARGE_RECORD and self.sync:  # on its way to disk now
                if buffers:
                    total += self._buffered(run_seg, fd, buffers, run_start)
                    buffers = []
                if direct.write(run_seg, fd, run_end, (head, entry.payload, tail)):
                    total += end - run_end
                    self.stats.direct_bytes += end - run_end
                else:
                    total += self._buffered(run_seg, fd, [head, entry.payload, tail], run_end)
                    start_writeback(fd, run_end, end)
                    if large and large[-1][0] == run_seg and large[-1][3] == run_end:
                        large[-1] = (run_seg, fd, large[-1][2], end)
                    else:
                        large.append((run_seg, fd, run_end, end))
                run_start = run_end = end
                continue
            buffers.append(head)
            buffers.append(entry.payload)
            if tail:
                buffers.append(tail)
            run_end = end
        if buffers:
            total += self._buffered(run_seg, fd, buffers, run_start)
        return total

    def _buffered(self, segment: int, fd: int, buffers: list[bytes], offset: int) -> int:
        """write_all through the page cache, once the direct writes before it are complete
        (the block the last one ended in is written first: this run may start in it); the
        run's bytes. Where it starts in that block, it is written from the block's start and
        to its last page's end (zeros past the log's end): whole pages, none read first."""
        direct = self._direct
        if direct is None:
            return write_all(fd, buffers, offset)
        direct.wait()
        start = direct.head_of(segment, offset)
        direct.forget()
        if start is None:
            return write_all(fd, buffers, offset)
        block, kept = start
        end = offset + sum(len(b) for b in buffers)
        write_all(fd, [kept, *buffers, bytes(-end % ALIGN)], block)
        return end - offset

    def _drop_cached(self, segment: int, fd: int, start: int, end: int) -> None:
        """Drop the cache of a durable span of large records, from where this segment's large
        records may still be cached: a folio the last span only partly covered (it also held
        the next record's first bytes) goes with this one."""
        mark_segment, mark = self._cached_from
        if mark_segment != segment:
            mark = start
        drop_cached(fd, mark, end)
        self._cached_from = (segment, max(mark, end - end % FOLIO))

    def _fail(self, batch: list[Entry], exc: BaseException) -> None:
        """Forget the batch and everything queued after it, rewind, cut the files back."""
        first = batch[0].loc
        if self._direct is not None:
            self._direct.forget()  # the files are cut back to the batch's start
        with self._lock:
            failed = batch + self._pending
            self._pending = []
            for entry in failed:
                if self._unwritten.pop(entry.loc, None) is not None:
                    self.unwritten_bytes -= HEADER_SIZE + entry.loc.length
                entry.ticket.loc = None
            self._seg, self._off = first.segment, first.offset
            upto = batch[-1].loc.segment
            if self._repair is not None:
                start = min(self._repair[:2], (first.segment, first.offset))
                self._repair = (*start, max(self._repair[2], upto))
            else:
                self._repair = (first.segment, first.offset, upto)
        try:
            self._truncate_back()
        except OSError:
            log.exception("journal: cannot cut back failed batch yet; will retry")
        self.stats.failures += 1
        log.error("journal: records %d..%d failed: %s", failed[0].seq, failed[-1].seq, exc)
        try:
            self._on_failed(failed[0].seq, failed[-1].seq, exc)
        except Exception:
            log.exception("journal on_failed callback failed")

    def _truncate_back(self) -> None:
        """Remove every byte of failed batches so no torn record can survive a crash."""
        assert self._repair is not None
        first_seg, first_off, upto = self._repair
        for seg in range(first_seg, upto + 1):
            with self._lock:
                fd = self._fds.get(seg)
            if fd is None:
                continue
            start = first_off if seg == first_seg else 0
            size = os.fstat(fd).st_size
            if size > start:
                os.ftruncate(fd, start)
                if self.preallocate:
                    os.ftruncate(fd, size)
            os.fdatasync(fd)
        self._repair = None

    def _writer_fd(self, seg: int) -> int:
        with self._lock:
            fd = self._fds.get(seg)
        if fd is not None:
            return fd
        prep = self._prep
        if prep is not None and prep[0] == seg:
            self._prep = None
            fd = prep[1].result()
        elif self.segment_path(seg).exists():
            fd = os.open(self.segment_path(seg), os.O_RDWR)
        else:
            fd = self._new_segment(seg, self.preallocate, True)
        spare_kept = self.segment_path(seg + 1).exists()  # recovery keeps a zeroed next one
        if self._helper is not None and self._prep is None and not spare_kept:
            self._prepare(seg + 1)
        with self._lock:
            kept = self._fds.setdefault(seg, fd)
        if kept != fd:
            os.close(fd)
        return kept

    def _prepare(self, seg: int) -> None:
        """Have the helper make segment ``seg`` ahead of need: zero-filled, unless the records
        written since the last one averaged ``LARGE_RECORD`` bytes or more (a stream)."""
        assert self._helper is not None
        stats = self.stats
        written, size = self._prep_mark
        self._prep_mark = (stats.records, stats.bytes)
        zero = zero_fill(stats.records - written, stats.bytes - size)
        future = self._helper.submit(self._new_segment, seg, True, zero)
        self._prep = (seg, future)

    def _new_segment(self, seg: int, preallocate: bool, zero: bool) -> int:
        """An fd of new segment ``seg``: a spare renamed to it if the pool has one, else a new
        file (zero-filled or allocated to the segment size with ``preallocate``, else empty)."""
        fd = self.pool.take(seg, self.header_key.seeds(seg), self.fence)
        if fd is not None:
            return fd
        size = self.segment_bytes if preallocate else 0
        return create_segment(self.directory, seg, size, zero=zero, fence=self.fence)

    def _delete(self, doomed: list[int]) -> None:
        """Unlink reclaimed segments in order, or keep their files as spares (``recycle.py``);
        a failure keeps it and every later one queued."""
        if self.fence is not None:
            self.fence()
        self._undeleted.extend(doomed)
        removed = 0
        while self._undeleted:
            seg = self._undeleted[0]
            with self._lock:
                fd = self._fds.pop(seg, None)
            if fd is not None:
                os.close(fd)
                if self._direct is not None:
                    self._direct.close_segment(seg)
            try:
                path = self.segment_path(seg)
                if not self.pool.offer(seg, path):
                    path.unlink(missing_ok=True)
            except OSError:
                log.exception("journal: cannot delete segment %d; will retry", seg)
                break
            self._undeleted.pop(0)
            removed += 1
        if removed:
            try:
                fsync_dir(self.directory)
            except OSError:
                log.exception("journal: directory fsync after deletion failed")
