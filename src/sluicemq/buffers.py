"""Large byte buffers kept and handed out again once nothing views them any more.

Why: a multi-MiB buffer in fresh memory costs a page fault for every 4 KiB the first time it
is written, and glibc serves each large request with a fresh ``mmap`` (returned by ``munmap``
on free), so a stream of equal-sized large buffers pays those faults again and again. On a
backlog read they were a quarter of the broker's read time (its read extents) and a third of
a column-batch client's CPU (its 4 MiB frame bodies). A kept buffer is only handed out again
while no memoryview, Arrow buffer or other export of it is alive, so nothing that still reads
it can be overwritten; a pool never holds more than ``keep`` buffers. A pool may be shared by
threads (a process's successive connections): a buffer is handed out as a view made under the
pool's lock, so it is in use before any other taker looks.
"""

from __future__ import annotations

import ctypes
import threading


class BufferPool:
    """Up to ``keep`` buffers of at most ``largest`` bytes, sized to the requests that made
    them (rounded up to ``round_to``), not to the largest possible."""

    def __init__(self, *, keep: int, largest: int, round_to: int = 1 << 20) -> None:
        self.keep = keep
        self.largest = largest
        self.round_to = round_to
        self._kept: list[bytearray] = []
        self._lock = threading.Lock()

    def take(self, size: int) -> memoryview | None:
        """A view of a buffer of at least ``size`` bytes that nothing else views, to be
        written from its start; None when ``size`` is above ``largest`` or every kept buffer
        is still viewed (then the caller allocates a fresh, exact one). The buffer is handed
        out again once this view and every view made from it are gone."""
        if size > self.largest:
            return None
        with self._lock:
            free = [k for k, buf in enumerate(self._kept) if not exported(buf)]
            for k in free:
                if len(self._kept[k]) >= size:
                    return memoryview(self._kept[k])
            buf = bytearray(-(-size // self.round_to) * self.round_to)
            if free:
                self._kept[free[0]] = buf  # too small: replaced by one that fits
            elif len(self._kept) < self.keep:
                self._kept.append(buf)
            else:
                return None
            return memoryview(buf)


class InputBuffers:
    """What one event loop's connections read into (built once by the composition root).

    ``scratch``: ordinary input, copied out at once into the bytes a parser takes (what the
    loop's own transports do with theirs), so one buffer serves every connection of the loop.
    ``body``: where a large SEND body is read from the socket (``FrameParser``'s
    ``body_buffers``): into the very bytes object the frame's body becomes. Why: a 1 MiB chunk
    was copied from the loop's buffer into 256 KiB bytes, then joined into one body - two passes
    over every byte on the loop thread (a quarter of its time in a 1 GiB stream, perf 22:50);
    gathered into a kept buffer instead, it was still copied once more into the message's own
    bytes (``bytes(body)``: 0.13 s of the loop's 0.44 CPU-s a GiB, perf 2026-11-26 02:02). Bodies
    above ``largest`` are gathered as pieces and joined; where ``fresh_bytes`` is unavailable,
    into kept buffers (``bodies``) and copied as before.
    """

    def __init__(self, *, scratch_bytes: int = 256 << 10, keep: int = 2,
                 largest: int = 4 << 20) -> None:
        self.scratch = memoryview(bytearray(scratch_bytes))
        self.bodies = BufferPool(keep=keep, largest=largest)
        self.largest = largest

    def body(self, size: int) -> tuple[bytes, memoryview] | memoryview | None:
        if size > self.largest:
            return None
        if _FILLABLE:
            return fresh_bytes(size)
        return self.bodies.take(size)


_new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
_new_bytes.restype = ctypes.py_object
_new_bytes.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
_storage = ctypes.pythonapi.PyBytes_AsString  # the C API's pointer to a bytes' storage
_storage.restype = ctypes.c_void_p
_storage.argtypes = (ctypes.py_object,)


def storage_address(data: bytes) -> int:
    """The address of ``data``'s bytes, for C code that copies from them (the bytes must stay
    alive, and unchanged, while it does)."""
    address: int = _storage(data)
    return address


def fresh_bytes(size: int) -> tuple[bytes, memoryview]:
    """A new bytes object of ``size`` bytes, not yet filled, and a writable view of its storage.

    This is what C code reading into a bytes object does (``PyBytes_FromStringAndSize(NULL,
    n)``, then fill): the caller fills the view completely and drops it before anything else
    sees the bytes, which are immutable from then on. Its contents are undefined until then
    (malloc, no zeroing), and the view does not keep the bytes alive: the caller holds both."""
    if size < 2:  # the interpreter shares its empty and 1-byte bytes: never fill those
        raise ValueError("fresh_bytes is for bodies of 2 bytes or more")
    data = _new_bytes(None, size)
    view = memoryview((ctypes.c_char * size).from_address(_storage(data))).cast("B")
    return data, view


def _fillable() -> bool:
    """Does ``fresh_bytes`` write where the bytes are (an interpreter with CPython's C API)?"""
    try:
        data, view = fresh_bytes(64)
        view[:] = bytes(range(64))
        del view
        return data == bytes(range(64))
    except (AttributeError, TypeError, ValueError, OSError):
        return False


_FILLABLE = _fillable()


def exported(buf: bytearray) -> bool:
    """Does anything still hold a view of ``buf``? (A bytearray with exported buffers refuses
    to change size; growing it by one byte and back is the check.)"""
    try:
        buf.append(0)
    except BufferError:
        return True
    del buf[-1]
    return False
