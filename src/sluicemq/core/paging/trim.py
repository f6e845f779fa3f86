"""Giving freed heap back to the operating system once a burst has drained.

Why: message bodies are freed to glibc's malloc, which keeps the pages for later; after a burst
of 100k 1 KiB messages drained, the broker stayed at ~170 MiB resident (49 MiB idle) for good.
``malloc_trim(0)`` hands the free pages back, but it walks the whole heap (milliseconds), so
it runs only when the bytes the broker holds for queued messages fell far below their peak
since the last trim and stopped falling (the drain is over) - once per burst, not once a tick.

Queued bytes are not all a burst leaves behind: 200 subscribers that stopped reading held
~70 MiB of frames in their transports' buffers, freed when they were dropped, and that stayed
resident too (no queued bytes and too few connections went for either rule). So the heap's
own free bytes are watched as well (glibc's ``mallinfo2``): a trim once at least ``min_drop``
more lies free than the least seen since the last trim and it stopped growing.

CPython's small objects do not live in glibc's heap but in 1 MiB arenas of its own, and an arena
is returned only once every block in it is free. The interpreter's free lists (tuples, dicts,
floats, ...) keep blocks made during a burst alive in otherwise empty arenas, and a full
collection is what clears them: after each drained 100k burst it returned 3-5 of the 5-6 arenas
the burst had added (2026-11-25, bench/memdump.py census). So the burst-drain trim collects first.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import time
from collections.abc import Callable

log = logging.getLogger("sluicemq.memory")

MIN_DROP = 32 << 20  # a smaller drop is not worth walking the heap for
MIN_CONNECTIONS_DROP = 256  # connections gone since their peak, for a trim after a storm
FRACTION = 0.25  # trim once what is held fell to a quarter of the peak
STILL = 2  # ... and held still for two looks: frames written out are freed after the account
HEAP_LOOKS = 5  # looks (4 a second) between two trims for freed heap: churn is not walked often


class HeapTrimmer:
    """Decides when to trim: ``observe`` the broker's queued bytes once a tick."""

    def __init__(self, trim: Callable[[], object] | None, *, min_drop: int = MIN_DROP,
                 fraction: float = FRACTION, free: Callable[[], int] | None = None,
                 collect: Callable[[], object] = gc.collect) -> None:
        self._trim = trim
        self._free = free  # the heap's free bytes (mallinfo2), None where unknown
        self._collect = collect  # a full collection: clears the free lists that pin arenas
        self.min_drop = min_drop
        self.fraction = fraction
        self.peak = 0
        self.last = 0
        self.still = 0  # looks in a row that found ``used`` unchanged
        self.trims = 0
        self._conns_peak = 0  # the most connections since the last trim
        self._conns_last = 0
        self._conns_still = 0
        self._free_low = -1  # the least free heap seen since the last trim (-1: none yet)
        self._free_last = 0
        self._looks = HEAP_LOOKS  # looks at the free heap since the last trim

    @property
    def available(self) -> bool:
        return self._trim is not None

    def observe(self, used: int, peak: int = 0) -> bool:
        """Record ``used`` (and ``peak``, the most used since the last look: a burst may fill
        and drain between two looks); trim (and say so) if it fell far enough below the peak
        and held still since the last look."""
        self.still = self.still + 1 if used == self.last else 0
        falling, self.last = used < self.last, used
        self.peak = max(self.peak, peak)
        if used >= self.peak:
            self.peak = used
            return False
        if (falling or self.still < STILL or self.peak - used < self.min_drop
                or used > self.peak * self.fraction):
            return False
        dropped, self.peak = self.peak - used, used
        started = time.perf_counter()
        self._collect()
        collected = time.perf_counter() - started
        if self._trim is None:
            return False
        self._trimmed()
        log.info("heap trimmed after %d MiB of queued messages were released (collection "
                 "%.1f ms, trim %.1f ms)", dropped >> 20, collected * 1e3,
                 (time.perf_counter() - started - collected) * 1e3)
        return True

    def observe_heap(self) -> bool:
        """A few times a second (the app's tick loop): trim (and say so) when the heap's free
        bytes rose at least ``min_drop`` above the least seen since the last trim and stopped
        rising, at most once in ``HEAP_LOOKS`` looks."""
        if self._free is None or self._trim is None:
            return False
        free = self._free()
        low = free if self._free_low < 0 else min(self._free_low, free)
        rising, self._free_last, self._free_low = free > self._free_last, free, low
        self._looks += 1
        if rising or free - low < self.min_drop or self._looks < HEAP_LOOKS:
            return False
        self._trimmed()
        log.info("heap trimmed: %d MiB freed since the last trim", (free - low) >> 20)
        return True

    def after_recovery(self) -> bool:
        """Once, when start-up recovery is done: collect and trim (and say so), where the C
        library can trim.

        Why: replay's bookkeeping of a deep backlog (columns of every message found, tens of
        MiB) is garbage once the cursors took it, but some of it only a full collection frees
        (the replay object refers to itself through its record handlers), and what it freed
        in glibc's heap stays resident: neither rule above sees it, since the free heap's first
        look comes after it. Measured with 1.5 M queued after a full scan: RssAnon 95 -> 26 MiB
        (collection ~20 ms, trim ~2 ms)."""
        if self._trim is None:
            return False
        started = time.perf_counter()
        self._collect()
        collected = time.perf_counter() - started
        self._trimmed()
        log.info("heap trimmed after recovery (collection %.1f ms, trim %.1f ms)",
                 collected * 1e3, (time.perf_counter() - started - collected) * 1e3)
        return True

    def _trimmed(self) -> None:
        assert self._trim is not None
        self._trim()
        self.trims += 1
        self._free_low = -1  # what lies free now was given back (as far as it can be)
        self._looks = 0


    def observe_connections(self, count: int) -> bool:
        """Record the open connection count once a tick; after a storm of connections went
        (a quarter of the peak left, at least ``MIN_CONNECTIONS_DROP`` fewer, and still for
        ``STILL`` looks) collect cyclic garbage and trim (and say so).

        Why: a connection's objects (transport, protocol, session, a WebSocket's HTTP
        request) refer to each other, so only the cyclic collector frees them, and it rarely
        looks at objects old enough to have held a connection: 11,000 WebSocket upgrades
        left ~75 MiB of garbage cycles and ~35 MiB of free heap resident for good.
        """
        self._conns_still = self._conns_still + 1 if count == self._conns_last else 0
        self._conns_last = count
        self._conns_peak = max(self._conns_peak, count)
        peak = self._conns_peak
        if (self._conns_still < STILL or peak - count < MIN_CONNECTIONS_DROP
                or count > peak * self.fraction):
            return False
        self._conns_peak = count
        self._collect()
        if self._trim is not None:
            self._trimmed()
        else:
            self.trims += 1
        log.info("heap trimmed after %d connections closed", peak - count)
        return True


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def heap_free() -> Callable[[], int] | None:
    """glibc's free heap bytes (``mallinfo2().fordblks``: freed, kept for reuse), or None
    where the C library has no ``mallinfo2`` (glibc < 2.33, musl, macOS)."""
    name = ctypes.util.find_library("c")
    try:
        fn = ctypes.CDLL(name or "libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return None
    fn.argtypes = []
    fn.restype = _MallInfo2
    return lambda: int(fn().fordblks)


def malloc_trim() -> Callable[[], object] | None:
    """glibc's ``malloc_trim(0)``, or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    try:
        fn = ctypes.CDLL(name or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return lambda: fn(0)
