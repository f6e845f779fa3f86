"""Startup scan of a journal directory: yield every intact record, then repair the torn tail.

After kill -9 or power loss the log may end in a partly written batch, and anything may have
happened to bytes in between (bit rot, a stray writer). The scan keeps every record whose
checksums hold, anywhere, and reports each skipped range. Only the tail (everything after the
last intact record of the log) is destroyed: zeroed in that segment, later segment files
deleted, because new appends land there and must never be followed by stale bytes that a
future scan could mistake for newer records. The one exception is an all-zero segment right
after the active one: that is the preallocated next segment, and zero-filling it again would
cost a segment's worth of writes at every start.

With ``after`` (the last record an index snapshot accounts for) only the log after that record
is scanned and settled: segments before it are left alone, since everything up to that record
was durable before the snapshot was written, and segments are deleted oldest first, so while the
anchoring record exists every later segment does too.

A segment whose records carry REUSED was written into a reclaimed segment's file
(``recycle.py``): what follows its last intact record is that file's earlier contents. Its
earlier records never check out under the new number, and in a keyed segment (``headerkey.py``:
every segment of a journal created since session 18) neither does a record a sender laid out in
a message body, so the scan resynchronises past damage there as in a new file: one bad record
costs only itself. The trailing range after its last intact record is counted as stale bytes,
not damage, and is not zeroed; only the part that headers of this very segment cover (records
being written when the process stopped) is a torn tail, reported and zeroed as above. A segment
file holding only the stamp a spare gets as it becomes a segment (``segment.reuse_stamp``: a
header of that segment at offset 0, rtype 0) and its earlier contents is a spare made ready
before the stop: kept as the next segment like a zero-filled one. A segment's last record whose
own header was damaged cannot be told from the earlier contents and is counted as stale.

An unkeyed reused segment (a journal written before keys, which only session 17's brokers
made) is read as before: as a chain, record after record from where the scan starts, never
resynchronised past a break, since a body there could hold a record of its number and offset.
"""

from __future__ import annotations

import mmap
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sluicemq.storage.recycle import SPARE_SUFFIX, parse_spare_name
from sluicemq.storage.segment import (
    TMP_SUFFIX,
    Location,
    fsync_dir,
    last_nonzero,
    own_headers_end,
    parse_segment_name,
    reused_at,
    scan,
    segment_name,
    stamped,
)

if TYPE_CHECKING:
    from sluicemq.storage.headerkey import HeaderKey

_ZEROS = bytes(1 << 20)


@dataclass
class RecoveryReport:
    """What a recovery pass found; `dropped` holds (segment, offset, nbytes, reason)."""

    segments: int = 0
    records: int = 0
    bytes_scanned: int = 0
    stale_bytes: int = 0  # a reused file's earlier contents after its segment's last record
    dropped: list[tuple[int, int, int, str]] = field(default_factory=list)
    elapsed_s: float = 0.0


