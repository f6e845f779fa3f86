"""Reading the journal back: one record, many, spans of neighbours, or a header peek.

A mixin of ``Journal`` (the loop thread's side). A record still pending in memory is served
from there; otherwise the segment's shared fd is duplicated under the lock and the ``pread``
runs outside it, so readers never hold the lock across I/O.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

from sluicemq.buffers import BufferPool
from sluicemq.errors import StorageError
from sluicemq.storage.headerkey import HeaderKey
from sluicemq.storage.segment import HEADER_SIZE, Location, intact_at, verify_record

EXTENT_BYTES = 16 << 20  # runread.SPAN: one read covers at most this
EXTENTS_KEPT = 4


class JournalReads:
    """Read methods; the state is the journal's (``Journal.__init__``)."""

    _lock: threading.Lock
    _unwritten: dict[Location, bytes | tuple[bytes, bytes]]
    _segs: dict[int, int]
    _state: str
    _fds: dict[int, int]
    _extents: BufferPool  # read extents, reused once a transport wrote them
    header_key: HeaderKey

    def segment_path(self, segment: int) -> Path:
        raise NotImplementedError

    def _pending_payload(self, loc: Location) -> bytes | None:
        """The payload of a record appended but not yet written (None: not pending); a
        record appended as payload + tail is joined here once, on its first read. Call with
        ``_lock`` held."""
        data = self._unwritten.get(loc)
        if isinstance(data, tuple):
            joined = self._unwritten[loc] = b"".join(data)
            return joined
        return data

    def read(self, loc: Location) -> bytes:
        """The payload at loc, checksum-verified; pending records are served from memory."""
        with self._lock:
            data = self._pending_payload(loc)
            if data is not None:
                return data
            if loc.segment not in self._segs and self._state != "recovering":
                raise StorageError(f"segment {loc.segment} is gone (reclaimed)")
            try:  # while recovering, records already yielded may be read back (TX parts)
                fd = os.dup(self._fd(loc.segment))
            except OSError as exc:
                raise StorageError(f"cannot open segment {loc.segment}: {exc}") from exc
        try:
            header = os.pread(fd, HEADER_SIZE, loc.offset)
            payload = os.pread(fd, loc.length, loc.offset + HEADER_SIZE)
        except OSError as exc:
            raise StorageError(f"cannot read {loc}: {exc}") from exc
        finally:
            os.close(fd)
        found = verify_record(header, payload, loc, seeds=self.header_key.seeds(loc.segment))
        if isinstance(found, str):
            raise StorageError(f"bad record at {loc}: {found}")
        return payload

    def read_many(self, locs: list[tuple[int, int, int]], *, span: int = 4 << 20,
                  gap: int = 64 << 10) -> list[bytes | memoryview]:
        """The payloads of the records at ``locs`` ((segment, offset, length) like a
        ``Location``), checksum-verified, in order; read as ``read_spans`` groups them."""
        out: list[bytes | memoryview] = []
        for buf, first, i, j in self.read_spans(locs, span=span, gap=gap):
            if first < 0:
                out.append(buf)
                continue
            seeds = self.header_key.seeds(locs[i][0])  # a span lies in one segment
            for seg, off, size in locs[i:j]:
                at = off - first
                if not intact_at(buf, at, seg, off, size, seeds=seeds):
                    why = verify_record(bytes(buf[at:at + HEADER_SIZE]),
                                        buf[at + HEADER_SIZE:at + HEADER_SIZE + size],
                                        Location(seg, off, size), seeds=seeds)
                    raise StorageError(f"bad record at {Location(seg, off, size)}: {why}")
                out.append(buf[at + HEADER_SIZE:at + HEADER_SIZE + size])
        return out

    def read_spans(self, locs: list[tuple[int, int, int]], *, span: int = 4 << 20,
                   gap: int = 64 << 10) -> Iterator[tuple[bytes | memoryview, int, int, int]]:
        """The records at ``locs`` as groups ``(buf, first, i, j)`` covering ``locs[i:j]``,
        NOT verified (callers check each record, ``read_many`` or ``storage/runread.py``).
        Neighbouring records of one segment come from one ``pread`` of up to ``span`` bytes
        starting at offset ``first`` (bridging gaps of up to ``gap`` bytes of other records):
        a range read of a backlog costs a syscall per few MiB, not two per message. A record
        still pending in memory is a group of its own with ``first == -1`` and ``buf`` its
        payload (verified: it never left memory)."""
        i, n = 0, len(locs)
        while i < n:
            seg, first, length = locs[i]
            with self._lock:
                pending = self._unwritten
                data = self._pending_payload(Location(seg, first, length)) if pending else None
                if data is not None:
                    yield data, -1, i, i + 1
                    i += 1
                    continue
                if seg not in self._segs and self._state != "recovering":
                    raise StorageError(f"segment {seg} is gone (reclaimed)")
                try:
                    fd = os.dup(self._fd(seg))
                except OSError as exc:
                    raise StorageError(f"cannot open segment {seg}: {exc}") from exc
                j, end = i + 1, first + HEADER_SIZE + length
                while j < n:
                    s2, off, size = locs[j]
                    stop = off + HEADER_SIZE + size
                    if (s2 != seg or off < end or off - end > gap or stop - first > span
                            or (pending and Location(s2, off, size) in pending)):
                        break
                    end = stop
                    j += 1
            try:
                buf = memoryview(os.pread(fd, end - first, first))
            except OSError as exc:
                raise StorageError(f"cannot read segment {seg} at {first}: {exc}") from exc
            finally:
                os.close(fd)
            yield buf, first, i, j
            i = j

    def unwritten_from(self) -> tuple[int, int] | None:
        """(segment, offset) of the oldest record appended but not yet written, or None.
        Records are appended and written in location order, so every record before it can be
        read from its segment file (``read_extent``); bulk readers send the rest to ``read``."""
        with self._lock:
            if not self._unwritten:
                return None
            loc = next(iter(self._unwritten))
            return loc.segment, loc.offset

    def read_extent(self, segment: int, start: int, end: int) -> memoryview:
        """Bytes ``[start, end)`` of a segment as written, NOT verified: for bulk readers that
        check every record they take out of it (``storage/runread.py``), with one ``pread``
        for many neighbouring records. The bytes land in a buffer that is reused once nothing
        refers to it any more (a fresh multi-MiB buffer a read cost page faults and an
        ``munmap`` that were a quarter of a backlog read's time)."""
        size = end - start
        with self._lock:
            if segment not in self._segs and self._state != "recovering":
                raise StorageError(f"segment {segment} is gone (reclaimed)")
            try:
                fd = os.dup(self._fd(segment))
            except OSError as exc:
                raise StorageError(f"cannot open segment {segment}: {exc}") from exc
        spare = self._extents.take(size)
        try:
            if spare is None:  # every kept buffer is still referenced: a fresh one, exact size
                data: bytes | memoryview = os.pread(fd, size, start)
                got = len(data)
            else:
                data = spare[:size]
                got = os.preadv(fd, [data], start)
        except OSError as exc:
            raise StorageError(f"cannot read segment {segment} at {start}: {exc}") from exc
        finally:
            os.close(fd)
        if got != size:
            raise StorageError(f"segment {segment} ends before {end} (read {got} bytes "
                               f"from {start})")
        return memoryview(data)

    def peek(self, loc: Location, start: int, length: int) -> bytes:
        """Up to ``length`` bytes of loc's payload from ``start``, NOT checksum-verified: a
        cheap look at a record's head (range reads classify stream chunks by their headers);
        anything delivered is read with ``read``, which verifies."""
        length = max(0, min(length, loc.length - start))
        with self._lock:
            data = self._pending_payload(loc)
            if data is not None:
                return bytes(data[start:start + length])
            if loc.segment not in self._segs:
                raise StorageError(f"segment {loc.segment} is gone (reclaimed)")
            try:
                fd = os.dup(self._fd(loc.segment))
            except OSError as exc:
                raise StorageError(f"cannot open segment {loc.segment}: {exc}") from exc
        try:
            return os.pread(fd, length, loc.offset + HEADER_SIZE + start)
        except OSError as exc:
            raise StorageError(f"cannot read {loc}: {exc}") from exc
        finally:
            os.close(fd)

    def _fd(self, seg: int) -> int:
        """The shared fd of a segment, opened on first use; call with the lock held."""
        fd = self._fds.get(seg)
        if fd is None:
            fd = os.open(self.segment_path(seg), os.O_RDWR)
            self._fds[seg] = fd
        return fd
