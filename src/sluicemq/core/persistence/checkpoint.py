"""Index snapshots while the broker runs, so that a crash replays only the journal after the
newest one: restart time follows what is unconsumed, not the journal's history.

When enough records were appended since the last snapshot (``every``, or an eighth of the
messages the last snapshot held, whichever is more: a big backlog is not rewritten too often),
or when the last snapshot's anchor pin is all that keeps the oldest segment, the broker tick
captures the state on the event loop (``persistence/capture.py``: array copies, no per-message work
for paged-out messages), waits until the journal is durable up to the captured position, then
checks and writes the file on a worker thread (encoding, checksum, fsync, rename). Nothing of
it touches the send path; the capture's loop time is measured (``loop_ms``) and logged. A
snapshot that cannot be taken (a compaction in flight, a failed batch, holders that do not add
up) is retried a few ticks later; the previous snapshot stays valid meanwhile, since the
journal after it is intact.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sluicemq.core.persistence.capture import COMPACTING, Capture, capture, verify
from sluicemq.storage import snapshot
from sluicemq.storage.segment import Location

if TYPE_CHECKING:
    from sluicemq.core.persistence.parts import StatePart
    from sluicemq.core.routing.broker import Broker

log = logging.getLogger("sluicemq.checkpoint")

RETRY_TICKS = 5  # after a refused capture, wait this many ticks before trying again
BACKLOG_SHARE = 8  # at most one snapshot per (messages in the last one / 8) records


@dataclass
class CheckpointStats:
    """What the console or a benchmark may want to know; only advisory."""

    written: int = 0
    refused: int = 0
    last_bytes: int = 0
    last_messages: int = 0
    last_loop_ms: float = 0.0
    max_loop_ms: float = 0.0
    last_write_s: float = 0.0


class Checkpointer:
    """Decides when to snapshot, and writes snapshots off the event loop; one at a time.

    It pins the journal record each valid snapshot is anchored at (a retain, like any holder):
    segments go oldest first, so the anchor and the whole tail after it stay on disk until a
    newer snapshot takes over, and a crash restart can always use the newest snapshot. When
    that pin is all that keeps the oldest segment, a new snapshot is due, so the pin costs at
    most a segment's worth of disk for a moment.
    """

    def __init__(self, broker: Broker, every: int, call_soon_threadsafe: Callable[..., Any],
                 *, parts: Sequence[type[StatePart]] = (), replayed: int = 0, backlog: int = 0,
                 anchor: tuple[int, int] | None = None) -> None:
        """``replayed``: records start-up read after the snapshot it used (all of them after a
        full scan); ``backlog``: messages it restored; ``anchor``: (segment, offset) of that
        snapshot's last record, which replay left retained for us, if one was used."""
        self.broker = broker
        self.parts = parts  # state beside the queues that snapshots carry
        self.every = every  # journal records between snapshots (at least); 0: never
        self._call_soon_threadsafe = call_soon_threadsafe
        self._carried = replayed  # records after the last snapshot that this run did not append
        self._seq = 0  # this run's journal seq at the last snapshot
        self._pin: Location | None = None  # the anchor of the newest snapshot on disk
        self._pending: Location | None = None  # the anchor of the one being written
        self._busy = False
        self._closed = False
        self._wait = 0
        self._future: Future[tuple[str | None, int]] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self.stats = CheckpointStats(last_messages=backlog)
        if anchor is not None:
            self._pin = Location(anchor[0], anchor[1], 0)
            if every <= 0:  # no periodic snapshots: do not hold the journal for this one
                self._release(self._pin)
                self._pin = None

    @property
    def pins(self) -> list[Location]:
        """The journal records this holds (for the clean stop's snapshot self-check)."""
        return [loc for loc in (self._pin, self._pending) if loc is not None]

    def _retain(self, last: tuple[int, int]) -> Location | None:
        if last[1] < 0:
            return None
        loc = Location(last[0], last[1], 0)
        self.broker.store.journal.retain(loc)
        return loc

    def _release(self, loc: Location | None) -> None:
        if loc is not None:
            journal = self.broker.store.journal
            journal.release(loc)
            journal.reclaim()

    def due(self) -> bool:
        since = self._carried + self.broker.store.appended_seq - self._seq
        if since >= max(self.every, self.stats.last_messages // BACKLOG_SHARE):
            return True
        if since == 0 or self._pin is None:
            return False
        return self._pin_is_oldest()

    def _pin_is_oldest(self) -> bool:
        """Is the pin in the oldest segment? Then it keeps that segment on disk (alone, or
        beside live messages that compaction cannot move while an unknown pin is there)."""
        assert self._pin is not None
        live = self.broker.store.journal.live_counts()
        return len(live) > 1 and live[0][0] == self._pin.segment

    def after_reclaim(self) -> None:
        """Segments were deleted: if the snapshot's anchor pin is now in the oldest one, take
        the next snapshot now rather than on the next tick."""
        if self._pin is not None and not self._busy and not self._wait and self._pin_is_oldest():
            self.tick()

    def tick(self) -> None:
        """Once a second, from the broker's housekeeping."""
        if self.every <= 0 or self._busy or self._closed:
            return
        if self._wait:
            self._wait -= 1
            return
        if not self.due():
            return
        started = time.perf_counter()
        cap = capture(self.broker, self.parts, self.pins)
        loop_ms = (time.perf_counter() - started) * 1000
        if isinstance(cap, str):
            self._refused(cap)
            return
        self.stats.last_loop_ms = loop_ms
        self.stats.max_loop_ms = max(self.stats.max_loop_ms, loop_ms)
        self._busy = True
        self._pending = self._retain(cap.snap.position.last)  # the last record: still live
        self.broker.when_durable(lambda exc: self._durable(cap, exc))

    def _refused(self, why: str) -> None:
        self.stats.refused += 1
        # A compaction finishes on the next tick and may start another on the one after:
        # retry on the very next tick, or the two could keep missing each other.
        self._wait = 0 if why == COMPACTING else RETRY_TICKS
        log.info("index snapshot postponed: %s", why)

    async def finish_compaction(self) -> None:
        """Before a clean stop: let a compaction whose copies are appended finish (once they
        are durable), so that the last snapshot can be taken (a plan in flight prevents it)."""
        compactor = self.broker.compactor
        compactor.stop()
        if not compactor.busy:
            return
        done: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()

        def durable(exc: BaseException | None) -> None:
            if not done.done():
                done.set_result(exc)

        self.broker.when_durable(durable)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done, 10.0)
        compactor.finish_durable()

    def _drop_pending(self) -> None:
        self._busy = False
        pending, self._pending = self._pending, None
        self._release(pending)

    def _durable(self, cap: Capture, exc: BaseException | None) -> None:
        """Everything the capture covers is on disk (or failed: then it is dropped)."""
        if self._closed:
            return  # stopping: the clean stop writes the last snapshot itself
        if exc is not None:
            self._drop_pending()
            self._refused(f"the journal failed to store its last records ({exc})")
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="index-snapshot")
        started = time.perf_counter()
        journal = self.broker.store.journal
        future = self._executor.submit(_write, journal.directory, cap, journal.fence)
        self._future = future
        future.add_done_callback(
            lambda f: self._call_soon_threadsafe(self._written, cap, f, started))

    def _written(self, cap: Capture, future: Future[tuple[str | None, int]],
                 started: float) -> None:
        if self._closed:
            return
        try:
            why, nbytes = future.result()
        except Exception:
            log.exception("index snapshot not written")
            self._drop_pending()
            self._wait = RETRY_TICKS
            return
        if why is not None:
            self._drop_pending()
            self._refused(why)
            return
        self._busy = False
        old, self._pin, self._pending = self._pin, self._pending, None
        self._release(old)
        snap = cap.snap
        stats = self.stats
        stats.written += 1
        stats.last_bytes = nbytes
        stats.last_messages = snap.messages
        stats.last_write_s = time.perf_counter() - started
        self._seq = snap.position.seq
        self._carried = 0
        log.info("index snapshot written: %d messages, %d bytes, as of segment %d offset %d "
                 "(capture %.1f ms on the loop, written in %.3fs)", snap.messages, nbytes,
                 snap.position.last[0], snap.position.last[1], stats.last_loop_ms,
                 stats.last_write_s)

    def close(self) -> None:
        """Wait for a snapshot being written; the clean stop writes the last one after it
        (counting ``pins`` as holders: the journal still retains them)."""
        self._closed = True
        if self._future is not None:
            try:
                self._future.result()
            except Exception:
                log.exception("index snapshot not written")
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None


def _write(directory: Any, cap: Capture,
           fence: Callable[[], None] | None) -> tuple[str | None, int]:
    """On the worker thread: self-check, then write durably; (why not, bytes written)."""
    why = verify(cap)
    if why is not None:
        return why, 0
    return None, snapshot.save(directory, cap.snap, fence)