class Recovery:
    """One pass over a directory; after `records()` is exhausted, `segments`/`active`/`end`
    say which segment files remain and where appending continues.

    ``after``: (segment, offset, end) of a record known intact and durable; only what follows
    it is scanned (an index snapshot's anchor, checked by the caller). ``key``: the journal's
    (``headerkey.py``).
    """

    def __init__(self, directory: Path, key: HeaderKey,
                 after: tuple[int, int, int] | None = None) -> None:
        self.directory = directory
        self.key = key
        self.after = after
        self.report = RecoveryReport()
        self.segments: list[int] = []
        self.active = 1
        self.end = 0
        self.last = (0, -1)  # (segment, offset) of the last intact record
        self.spare: int | None = None  # a zero-filled segment after `active`, kept for reuse
        self.reused: set[int] = set()  # segments written into a reused file (REUSED)
        self.spares: list[int] = []  # spare files found (their former segment numbers)
        self._sizes: dict[int, int] = {}

    def records(self) -> Iterator[tuple[int, bytes, Location]]:
        """(rtype, payload, loc) of every intact record in log order; repairs at the end."""
        for rtype, payload, segment, offset in self.raw_records():
            yield rtype, payload, Location(segment, offset, len(payload))

    def raw_records(self) -> Iterator[tuple[int, bytes, int, int]]:
        """(rtype, payload, segment, offset): ``records`` without a Location object per record
        (start-up replay of millions of records)."""
        started = time.perf_counter()
        for leftover in self.directory.glob("*" + TMP_SUFFIX):
            leftover.unlink(missing_ok=True)
        names = [p.name for p in self.directory.iterdir()]
        numbers = sorted(n for name in names if (n := parse_segment_name(name)) is not None)
        self.spares = sorted(n for name in names if name.endswith(SPARE_SUFFIX)
                             and (n := parse_spare_name(name)) is not None)
        first_seg, first_off, last = 0, 0, None
        if self.after is not None:
            first_seg, offset, first_off = self.after
            last = (first_seg, offset, first_off)
        damage: dict[int, list[tuple[int, int, str]]] = {}
        records = 0
        for number in numbers:
            if number < first_seg:
                continue
            damage[number] = []
            start = first_off if number == first_seg else 0
            known = last[1] if last is not None and number == first_seg else -1
            tally = [known, -1, 0]  # the last record's offset and end, records yielded
            yield from self._scan_file(number, damage[number], start, tally)
            if tally[2]:
                records += tally[2]
                last = (number, tally[0], tally[1])
        self.report.records = records
        self._repair(numbers, damage, last)
        self.report.elapsed_s = time.perf_counter() - started

    def _scan_file(
        self, number: int, dropped: list[tuple[int, int, str]], start: int, tally: list[int]
    ) -> Iterator[tuple[int, bytes, int, int]]:
        """Scan one segment from ``start``; ``tally``: ``segment.scan``'s, its offset at first
        that of an intact record before ``start`` (the snapshot's anchor), or -1."""
        path = self.directory / segment_name(number)
        size = path.stat().st_size
        self._sizes[number] = size
        self.report.segments += 1
        self.report.bytes_scanned += max(0, size - start)
        if size <= start:
            return
        seeds = self.key.seeds(number)
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            known = tally[0]
            chain = not self.key.keyed(number) and (
                stamped(mm, number, seeds=seeds) or (known >= 0 and reused_at(mm, known)))
            records = scan(mm, number, dropped, start, seeds=seeds, tally=tally)
            if not chain:
                yield from records
            breaks = len(dropped)
            for found in records:  # (chain: each record looked at, the scan stopped at a break)
                if len(dropped) > breaks:  # unkeyed, past a break: earlier contents
                    pos, _nbytes, reason = dropped[-1]
                    dropped[-1] = (pos, last_nonzero(mm, pos, size) + 1 - pos, reason)
                    break
                yield found
            records.close()  # (sets the tally now, not when the generator is collected)
            self._stale_end(mm, number, dropped, tally[0])

    def _stale_end(self, mm: mmap.mmap, number: int, dropped: list[tuple[int, int, str]],
                   last: int) -> None:
        """Note a reused file and take its earlier contents out of ``dropped``: the range after
        the last intact record (``last``; -1: none, then offset 0 tells), but for what this
        segment's own headers cover."""
        seeds = self.key.seeds(number)
        if not (reused_at(mm, last) if last >= 0 else stamped(mm, number, seeds=seeds)):
            return  # written into a new file: whatever follows is damage
        self.reused.add(number)
        if not dropped or dropped[-1][0] <= last:
            return
        pos, nbytes, reason = dropped[-1]
        torn = own_headers_end(mm, number, pos, pos + nbytes, seeds=seeds) - pos
        if torn:
            dropped[-1] = (pos, torn, reason)
        else:
            dropped.pop()
        self.report.stale_bytes += nbytes - torn

    def _repair(
        self,
        numbers: list[int],
        damage: dict[int, list[tuple[int, int, str]]],
        last: tuple[int, int, int] | None,
    ) -> None:
        if last is not None:
            self.active, offset, self.end = last
            self.last = (self.active, offset)
        elif numbers:
            self.active, self.end = numbers[0], 0
        tail_stop = self.end
        for number in numbers:
            for offset, nbytes, reason in damage.get(number, ()):
                in_tail = number > self.active or (number == self.active and offset >= self.end)
                if number == self.active and in_tail:
                    tail_stop = max(tail_stop, offset + nbytes)
                label = f"torn tail ({reason})" if in_tail else reason
                self.report.dropped.append((number, offset, nbytes, label))
        spare = self.active + 1
        if spare in damage and not damage[spare] and self._sizes[spare] > 0:
            self.spare = spare  # the next segment, preallocated before the stop: keep it
        doomed = [n for n in numbers if n > self.active and n != self.spare]
        for number in doomed:
            (self.directory / segment_name(number)).unlink()
        self.segments = [n for n in numbers if n <= self.active]
        for number in self.segments:
            if number == self.active:
                self._settle(number, self.end, tail_stop)
            elif number in damage:  # scanned: it may hold records only the page cache had
                self._settle(number, 0, 0)
        if doomed:
            fsync_dir(self.directory)

    def _settle(self, number: int, zero_from: int, zero_to: int) -> None:
        """Zero [zero_from, zero_to) and fdatasync: what the scan yielded may still have been
        only in the page cache of the process that died; make it as durable as the rest."""
        fd = os.open(self.directory / segment_name(number), os.O_RDWR)
        try:
            pos = zero_from
            while pos < zero_to:
                pos += os.pwrite(fd, _ZEROS[: zero_to - pos], pos)
            os.fdatasync(fd)
        finally:
            os.close(fd)
