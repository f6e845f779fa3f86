"""Large journal records written with O_DIRECT from a few reused, aligned staging slots.

Why: a buffered write copies every byte of a stream into fresh page-cache pages - page
allocation, ext4's buffered-write path, dirty tracking and writeback, and on this VM a host
fault per fresh page - which the writer then drops again (``drop_cached``): 0.44-0.51 of the
writer's CPU-s a GiB, on the critical path of every receipt (README, Large streams). Written
directly, the bytes are copied once into a slot the writer keeps (the GIL kept: ``_copy``) and
the disk takes them from there. The writes are submitted asynchronously (``aio.py``), so the
disk writes one chunk while the writer copies the next; ``wait`` collects them before the
batch's fdatasync. Without native AIO each write is synchronous.

How: O_DIRECT wants the file range and the memory aligned (``ALIGN``, 4096, covers 512- and
4096-byte sectors). A record rarely starts or ends on a boundary: a direct write covers the
whole blocks from the one the record starts in, whose bytes before the record are the log's
own (kept from the last direct write, else read back once the writes in flight are done), to
the last one it fills. The block it ends in waits (``_kept``): the next large record, which
starts in it, writes it; else ``wait`` writes it through the page cache as one whole page,
zeros after the log's end, so the small records that follow find it cached. No two writes in
flight ever share a block. Nothing else changes: every write is complete and the batch
fdatasynced before its records are reported durable. Where O_DIRECT is refused (``EINVAL``)
the journal goes on writing buffered.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import mmap
import os
from collections.abc import Sequence

from sluicemq.buffers import storage_address
from sluicemq.storage.aio import WriteQueue
from sluicemq.storage.segment import write_all

log = logging.getLogger("sluicemq.storage.journal")

ALIGN = 4096
"""File offsets, lengths and memory of a direct write are multiples of this."""

SLOT_BYTES = (1 << 20) + 4 * ALIGN
"""A staging slot: a 1 MiB chunk's record (headers and alignment included) in one write;
larger records go in several."""

SLOTS = 3
"""Slots, hence writes in flight at most: one being filled while two are written."""

_ZEROS = bytes(ALIGN)
_copy = ctypes.PyDLL(None).memmove
"""libc's memmove keeping the GIL (``ctypes.memmove`` lets go of it). Why: a MiB takes ~0.07
ms, and a writer that let go of the GIL for it then waited for the loop to give it back - the
loop, in a stream, is receiving the next chunks; the writer is the stream's busy stage. The
cost: the loop waits for at most the copies and submissions of the writes in flight (~0.5 ms)."""
_copy.restype = None
_copy.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
_O_DIRECT: int = getattr(os, "O_DIRECT", 0)  # (Linux; elsewhere the journal writes buffered)


class DirectWrites:
    """The writer thread's direct writes: the slots, the writes in flight, one O_DIRECT fd
    (the segment last written), and the log's bytes in the block the last write ended in."""

    def __init__(self) -> None:
        self.enabled = True
        self._ring: mmap.mmap | None = None
        self._ring_at = 0
        self._anchor: ctypes.c_char | None = None
        self._queue: WriteQueue | None = None
        self._free: list[int] = []
        self._failure: OSError | None = None
        self._inflight: dict[int, tuple[int, int, int]] = {}  # slot: (fd, offset, length)
        self._fd = (-1, -1, -1)  # (segment, an O_DIRECT fd of it, its buffered fd)
        # (segment, block start, the log's bytes from there on): the block the last direct
        # write ended in. It is written with the next record, which starts in it, or by
        # ``wait`` (_tail_due): never by two writes in flight at once, which could land in
        # either order - the first one's zeros over the second one's first bytes.
        self._kept = (-1, -1, b"")
        self._tail_due = False

    def write(self, segment: int, fd: int, offset: int, parts: Sequence[bytes]) -> bool:
        """Write ``parts`` back to back at ``offset`` of ``segment`` (``fd``: its buffered fd)
        with O_DIRECT; False, having written nothing, where direct writes are refused. The
        write may still be in flight: ``wait`` before relying on it."""
        if not self.enabled:
            return False
        try:
            dfd = self._direct_fd(segment, fd)
        except OSError as exc:
            self._refused(exc)
            return False
        start = offset - offset % ALIGN
        head = self._head(segment, fd, start, offset - start)
        slot, at = self._slot()
        ring = self._ring
        assert ring is not None
        used = len(head)
        ring[at:at + used] = head
        rest = sum(len(p) for p in parts)
        end = offset + rest
        first = True
        for part in parts:
            source, left = storage_address(part), len(part)
            while left:
                n = min(left, SLOT_BYTES - used)
                _copy(self._ring_at + at + used, source, n)
                source, left, rest, used = source + n, left - n, rest - n, used + n
                if used == SLOT_BYTES and rest:  # full, more to come: a piece of its own
                    if not self._put(slot, fd, dfd, used, start, first):
                        return False
                    first, start, used = False, start + used, 0
                    slot, at = self._slot()
        block = end - end % ALIGN  # whole blocks now; the last, partial one waits (above)
        tail = ring[at + block - start:at + used]
        if block > start and not self._put(slot, fd, dfd, block - start, start, first):
            return False
        if block == start:
            self._free.append(slot)
        self._kept, self._tail_due = (segment, block, tail), bool(tail)
        return True

    def wait(self, *, tail_direct: bool = False) -> None:
        """Return once every direct write is complete, the last partial block included (as
        a synchronous pwrite returns); raise the first failure among them. ``tail_direct``
        (a batch's end): that block goes with O_DIRECT too, beside the writes in flight."""
        try:
            if self._tail_due:
                if tail_direct and self._queue is not None:
                    self._submit_tail()
                else:
                    self._write_tail()
        finally:
            queue = self._queue
            while queue is not None and queue.busy:
                self._reaped(queue.reap(len(queue.busy)))
            failure, self._failure = self._failure, None  # (reported once, whichever way)
        if failure is not None:
            self.forget()
            raise failure

    def forget(self) -> None:
        """Something else wrote (or cut back) the log after the last direct write: what was
        kept of its last block may be stale (and is not to be written: a rewind)."""
        self._kept, self._tail_due = (-1, -1, b""), False

    def _write_tail(self) -> None:
        """Write the block the last direct write ended in - the log's bytes, then zeros -
        through the page cache, as one whole page: no read of it first, and the small
        records that follow it (acks, say) find it cached (after a direct write of it, each
        one's buffered write would read it back from the disk first)."""
        self._tail_due = False
        _segment, block, tail = self._kept
        write_all(self._fd[2], [tail, _ZEROS[len(tail):]], block)

    def _submit_tail(self) -> None:
        """Submit the block the last direct write ended in - the log's bytes, then zeros -
        from the ring's tail page, at a batch's end. Why not through the page cache there:
        the batch's fdatasync then has no dirty page to write first, only the disk's cache
        to flush (a probe of the writer's pattern, 1 GiB in batches of 4 MiB into a written
        file: fdatasync p50 0.155 ms after a 4 KiB buffered write, 0.092 ms without). It
        stays kept: the next record, which starts in it, writes it again."""
        self._tail_due = False
        assert self._queue is not None and self._ring is not None
        _segment, block, tail = self._kept
        at = SLOTS * SLOT_BYTES
        self._ring[at:at + ALIGN] = tail + _ZEROS[len(tail):]
        self._queue.submit(SLOTS, self._fd[1], self._ring_at + at, ALIGN, block)
        self._inflight[SLOTS] = (self._fd[2], block, ALIGN)

    def head_of(self, segment: int, offset: int) -> tuple[int, bytes] | None:
        """Where a write through the page cache at ``offset`` of ``segment`` should start,
        and the log's bytes it should write first, when the last direct write ended in its
        block: (block start, those bytes). Why: that block went out with O_DIRECT at the
        batch's end (``_submit_tail``), so it is not cached, and a buffered write of part of
        it would first read it back from the disk; written from its start, no read."""
        kept_segment, block, kept = self._kept
        if kept_segment == segment and kept and block + len(kept) == offset:
            return block, kept
        return None

    def close_segment(self, segment: int) -> None:
        """The segment's files are being closed (reclaim): close its O_DIRECT fd too."""
        if self._fd[0] == segment and self._fd[1] >= 0:
            try:
                self.wait()
            finally:
                os.close(self._fd[1])
                self._fd = (-1, -1, -1)
                self.forget()

    def close(self) -> None:
        try:
            self.close_segment(self._fd[0])
        finally:
            if self._queue is not None:
                self._queue.close()
                self._queue = None
            if self._ring is not None:
                self._anchor = None  # (a mapping cannot close while ctypes views it)
                with contextlib.suppress(BufferError):  # a view outlives it: unmapped with that
                    self._ring.close()
                self._ring = None

    def _put(self, slot: int, fd: int, dfd: int, length: int, offset: int, first: bool) -> bool:
        """Write a filled slot; False if the record's first piece is refused (EINVAL:
        nothing of it written). A later piece refused fails the batch, as any write error."""
        address = self._ring_at + slot * SLOT_BYTES
        try:
            if self._queue is not None:
                self._queue.submit(slot, dfd, address, length, offset)
                self._inflight[slot] = (fd, offset, length)
                return True
            assert self._ring is not None
            view = memoryview(self._ring)[slot * SLOT_BYTES:slot * SLOT_BYTES + length]
            written = os.pwrite(dfd, view, offset)
        except OSError as exc:
            self._free.append(slot)
            if exc.errno != errno.EINVAL or not first:
                raise
            self._refused(exc)
            return False
        self._free.append(slot)
        if written < length:  # finished through the page cache, as a short AIO write is
            write_all(fd, [view[written:]], offset + written)
        return True

    def _reaped(self, results: list[tuple[int, int]]) -> None:
        """Free the slots of completed writes; note the first failure. A short write (the
        disk filled up, say) is finished through the page cache, which names the error."""
        for slot, result in results:
            fd, offset, length = self._inflight.pop(slot)
            try:
                if result < 0:
                    raise OSError(-result, f"direct write: {os.strerror(-result)}")
                if result < length:
                    start = slot * SLOT_BYTES
                    assert self._ring is not None
                    write_all(fd, [memoryview(self._ring)[start + result:start + length]],
                              offset + result)
            except OSError as exc:  # (its traceback would keep a view of the slot)
                self._failure = self._failure or exc.with_traceback(None)
            finally:
                if slot < SLOTS:  # (SLOTS: the tail page, not a slot)
                    self._free.append(slot)

    def _slot(self) -> tuple[int, int]:
        """A free slot (waiting for the oldest write in flight if none is) and its offset."""
        if self._ring is None:
            self._ring = mmap.mmap(-1, SLOTS * SLOT_BYTES + ALIGN)  # page-aligned; tail page
            self._anchor = ctypes.c_char.from_buffer(self._ring)  # (held: the address stays)
            self._ring_at = ctypes.addressof(self._anchor)
            self._free = list(range(SLOTS))
            try:
                self._queue = WriteQueue(SLOTS + 1)
            except OSError:
                self._queue = None  # synchronous writes
        while not self._free:
            assert self._queue is not None
            self._reaped(self._queue.reap(1))
        slot = self._free.pop()
        return slot, slot * SLOT_BYTES

    def _head(self, segment: int, fd: int, start: int, length: int) -> bytes:
        """The log's bytes in ``start:start + length`` (the block a record starts in)."""
        if not length:
            return b""
        kept_segment, kept_start, kept = self._kept
        if kept_segment == segment and kept_start == start and len(kept) == length:
            return kept
        self.wait()  # (a write in flight may hold them)
        head = os.pread(fd, length, start)
        return head + bytes(length - len(head))  # (past the file's end: nothing written)

    def _direct_fd(self, segment: int, fd: int) -> int:
        if self._fd[0] != segment:
            self.close_segment(self._fd[0])
            if not _O_DIRECT:
                raise OSError(errno.EINVAL, "O_DIRECT is not available here")
            # the file the buffered fd has open, whatever its name is by now
            self._fd = (segment, os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | _O_DIRECT), fd)
        return self._fd[1]

    def _refused(self, exc: OSError) -> None:
        self.enabled = False
        log.warning("journal: direct writes refused here (%s); writing through the page cache",
                    exc)
