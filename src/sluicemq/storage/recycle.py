"""Reclaimed journal segments kept for reuse instead of deleted (a bounded pool of spares).

Why: appending into blocks a file already wrote is the cheapest write a filesystem has. A new
segment is either zero-filled (every byte written twice) or fallocated, and each fdatasync into
fallocated space also commits the unwritten-extent conversions it caused: 0.23-0.30 s of
fdatasync a GiB against 0.09-0.11 s into blocks written before (README, Large streams, #15).
A reclaimed segment's file is such a file, so reclaim renames it to a spare name
(``<old number>.spare``) while the pool has room, and the next segment is a spare renamed to
its new number. PostgreSQL recycles WAL segments the same way; RocksDB's
``recycle_log_file_num`` too.

What makes it safe: a record's header checksum is seeded with its segment number and offset
(``segment.py``), and a spare only ever gets a number above every segment it held before, so the
records of a file's earlier use never check out under its new number: after the new tail they
are exactly as dead as a torn tail. Records written into a reused file carry ``REUSED`` in their
header flags, which tells recovery that non-records after a segment's last record are the file's
earlier contents, not damage (``recovery.py``). The earlier use's message bodies are another
matter: their bytes are their senders', who may lay one out as a record of the number and
offset the file gets later. The checksums are keyed with the journal's secret
(``headerkey.py``), so such a record checks out only if its sender guessed the segment's 64
secret bits, and recovery resynchronises past damage in a reused file as in a new one. A
segment of a journal written before keys is still read as a chain (``recovery.py``), and a
clean stop zeroes what follows the active segment's last record (``seal``) for it.

What keeps them from costing room (``bound``): spares are disk the log itself may need, so they
live inside the journal's budget and give it back first, as PostgreSQL removes rather than
recycles WAL segments beyond its limits. Live segments plus spares stay within the store limit
(flow control counts live segments only, so a spare never blocks a producer: by the time the
log needs that room the spare has become its next segment or been deleted), and while the
filesystem's free space is below ``min_free`` no file is kept and spares are deleted, oldest
first, until it is back above it (checked at each reclaim and once a second, ``trim``).

Threads: ``offer`` runs on the journal's writer thread (reclaim), ``take`` on the helper that
prepares the next segment (or the writer), ``trim`` on either helper, ``reused`` on the writer,
``seal`` on the thread that closes the journal once the writer has stopped;
``_lock`` guards the pool and the set of reused segments, and no I/O happens under it.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from sluicemq.storage.segment import (
    HEADER_SIZE,
    Seeds,
    fsync_dir,
    parse_segment_name,
    reuse_stamp,
    segment_name,
)

SPARE_SUFFIX = ".spare"
_SPARE = re.compile(r"^(\d{20})\.spare$")


def spare_name(segment: int) -> str:
    """The pool's name for the file that was segment ``segment``."""
    return f"{segment:020d}{SPARE_SUFFIX}"


def parse_spare_name(name: str) -> int | None:
    """The former segment number of a spare file's name, or None for other files."""
    match = _SPARE.match(name)
    return int(match.group(1)) if match else None


