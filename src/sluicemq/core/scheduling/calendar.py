"""Where a scheduled message waits, ordered by when it is due (the scheduler's bookkeeping).

Why not one queue: a queue keeps its messages in the order they came, paged out in blocks of
slots; taking out what is due, in due order, from 100,000 messages sent in another order
meant unpacking and repacking a block for nearly every message. So waiting messages are
filed by due time instead:

- due within the horizon (``[scheduler] horizon_seconds``, a minute) of when it is filed:
  the *bucket* queue of its second,
  ``sluice.scheduled.<due // 1000>``. A bucket is read front to back once, ``AHEAD_MS``
  before its second begins (sequential page-in), and its messages wait the last moments set
  aside in RAM in their bucket (``PendingList.set_aside``: still the queue's, so counted
  against the memory limit, listed and cancellable through the admin API, kept by an index
  snapshot), with a (due, id) entry here (``imminent``) in due order, until each is due;
- further away: the *far* queue ``sluice.scheduled``; here only its id, 8 bytes in the array
  of its *slice* (half a horizon of due times; a (due, id) tuple each cost ~130 bytes, so a
  million far messages held 126 MiB). A slice is refiled into its buckets between a horizon
  and half a horizon before each of its messages is due, long before anyone waits for them:
  each message's due time is read from its headers as it moves.

So RAM holds a horizon's worth of bucket queues at most (60, paged like any queue), 8 bytes
per far message, and about ``AHEAD_MS`` + one second's worth of imminent messages (counted as
their queues' memory). The queues are
ordinary journaled queues: compaction, kill -9 recovery and the admin API see them as any
other; a bucket is known again after a restart from its name alone.
"""

from __future__ import annotations

import heapq
import itertools
from array import array
from typing import Any

from sluicemq.protocol.numbers import natural

NAME = "sluice.scheduled"  # the far queue; buckets are NAME.<second>
BUCKET_MS = 1000
AHEAD_MS = 500  # a bucket is read this long before its second begins
MIN_HORIZON_MS = 2000  # refiling (half of it ahead) must come before reading (AHEAD_MS)


def bucket_name(bucket: int) -> str:
    return f"{NAME}.{bucket}"


def bucket_of_name(name: str) -> int | None:
    """The bucket a queue name is (None: the far queue or not a scheduler queue)."""
    head, dot, tail = name.rpartition(".")
    if head != NAME or not dot:
        return None
    return natural(tail)


def is_scheduler_queue(name: str) -> bool:
    return name == NAME or name.startswith(NAME + ".")


class Calendar:
    """Which buckets hold messages, which far messages wait, which read messages are about
    to be due. Pure bookkeeping: the scheduler moves the messages."""

    def __init__(self, horizon_ms: int = 60_000) -> None:
        self.horizon = max(horizon_ms, MIN_HORIZON_MS)  # nearer when filed: into its bucket
        self._slice_ms = self.horizon // 2  # far messages are refiled a slice at a time
        self._buckets: list[int] = []  # heap of buckets that may hold messages
        self._known: set[int] = set()
        self._far: dict[int, array[int]] = {}  # slice -> ids in the far queue due in it
        self._slices: list[int] = []  # heap of the slices in _far
        self._refiling: list[int] = []  # ids of the slice being refiled, descending
        self._refiling_at = 0
        self._imminent: list[tuple[int, int, int, Any]] = []  # (due, order, id, queue)
        self._order = itertools.count()

    def place(self, due: int, now: int) -> str:
        """The queue a message due at ``due`` is filed in now."""
        return bucket_name(due // BUCKET_MS) if due < now + self.horizon else NAME

    def filed(self, name: str, due: int, mid: int) -> None:
        """A message went into queue ``name`` (as ``place`` said)."""
        bucket = bucket_of_name(name)
        if bucket is None:
            piece = due // self._slice_ms
            ids = self._far.get(piece)
            if ids is None:
                ids = self._far[piece] = array("q")
                heapq.heappush(self._slices, piece)
            ids.append(mid)
        elif bucket not in self._known:
            self._known.add(bucket)
            heapq.heappush(self._buckets, bucket)

    def bucket_to_read(self, now: int) -> int | None:
        """The earliest bucket whose reading time has come."""
        if self._buckets and self._buckets[0] * BUCKET_MS - AHEAD_MS <= now:
            return self._buckets[0]
        return None

    def bucket_read(self, bucket: int) -> None:
        """Every message of ``bucket`` was taken out."""
        if self._buckets and self._buckets[0] == bucket:
            heapq.heappop(self._buckets)
            self._known.discard(bucket)

    def hold(self, due: int, mid: int, queue: Any) -> None:
        """Message ``mid``, read out of its bucket ``queue`` and set aside there, is due at
        ``due``."""
        heapq.heappush(self._imminent, (due, next(self._order), mid, queue))

    def due(self, now: int, limit: int) -> list[tuple[int, int, Any]]:
        """Up to ``limit`` held (due, id, queue) due by ``now``, in due order."""
        out: list[tuple[int, int, Any]] = []
        heap = self._imminent
        while heap and heap[0][0] <= now and len(out) < limit:
            due, _order, mid, queue = heapq.heappop(heap)
            out.append((due, mid, queue))
        return out

    def _refile_time(self, piece: int) -> int:
        """When a slice moves: its last due time is then just within the horizon (``place``
        files it in its bucket) and its first still half a horizon away."""
        return (piece + 1) * self._slice_ms - self.horizon

    def to_refile(self, now: int, limit: int) -> list[int]:
        """Up to ``limit`` far ids whose time to move to a bucket has come, a slice at a time
        in id order (so messages due at the same moment keep the order they came in)."""
        out: list[int] = []
        while len(out) < limit:
            if not self._refiling:
                if not self._slices or self._refile_time(self._slices[0]) > now:
                    break
                piece = heapq.heappop(self._slices)
                self._refiling = sorted(self._far.pop(piece), reverse=True)
                self._refiling_at = self._refile_time(piece)
            out.append(self._refiling.pop())
        return out

    def wake_at(self) -> int | None:
        """When something next needs doing (ms), or None."""
        times = []
        if self._imminent:
            times.append(self._imminent[0][0])
        if self._buckets:
            times.append(self._buckets[0] * BUCKET_MS - AHEAD_MS)
        if self._refiling:
            times.append(self._refiling_at)
        elif self._slices:
            times.append(self._refile_time(self._slices[0]))
        return min(times) if times else None

    def held(self) -> int:
        return len(self._imminent)
