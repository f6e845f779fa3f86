"""An in-process broker for specs: the real core, no socket, no subprocess, no sleep.

``InProcessBroker`` builds the broker exactly as the server does (``app.build_core``: a real
journal in a temporary directory, the store, the broker with its services, recovery), but on
a hand-driven loop (``ManualLoop``) and clock (``ManualClock``): a spec runs the loop until
what it waits for has happened, and moves time forward instead of waiting for it. Each
``Connection`` is a real ``Session`` whose transport is an in-memory ``MemoryOutbound``; the
frames it writes are parsed back for the spec to read.

The one thread left is the journal's writer; waits for it block on its hand-off queue (the
way the event loop would), bounded by a timeout, never on a sleep.
"""

from __future__ import annotations

import heapq
import itertools
import queue
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from sluicemq.app import Core, Loop, build_core
from sluicemq.config import BrokerConfig, JournalSettings
from sluicemq.core.sessions.session import Session
from sluicemq.protocol.codec import FrameParser, encode_frame
from sluicemq.protocol.frames import Frame

WAIT_SECONDS = 10.0  # longest wait for the journal's writer thread (a failing spec's bound)


class ManualClock:
    """Seconds since the epoch, as ``time.time``, but moved only by the spec."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


class _Timer:
    def __init__(self, loop: ManualLoop, entry: list[Any]) -> None:
        self._loop, self._entry = loop, entry

    def cancel(self) -> None:
        self._entry[2] = None


class ManualLoop:
    """call_soon / call_later / call_soon_threadsafe, run only when the spec says so."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self._ready: deque[Callable[[], object]] = deque()
        self._timers: list[list[Any]] = []  # [due, order, callback or None when cancelled]
        self._order = itertools.count()
        self._from_threads: queue.SimpleQueue[Callable[[], object]] = queue.SimpleQueue()

    def call_soon(self, fn: Callable[[], object]) -> None:
        self._ready.append(fn)

    def call_later(self, delay: float, fn: Callable[[], None]) -> _Timer:
        entry = [self.clock.now + max(0.0, delay), next(self._order), fn]
        heapq.heappush(self._timers, entry)
        return _Timer(self, entry)

    def call_soon_threadsafe(self, fn: Callable[..., object], *args: Any) -> None:
        self._from_threads.put(lambda: fn(*args))

    def as_loop(self) -> Loop:
        return Loop(self.call_soon, self.call_later, self.call_soon_threadsafe)

    def run(self) -> None:
        """Run everything ready now (and what that makes ready), without waiting."""
        while True:
            while True:
                try:
                    self._ready.append(self._from_threads.get_nowait())
                except queue.Empty:
                    break
            if not self._ready:
                return
            while self._ready:
                self._ready.popleft()()

    def run_until(self, done: Callable[[], bool], timeout: float = WAIT_SECONDS) -> None:
        """Run the loop until ``done()``; between turns block on the writer thread's hand-off
        (a journal write finishing), for at most ``timeout`` seconds in all."""
        deadline = time.monotonic() + timeout
        self.run()
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("the in-process broker never got there")
            try:
                self._ready.append(self._from_threads.get(timeout=left))
            except queue.Empty:
                continue
            self.run()

    def advance(self, seconds: float) -> None:
        """Move the clock forward, firing every timer that falls due on the way, in order."""
        end = self.clock.now + seconds
        while self._timers and self._timers[0][0] <= end:
            due, _, fn = heapq.heappop(self._timers)
            self.clock.now = max(self.clock.now, due)
            if fn is not None:
                fn()
            self.run()
        self.clock.now = end
        self.run()


class MemoryOutbound:
    """A transport that keeps what the session writes; reading can be paused like a socket."""

    def __init__(self) -> None:
        self.writable = True
        self.closed = False
        self.paused = False
        self.data = bytearray()

    def write(self, data: bytes | memoryview) -> None:
        self.data += data

    def write_frames(self, frames: list[bytes], nbytes: int) -> None:
        self.data += b"".join(frames)

    def room(self) -> int:
        """As a socket's transport: writable or not (a spec sets ``writable``), no limit."""
        return 1 << 62 if self.writable else 0

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


