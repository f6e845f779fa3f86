"""Replay's bookkeeping of unconsumed messages, as compact slots rather than objects.

A million unconsumed messages must not cost a Python object each at start-up, so replay keeps
each queue key's messages in parallel arrays and hands them to the queue cursors whole lanes at
a time (``PendingList.adopt_lane``). Two kinds:

* ``LiveSlots``: messages replay found in journal records, in journal (= id) order. An ACK finds
  its message by binary search on ids; the few ids that arrive out of order (DLQ moves keep
  their id, compaction rewrites old messages at the head of the log) go to a small side table.
* ``BaseLanes``: the lanes an index snapshot restored for one key, in dispatch order, plus what
  the journal tail did to them: messages removed (``gone``) and messages compaction rewrote
  elsewhere (``moved``: the newest record of an id wins). Both are applied in one pass at the
  end, so a tail that acks a few thousand messages of a million-message lane costs one pass.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from dataclasses import replace
from itertools import compress
from typing import Any

from sluicemq.storage.snapshot import COLUMNS, Lane, make_lane

Entry = tuple[int, int, int, int, int, int]  # seg, off, length, inner, size, priority
Columns = tuple[array, array, array, array, array, array]  # mid, seg, off, length, inner, size


class LiveSlots:
    """One journal key's unconsumed messages found by replay, in journal (= id) order."""

    __slots__ = ("alive", "inner", "length", "mid", "off", "prio", "seg", "side", "size")

    def __init__(self) -> None:
        self.mid = array("Q")
        self.seg = array("I")
        self.off = array("Q")
        self.length = array("I")
        self.inner = array("I")
        self.size = array("I")
        self.prio = array("B")
        self.alive = bytearray()
        self.side: dict[int, Entry] = {}

    def add(self, mid: int, entry: Entry) -> None:
        self.append(mid, *entry)

    def append(self, mid: int, seg: int, off: int, length: int, inner: int, size: int,
               prio: int) -> None:
        """``add`` with the entry's fields as arguments (replay's per-record path: no tuple)."""
        if self.mid and mid <= self.mid[-1]:
            self._kill(mid)  # an older copy (compaction rewrote it): the newer record wins
            self.side[mid] = (seg, off, length, inner, size, prio)
            return
        self.mid.append(mid)
        self.seg.append(seg)
        self.off.append(off)
        self.length.append(length)
        self.inner.append(inner)
        self.size.append(size)
        self.prio.append(prio)
        self.alive.append(1)

    def _find(self, mid: int) -> int:
        i = bisect_left(self.mid, mid)
        return i if i < len(self.mid) and self.mid[i] == mid and self.alive[i] else -1

    def _kill(self, mid: int) -> bool:
        i = self._find(mid)
        if i >= 0:
            self.alive[i] = 0
        return i >= 0

    def has(self, mid: int) -> bool:
        return mid in self.side or self._find(mid) >= 0

    def remove(self, mid: int) -> bool:
        """Forget ``mid``; False when it was not here."""
        return self.side.pop(mid, None) is not None or self._kill(mid)

    def mids(self) -> list[int]:
        return [self.mid[i] for i in range(len(self.mid)) if self.alive[i]] + list(self.side)

    def __len__(self) -> int:
        return self.alive.count(1) + len(self.side)

    def lanes(self) -> Iterator[tuple[int, Columns]]:
        """(priority, columns) of the live messages, in id order within each priority."""
        if self.side:
            yield from _split(self._merged())
            return
        cols: Columns = (self.mid, self.seg, self.off, self.length, self.inner, self.size)
        prio = self.prio
        if self.alive.count(0):
            keep = self.alive
            mid, seg, off, length, inner, size = (array(c.typecode, compress(c, keep))
                                                  for c in cols)
            cols = (mid, seg, off, length, inner, size)
            prio = array("B", compress(prio, keep))
        if not prio:
            return
        first = prio[0]
        if prio.count(first) == len(prio):
            yield first, cols
            return
        yield from _split(zip(*cols, prio, strict=True))

    def _merged(self) -> list[tuple[int, int, int, int, int, int, int]]:
        out = [(self.mid[i], self.seg[i], self.off[i], self.length[i], self.inner[i],
                self.size[i], self.prio[i]) for i in range(len(self.mid)) if self.alive[i]]
        out.extend((mid, *e[:5], e[5]) for mid, e in self.side.items())
        out.sort(key=lambda e: e[0])
        return out


