"""Which journal segments must stay: live counts per segment, and the rule for deleting one.

A mixin of ``Journal`` (the loop thread's side), sharing its state under ``_lock``. Every
queued message holds its record's segment (``retain``, or ``append(holds=)`` in the same
look); settling it lets go (``release``). ``reclaim`` deletes what nothing holds any more,
and compaction reads the counts and their byte estimates to choose what to move.

Deletion rule (reclaim): oldest segment first, and only while the segment is not the active
one, its live count (retain - release) is zero, all its records are durable, and none of its
records is newer than the newest location ever passed to retain()/release() (or recovered).
That last clause is what lets a caller retain records only once on_durable has reached its
loop: durability is known to the writer thread before the caller has acted on it, and a
record newer than anything the caller has touched may still be on its way to a retain().
A failed record's ticket gets loc = None, so deferred retains skip it.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from sluicemq.errors import StorageError
from sluicemq.storage.segment import Location


class JournalRetention:
    """Live counts and reclaim; the state is the journal's (``Journal.__init__``)."""

    segment_bytes: int
    _lock: threading.Lock
    _wake: threading.Condition
    _state: str
    _writer_idle: bool
    _seg: int
    _durable: int
    _segs: dict[int, int]  # segment -> live records, oldest first, the active one last
    _weight: dict[int, list[int]]  # segment -> [bytes appended, holds ever] (live_bytes)
    _last: dict[int, tuple[int, int]]  # segment -> (seq, offset) of its last record appended
    _horizon: tuple[int, int]  # the newest (segment, offset) ever held, let go or recovered
    _doomed: list[int]

    def segment_path(self, segment: int) -> Path:
        raise NotImplementedError

    if TYPE_CHECKING:
        def _delete(self, doomed: list[int]) -> None:
            """The writer's (``journal_writer.py``): unlink the files, or keep them as spares."""

    def retain(self, loc: Location) -> None:
        """One more live record in loc's segment: the segment must stay."""
        with self._lock:
            if loc.segment not in self._segs:
                raise StorageError(f"segment {loc.segment} is gone (reclaimed)")
            self._segs[loc.segment] += 1
            weight = self._weight.get(loc.segment)
            if weight is not None:
                weight[1] += 1
            self._horizon = max(self._horizon, (loc.segment, loc.offset))

    def retain_counts(self, counts: dict[int, int], newest: tuple[int, int]) -> None:
        """Many retains at once (segment -> records; ``newest`` the latest (segment, offset)
        among them): start-up hands over a whole recovered backlog in one call."""
        with self._lock:
            for seg in counts:
                if seg not in self._segs:
                    raise StorageError(f"segment {seg} is gone (reclaimed)")
            for seg, n in counts.items():
                self._segs[seg] += n
                weight = self._weight.get(seg)
                if weight is not None:
                    weight[1] += n
            self._horizon = max(self._horizon, newest)

    def release(self, loc: Location) -> None:
        """One fewer live record in loc's segment; call reclaim() after a run of releases."""
        with self._lock:
            live = self._segs.get(loc.segment)
            if not live:
                raise StorageError(f"release without retain in segment {loc.segment}")
            self._segs[loc.segment] = live - 1
            self._horizon = max(self._horizon, (loc.segment, loc.offset))

    def release_counts(self, counts: dict[int, int], newest: tuple[int, int]) -> None:
        """Many releases at once (segment -> records; ``newest`` the latest (segment, offset)
        among them): a ledger commit lets go of a whole run of a backlog in one call."""
        with self._lock:
            for seg, n in counts.items():
                if self._segs.get(seg, 0) < n:
                    raise StorageError(f"release without retain in segment {seg}")
            for seg, n in counts.items():
                self._segs[seg] -= n
            self._horizon = max(self._horizon, newest)

    def reclaim(self) -> list[int]:
        """Delete, oldest first, every segment the deletion rule allows; returns their numbers.

        While running, the files are removed by the writer thread (unlink + directory fsync
        stay off the loop thread); the segments are gone for read/retain immediately.
        """
        doomed: list[int] = []
        with self._lock:
            for seg, live in self._segs.items():
                last_seq, last_off = self._last.get(seg, (0, -1))
                if (
                    live
                    or seg >= self._seg
                    or last_seq > self._durable
                    or (seg, last_off) > self._horizon
                ):
                    break
                doomed.append(seg)
            for seg in doomed:
                del self._segs[seg]
                self._last.pop(seg, None)
                self._weight.pop(seg, None)
            if doomed and self._state == "running":
                self._doomed.extend(doomed)
                if self._writer_idle:
                    self._writer_idle = False
                    self._wake.notify()
                return doomed
        if doomed:
            self._delete(doomed)
        return doomed

    def live_counts(self) -> list[tuple[int, int]]:
        """(segment, live records) oldest first, the active segment last (compaction)."""
        with self._lock:
            return list(self._segs.items())

    def live_bytes(self) -> list[tuple[int, int, int]]:
        """(segment, live records, estimated live bytes) oldest first, the active segment
        last. The estimate is live records x (bytes appended / holds so far): exact for
        segments of like-sized records, whatever their fan-out or transactions; a segment
        this run did not write (recovered) counts as full."""
        with self._lock:
            out = []
            for seg, live in self._segs.items():
                weight = self._weight.get(seg)
                if not live:
                    est = 0
                elif weight is None or not weight[1]:
                    est = self.segment_bytes
                else:
                    est = min(self.segment_bytes, live * weight[0] // weight[1])
                out.append((seg, live, est))
            return out

    def weighed(self) -> set[int]:
        """Segments written since start-up: their ``live_bytes`` estimate is not a guess."""
        with self._lock:
            return set(self._weight)

    def live_segments(self) -> list[int]:
        """Segment numbers not yet reclaimed, oldest first (the active one included)."""
        with self._lock:
            return list(self._segs)

    def segment_count(self) -> int:
        """Segments not yet reclaimed (the active one included)."""
        return len(self._segs)

    def disk_bytes(self) -> int:
        """Bytes held by live segment files (preallocated space included; spares are
        ``pool.spare_bytes``)."""
        with self._lock:
            segments = list(self._segs)
        total = 0
        for seg in segments:
            with contextlib.suppress(FileNotFoundError):
                total += self.segment_path(seg).stat().st_size
        return total
