"""Many journal records let go of at once, counted per segment (a ledger commit of a run).

Why its own module: a run's removal carries no ticket per message, only the columns of its
slots; the store unpins the records per segment from these counts once the removal is
durable.
"""

from __future__ import annotations

from array import array


class SegmentRelease:
    """Many records let go of at once, as counts per segment (a ledger commit of a run)."""

    __slots__ = ("counts", "newest")

    def __init__(self, counts: dict[int, int], newest: tuple[int, int]) -> None:
        self.counts = counts
        self.newest = newest


def segment_release(segments: array, offsets: array) -> SegmentRelease:
    """Counts per segment and the newest (segment, offset) of a run, with numpy: a commit of
    a million-message backlog spent a quarter of its time on this in Python."""
    import numpy as np  # here, not at import: numpy is ~15 MiB of RSS a broker may not need

    seg = np.frombuffer(segments, dtype=np.dtype(segments.typecode))
    off = np.frombuffer(offsets, dtype=np.dtype(offsets.typecode))
    first = int(seg.min())
    per = np.bincount(seg - first)  # segment numbers of one run are few and close together
    present = np.flatnonzero(per)
    last = first + int(present[-1])
    newest = (last, int(off[seg == last].max()))
    return SegmentRelease(dict(zip((present + first).tolist(), per[present].tolist(),
                                   strict=True)), newest)