def _split(rows: Iterable[tuple[int, int, int, int, int, int, int]]
           ) -> Iterator[tuple[int, Columns]]:
    """Rows of (mid, seg, off, length, inner, size, priority) into columns per priority."""
    by_prio: dict[int, Lane] = {}
    for mid, seg, off, length, inner, size, prio in rows:
        lane = by_prio.get(prio)
        if lane is None:
            lane = by_prio[prio] = make_lane("", prio)
        for col, v in zip(lane.columns(), (mid, seg, off, length, inner, size), strict=True):
            col.append(v)
    for prio in sorted(by_prio):
        yield prio, by_prio[prio].columns()


class BaseLanes:
    """One key's lanes from an index snapshot, and what the journal tail did to them."""

    __slots__ = ("gone", "held", "lanes", "moved")

    def __init__(self) -> None:
        self.lanes: list[Lane] = []
        self.held: list[dict[str, Any]] = []  # chunks held back for their stream, as captured
        self.gone: set[int] = set()
        self.moved: dict[int, Entry] = {}

    def remove(self, mid: int) -> None:
        """An ACK in the tail: gone, if the snapshot had it (checked when settling)."""
        self.moved.pop(mid, None)
        self.gone.add(mid)

    def settle(self) -> dict[int, Entry]:
        """Apply the tail to the lanes; returns the ``moved`` ids no lane had (new messages)."""
        if not (self.gone or self.moved):
            return {}
        moved = dict(self.moved)
        touched = self.gone | moved.keys()
        # Packed runs the tail touched are unpacked into the columns; the rest stay packed.
        self.lanes = [lane.unpacked(keep=lambda run: touched.isdisjoint(run.ids()))
                      for lane in self.lanes]
        for lane in self.lanes:
            drop: list[int] = []
            for i, mid in enumerate(lane.mid):
                if mid in touched:
                    entry = moved.pop(mid, None)
                    if entry is None:
                        drop.append(i)
                    else:
                        seg, off, length, inner, size, _prio = entry
                        lane.seg[i], lane.off[i], lane.length[i] = seg, off, length
                        lane.inner[i], lane.size[i] = inner, size
            if drop:
                _delete(lane, drop)
        self.lanes = [lane for lane in self.lanes if len(lane)]
        held = []
        for h in self.held:
            entry = moved.pop(h["mid"], None)
            if entry is not None:
                h = {**h, "loc": list(entry[:3]), "inner": entry[3]}
            elif h["mid"] in self.gone:
                continue
            held.append(h)
        self.held = held
        return moved

    def has(self, mid: int) -> bool:
        """Still here after the tail (a slow check, for the rare stream question)."""
        return mid not in self.gone and (
            any(mid in lane.mid or any(mid in run.ids() for run in lane.packed)
                for lane in self.lanes)
            or any(h["mid"] == mid for h in self.held))


def _delete(lane: Lane, positions: list[int]) -> None:
    """Remove the column slots at ``positions`` (ascending): runs are cut with slice deletes (a
    FIFO drain removes one run at the front); scattered removals use one compress pass.

    A packed run is placed by a column count (``PackedRun.at``), so each run moves forward by
    the removed slots before it: left as it was, a run would be dispatched after column slots
    that followed it (a queue reordered by a restart)."""
    lane.packed[:] = [replace(run, at=run.at - bisect_left(positions, run.at))
                      for run in lane.packed]
    runs: list[tuple[int, int]] = []
    for i in positions:
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    cols = lane.columns()
    if len(runs) <= 64:
        for start, stop in reversed(runs):
            for col in cols:
                del col[start:stop]
        return
    keep = bytearray(b"\x01") * len(lane.mid)
    for i in positions:
        keep[i] = 0
    for col, code in zip(cols, COLUMNS, strict=True):
        kept = array(code, compress(col, keep))
        del col[:]
        col.extend(kept)
