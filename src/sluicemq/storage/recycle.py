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
earlier contents, not damage (``recovery.py``).

Threads: ``offer`` runs on the journal's writer thread (reclaim), ``take`` on the helper that
prepares the next segment (or the writer), ``reused`` on the writer; ``_lock`` guards the pool
and the set of reused segments, and no I/O happens under it.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from sluicemq.storage.segment import fsync_dir, reuse_stamp, segment_name

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

    def offer(self, segment: int, path: Path) -> bool:
        """Keep reclaimed ``segment``'s file (fd closed) as a spare if there is room and it is
        no larger than a segment; False: the caller deletes it. The caller fsyncs the
        directory."""
        with self._lock:
            self._reused.discard(segment)
            if len(self._spares) >= self.keep:
                return False
        try:
            size = os.stat(path).st_size
            if size > self.segment_bytes:
                return False
            os.rename(path, self.directory / spare_name(segment))
        except OSError:
            return False
        with self._lock:
            self._spares.append((segment, size))
        return True

    def take(self, segment: int, fence: Callable[[], None] | None = None) -> int | None:
        """Make segment ``segment`` from the oldest spare: stamped (``segment.reuse_stamp``),
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
            os.pwrite(fd, reuse_stamp(segment), 0)
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