class Connection:
    """One client connection: frames in through a real ``Session``, frames out parsed back."""

    def __init__(self, broker: InProcessBroker, peer: str) -> None:
        self.broker = broker
        self.out = MemoryOutbound()
        self.session = Session(broker.core.services, self.out, peer)
        self._parser = FrameParser(version="1.2")
        self._read = 0
        self.received: list[Frame] = []
        self._receipts = itertools.count(1)

    def send_frame(self, command: str, headers: dict[str, str] | None = None,
                   body: bytes = b"") -> None:
        """Feed one frame to the session and run the loop (no wait for the journal)."""
        self.session.feed(encode_frame(Frame(command, dict(headers or {}), body), "1.2"))
        self.broker.loop.run()

    def frames(self) -> list[Frame]:
        """Every frame the session wrote so far (parsed once, kept in ``received``)."""
        fresh = bytes(self.out.data[self._read:])
        self._read = len(self.out.data)
        if fresh:
            self.received += self._parser.feed(fresh)
        return self.received

    def take(self, command: str) -> list[Frame]:
        """The frames of ``command`` written so far, removed from ``received``."""
        frames = self.frames()
        taken = [f for f in frames if f.command == command]
        self.received = [f for f in frames if f.command != command]
        return taken

    def request(self, command: str, headers: dict[str, str] | None = None,
                body: bytes = b"") -> Frame:
        """Send a frame with a receipt and wait for its RECEIPT (or an ERROR naming it)."""
        receipt = f"r-{next(self._receipts)}"
        self.send_frame(command, {**(headers or {}), "receipt": receipt}, body)

        def answered() -> Frame | None:
            for f in self.frames():
                if f.command in ("RECEIPT", "ERROR") and f.headers.get("receipt-id") == receipt:
                    return f
            return None

        self.broker.loop.run_until(lambda: answered() is not None)
        answer = answered()
        assert answer is not None
        self.received.remove(answer)
        return answer

    def messages(self, count: int) -> list[Frame]:
        """Wait until ``count`` MESSAGE frames arrived; returns (and removes) them."""
        self.broker.loop.run_until(
            lambda: sum(f.command == "MESSAGE" for f in self.frames()) >= count)
        return self.take("MESSAGE")


def config_for(data_dir: Path, **changes: Any) -> BrokerConfig:
    """A broker config for in-process specs: small unsynced-preallocation journal segments."""
    base = BrokerConfig(data_dir=data_dir,
                        journal=JournalSettings(segment_bytes=4 << 20, preallocate=False))
    return replace(base, **changes)


class InProcessBroker:
    """The broker core on a manual loop and clock; ``restart`` reopens the same data dir."""

    def __init__(self, config: BrokerConfig, clock: ManualClock | None = None,
                 trim_heap: Callable[[], object] | None = None) -> None:
        self.config = config
        self.clock = clock or ManualClock()
        self.loop = ManualLoop(self.clock)
        self.core: Core = build_core(config, self.loop.as_loop(), clock=self.clock,
                                     trim_heap=trim_heap)
        self.loop.run()

    @property
    def broker(self) -> Any:
        return self.core.broker

    def connect(self, headers: dict[str, str] | None = None, peer: str = "spec:1") -> Connection:
        """A connected STOMP 1.2 client (CONNECTED checked)."""
        conn = Connection(self, peer)
        conn.send_frame("CONNECT", {"accept-version": "1.2", "host": "/", **(headers or {})})
        self.loop.run_until(lambda: any(f.command in ("CONNECTED", "ERROR")
                                        for f in conn.frames()))
        assert conn.take("CONNECTED"), conn.frames()
        return conn

    def tick(self, seconds: float = 1.0) -> None:
        """Let ``seconds`` pass and run the broker's once-a-second housekeeping."""
        self.loop.advance(seconds)
        self.broker.tick()
        self.loop.run()

    def close(self) -> None:
        """Stop as the server does: last acks journaled, files synced and closed."""
        self.loop.run()
        self.core.store.close()

    def restart(self) -> InProcessBroker:
        """Close, then build a new core on the same data directory (recovery runs)."""
        self.close()
        return InProcessBroker(self.config, self.clock)
