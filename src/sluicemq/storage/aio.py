"""Linux native AIO (``io_setup``, ``io_submit``, ``io_getevents``) through ctypes, for writes.

Why: the journal writes large records with O_DIRECT (``direct.py``), and a direct ``pwrite``
returns only once the disk has the bytes: one chunk at a time, the disk would idle while the
writer copies the next one, and the writer while the disk writes. Submitted here instead, the
disk writes one chunk while the writer copies the next, with no thread in between (the
standard library has no binding; the calls are three system calls on a 64-byte struct).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform

# (io_setup, io_destroy, io_submit, io_getevents): x86-64's own table, arm64's generic one
_CALLS = {"x86_64": (206, 207, 209, 208), "aarch64": (0, 1, 2, 4)}
_PWRITE = 1  # IOCB_CMD_PWRITE


class _IoCb(ctypes.Structure):
    """struct iocb (linux/aio_abi.h), little-endian layout."""

    _fields_ = [("data", ctypes.c_uint64), ("key", ctypes.c_uint32),
                ("rw_flags", ctypes.c_int32), ("opcode", ctypes.c_uint16),
                ("reqprio", ctypes.c_int16), ("fildes", ctypes.c_uint32),
                ("buf", ctypes.c_uint64), ("nbytes", ctypes.c_uint64),
                ("offset", ctypes.c_int64), ("reserved2", ctypes.c_uint64),
                ("flags", ctypes.c_uint32), ("resfd", ctypes.c_uint32)]


class _IoEvent(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64), ("obj", ctypes.c_uint64),
                ("res", ctypes.c_int64), ("res2", ctypes.c_int64)]


_syscall = ctypes.CDLL(None, use_errno=True).syscall  # (releases the GIL: io_getevents waits)
_syscall.restype = ctypes.c_long
_syscall_held = ctypes.PyDLL(None, use_errno=True).syscall
"""The same call keeping the GIL, for the calls that never wait: io_submit (it pins the pages
and queues the write, tens of microseconds) and io_getevents of what is complete already. Why:
a writer that let go of the GIL for them waited to get it back from the loop, which in a
stream is busy receiving the next chunks, while the writer is the stream's busy stage (README,
Large streams, session 20: with ``direct.py``'s copy keeping it too, the no-consumer GiB
1.13x)."""
_syscall_held.restype = ctypes.c_long


def _check(result: int) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return result


class WriteQueue:
    """At most ``depth`` pwrites in flight, each named by a slot number in ``0..depth-1``.
    Raises OSError where the kernel has no AIO (then write synchronously instead)."""

    def __init__(self, depth: int) -> None:
        calls = _CALLS.get(platform.machine())
        if calls is None:
            raise OSError("no native AIO on this machine")
        setup, self._destroy, self._submit, self._getevents = calls
        self._ctx = ctypes.c_ulong(0)
        _check(_syscall(ctypes.c_long(setup), ctypes.c_long(depth), ctypes.byref(self._ctx)))
        # One iocb per slot, its constant fields set once; io_submit takes a pointer array.
        self._cbs = [_IoCb(data=slot, opcode=_PWRITE) for slot in range(depth)]
        self._lists = [(ctypes.POINTER(_IoCb) * 1)(ctypes.pointer(cb)) for cb in self._cbs]
        self._call = ctypes.c_long(self._submit)
        self._single = ctypes.c_long(1)
        self._reap_call = ctypes.c_long(self._getevents)
        self._none = ctypes.c_long(0)
        self._events = (_IoEvent * depth)()
        self.busy: set[int] = set()

    def submit(self, slot: int, fd: int, address: int, length: int, offset: int) -> None:
        """Start writing ``length`` bytes at ``address`` to ``fd`` at ``offset`` (the GIL
        kept: ``_syscall_held``)."""
        cb = self._cbs[slot]
        cb.fildes, cb.buf, cb.nbytes, cb.offset = fd, address, length, offset
        _check(_syscall_held(self._call, self._ctx, self._single, self._lists[slot]))
        self.busy.add(slot)

    def reap(self, least: int = 1) -> list[tuple[int, int]]:
        """Wait for at least ``least`` writes: (slot, result) of each - the bytes written, or
        -errno. What is complete already is taken with the GIL kept (a call that cannot
        wait); only the wait for the rest lets go of it."""
        size = ctypes.sizeof(_IoEvent)
        done = _check(_syscall_held(self._reap_call, self._ctx, self._none,
                                    ctypes.c_long(len(self._events)), self._events, None))
        while done < least:
            more = _syscall(self._reap_call, self._ctx, ctypes.c_long(least - done),
                            ctypes.c_long(len(self._events) - done),
                            ctypes.byref(self._events, done * size), None)
            if more < 0 and ctypes.get_errno() == errno.EINTR:
                continue
            done += _check(more)
        results = [(int(event.data), int(event.res)) for event in self._events[:done]]
        self.busy.difference_update(slot for slot, _ in results)
        return results

    def close(self) -> None:
        """Wait for what is in flight, then free the kernel's context."""
        while self.busy:
            self.reap(len(self.busy))
        _syscall(ctypes.c_long(self._destroy), self._ctx)
