"""Once-a-second samples of message rates and stream progress, kept in ring buffers.

Why sampling: the overview chart and the streams page need rates, and deriving them from
counters the broker already keeps costs nothing on the message path. Messages in are the
growth of what destinations accepted (queue ``enqueued`` plus topic ``published``), so short
producer connections count too; messages out are MESSAGE frames delivered, from the sessions'
own counters (a session's final counts are read after it closes, but a consumer connection
that opens and closes between two samples is missed).
"""

from __future__ import annotations

import bisect
from array import array
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

HISTORY_SECONDS = 600
STREAM_WINDOW = 5  # samples a stream's rate is averaged over


class Counted(Protocol):
    """What a session exposes: MESSAGE frames delivered to its peer."""

    delivered: int


@dataclass(frozen=True, slots=True)
class RatePoint:
    """Messages per second in (accepted by destinations) and out (delivered) at ``t``."""

    t: float
    msgs_in: float
    msgs_out: float


class RateSampler:
    """Turns live per-session counters into broker-wide totals and a history of rates."""

    def __init__(self, history: int = HISTORY_SECONDS) -> None:
        # (t, in, out) of the last ``history`` points in one array made here, not a RatePoint
        # per second: each would live ``history`` seconds wherever CPython put it - during a
        # burst, in an arena of message objects, which it could keep from being given back.
        # (Measured: not what keeps a burst's arenas - 3 bursts left 44.8-55.0 MiB with it,
        # 49.3-55.3 without; README Benchmarks, "Large streams (#15), 17:59-18:31".)
        self.history = history
        self._ring = array("d", bytes(8 * 3 * history))
        self._count = 0  # points recorded in all
        self.total_in = 0
        self.total_out = 0
        self._seen: dict[Counted, int] = {}
        self._routed: int | None = None
        self._last_t: float | None = None

    def sample(self, now: float, routed: int, sessions: Iterable[Counted]) -> RatePoint | None:
        """Fold counter growth since the previous call into totals and one rate point.

        ``routed`` is the destinations' accepted-message total; it can shrink when a
        destination is deleted, which counts as no growth.
        """
        d_in = max(0, routed - self._routed) if self._routed is not None else 0
        self._routed = routed
        seen: dict[Counted, int] = {}
        d_out = 0
        for s in sessions:
            seen[s] = s.delivered
        for s, before in self._seen.items():
            if s not in seen:
                d_out += s.delivered - before  # closed since: its last counts still count
        for s, delivered in seen.items():
            d_out += delivered - self._seen.get(s, 0)
        self._seen = seen
        self.total_in += d_in
        self.total_out += d_out
        last, self._last_t = self._last_t, now
        if last is None or now <= last:
            return None
        at = self._count % self.history * 3
        self._ring[at:at + 3] = array("d", (now, d_in / (now - last), d_out / (now - last)))
        self._count += 1
        return self._point(self._count - 1)

    def _point(self, n: int) -> RatePoint:
        at = n % self.history * 3
        return RatePoint(*self._ring[at:at + 3])

    @property
    def points(self) -> list[RatePoint]:
        """The points kept, oldest first."""
        return [self._point(n) for n in range(max(0, self._count - self.history), self._count)]

    def latest(self) -> RatePoint | None:
        return self._point(self._count - 1) if self._count else None

    def series(self, seconds: float) -> list[RatePoint]:
        """The points of the last ``seconds`` seconds, oldest first."""
        latest = self.latest()
        if latest is None:
            return []
        since = latest.t - seconds
        return [p for p in self.points if p.t > since]


class StreamRates:
    """Bytes per second received and delivered for each stream, over the last few samples."""

    def __init__(self, window: int = STREAM_WINDOW) -> None:
        self.window = window
        self._history: dict[Any, deque[tuple[float, int, int]]] = {}

    def sample(self, now: float, streams: Iterable[Any]) -> None:
        live: dict[Any, deque[tuple[float, int, int]]] = {}
        for st in streams:
            key = (st.destination, st.id)  # ids are unique per destination only
            hist = self._history.get(key) or deque(maxlen=self.window + 1)
            hist.append((now, int(st.received_bytes or 0), int(st.delivered_bytes or 0)))
            live[key] = hist
        self._history = live

    def rates(self, st: Any) -> tuple[float, float]:
        """(received, delivered) bytes/s of stream ``st``; zeros until two samples exist."""
        hist = self._history.get((st.destination, st.id))
        if not hist or len(hist) < 2:
            return 0.0, 0.0
        (t0, r0, d0), (t1, r1, d1) = hist[0], hist[-1]
        span = t1 - t0
        if span <= 0:
            return 0.0, 0.0
        return max(0, r1 - r0) / span, max(0, d1 - d0) / span


FSYNC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class FsyncHistogram:
    """Cumulative fsync-latency buckets built from the journal's recent-samples deque.

    The journal keeps only its last samples (one per group commit), which would make a
    non-monotonic histogram; folding the new ones every second (``batches`` tells how many are
    new) gives Prometheus the cumulative counts it expects. Batches beyond the deque's length
    within one second are counted in neither the buckets nor the sum.
    """

    def __init__(self, bounds: tuple[float, ...] = FSYNC_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last slot is +Inf only
        self.total = 0.0
        self._batches: int | None = None

    def fold(self, stats: Any) -> None:
        batches = stats.batches
        samples = stats.fsync_latency_s.copy()
        if self._batches is None:
            fresh = list(samples)
        else:
            new = max(0, batches - self._batches)
            fresh = list(samples)[-new:] if new else []
        self._batches = batches
        for s in fresh:
            self.counts[bisect.bisect_left(self.bounds, s)] += 1
            self.total += s

    def buckets(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip(self.bounds, self.counts, strict=False):
            running += count
            out.append((repr(bound), running))
        out.append(("+Inf", running + self.counts[-1]))
        return out