class SegmentPool:
    """Spare segment files, oldest first, at most ``keep_bytes // segment_bytes`` of them; a
    file larger than a segment (one record of its own) is deleted, as are all files of a pool
    whose segment size was lowered since."""

    def __init__(self, directory: Path, segment_bytes: int, keep_bytes: int) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.keep = keep_bytes // segment_bytes if keep_bytes > 0 else 0
        self.taken = 0  # segments made from a spare (counter, advisory)
        self.released = 0  # spares deleted to give their room back (counter, advisory)
        self.limit = 0  # live segments + spares stay within this many bytes; 0: no bound
        self.min_free = 0  # bytes the filesystem keeps free before spares are kept; 0: none
        self.live: Callable[[], int] = lambda: 0  # segments in the log now (the journal's)
        self._lock = threading.Lock()
        self._spares: list[tuple[int, int]] = []  # (former number, file size)
        self._reused: set[int] = set()

    def adopt(self, spares: Iterable[int], reused: Iterable[int]) -> None:
        """After recovery: the spare files found (their former numbers) and the segments whose
        records say they were written into a reused file. Files beyond the bound, or of
        another size, are deleted."""
        kept: list[tuple[int, int]] = []
        for old in sorted(spares):
            path = self.directory / spare_name(old)
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                continue
            if size <= self.segment_bytes and len(kept) < self.keep:
                kept.append((old, size))
            else:
                path.unlink(missing_ok=True)
        with self._lock:
            self._spares = kept
            self._reused = set(reused)

    def bound(self, limit: int, min_free: int = 0) -> None:
        """Spares from now on stay within ``limit`` bytes together with the live segments (the
        store limit; 0: none) and are given back while the filesystem has less than
        ``min_free`` bytes free (0: 5 % of its size)."""
        self.limit = limit
        if min_free <= 0:
            fs = os.statvfs(self.directory)
            min_free = fs.f_blocks * fs.f_frsize // 20
        self.min_free = min_free

    def _room(self) -> tuple[int, int]:
        """(spares the bounds allow now, bytes the filesystem lacks below ``min_free``)."""
        slots = self.keep
        if self.limit > 0:
            slots = min(slots, max(0, self.limit // self.segment_bytes - self.live()))
        short = 0
        if self.min_free > 0:
            fs = os.statvfs(self.directory)
            short = max(0, self.min_free - fs.f_bavail * fs.f_frsize)
        return slots, short

    def pressed(self) -> bool:
        """Do spares hold room the bounds want back now? (a statvfs: cheap enough per second)"""
        with self._lock:
            if not self._spares:
                return False
            count = len(self._spares)
        slots, short = self._room()
        return count > slots or short > 0

    def trim(self, fence: Callable[[], None] | None = None) -> int:
        """Delete spares, oldest first, until the bounds hold; how many went."""
        return self._give_back(*self._room(), fence=fence)

    def _give_back(self, slots: int, short: int,
                   fence: Callable[[], None] | None = None) -> int:
        """Delete the oldest spares beyond ``slots`` and enough more to free ``short`` bytes.
        No directory fsync: a deletion lost to a crash leaves a spare that the next start's
        ``adopt`` and ``trim`` judge again."""
        doomed: list[int] = []
        with self._lock:
            while self._spares and (len(self._spares) > slots or short > 0):
                old, size = self._spares.pop(0)
                short -= size
                doomed.append(old)
            self.released += len(doomed)
        if doomed and fence is not None:
            fence()
        for old in doomed:
            with contextlib.suppress(OSError):
                (self.directory / spare_name(old)).unlink(missing_ok=True)
        return len(doomed)

    def offer(self, segment: int, path: Path) -> bool:
        """Keep reclaimed ``segment``'s file (fd closed) as a spare if the bounds leave room and
        it is no larger than a segment; False: the caller deletes it (and spares the bounds no
        longer allow are deleted here). The caller fsyncs the directory."""
        with self._lock:
            self._reused.discard(segment)
        try:
            size = os.stat(path).st_size
            slots, short = self._room()
            with self._lock:
                full = len(self._spares) >= slots
            if full or short > 0 or size > self.segment_bytes:
                self._give_back(slots, short - size)  # deleting this file frees `size` of it
                return False
            os.rename(path, self.directory / spare_name(segment))
        except OSError:
            return False
        with self._lock:
            self._spares.append((segment, size))
        return True

    def take(self, segment: int, seeds: Seeds,
             fence: Callable[[], None] | None = None) -> int | None:
        """Make segment ``segment`` (checksum ``seeds``) from the oldest spare: stamped
        (``segment.reuse_stamp``),
        renamed, the rename made durable, opened O_RDWR; its fd, or None when the pool is empty
        (or a step failed: the file is then given up)."""
        with self._lock:
            if not self._spares:
                return None
            old = self._spares.pop(0)[0]
        spare = self.directory / spare_name(old)
        path = self.directory / segment_name(segment)
        if fence is not None:
            fence()
        fd = -1
        try:
            fd = os.open(spare, os.O_RDWR)
            os.pwrite(fd, reuse_stamp(segment, seeds=seeds), 0)
            os.fdatasync(fd)
            os.rename(spare, path)
            fsync_dir(self.directory)  # before any record of it is reported durable
        except OSError:
            with contextlib.suppress(OSError):  # given up: the caller creates the segment
                if fd >= 0:
                    os.close(fd)
                spare.unlink(missing_ok=True)
                path.unlink(missing_ok=True)
            return None
        with self._lock:
            self._reused.add(segment)
            self.taken += 1
        return fd

    def seal(self, segment: int, fd: int, end: int,
             fence: Callable[[], None] | None = None) -> None:
        """At a clean stop, zero the header-sized bytes after reused ``segment``'s last record
        (``end``; ``fd`` its file). Why: the file's earlier contents there may be a message
        body its sender wrote as a record of this number and offset, and the next start reads
        on from the log's end (``recovery.py``): zeros end the segment's chain there."""
        if not self.reused(segment):
            return
        nbytes = min(HEADER_SIZE, os.fstat(fd).st_size - end)
        if nbytes <= 0:
            return
        if fence is not None:
            fence()
        os.pwrite(fd, bytes(nbytes), end)
        os.fdatasync(fd)

    def reused(self, segment: int) -> bool:
        """Whether ``segment`` is written into a reused file (its records carry REUSED)."""
        with self._lock:
            return segment in self._reused

    @property
    def spares(self) -> int:
        with self._lock:
            return len(self._spares)

    @property
    def spare_bytes(self) -> int:
        """Bytes on disk held by spare files (they are not part of the log)."""
        with self._lock:
            return sum(size for _old, size in self._spares)

    def on_disk(self) -> int:
        """Bytes the journal's segment and spare files hold in its directory now, read from the
        directory itself, so before recovery too: a default store limit taken from the free
        disk at start adds them back, else a journal restarted with data (or spares) would
        find its own files counted against it."""
        total = 0
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.directory):
                if parse_segment_name(entry.name) is None and parse_spare_name(entry.name) is None:
                    continue
                with contextlib.suppress(FileNotFoundError):
                    total += entry.stat().st_size
        return total
