"""One connection's heart-beat timer on the event loop, shared by the TCP and WebSocket transports.

The protocol decisions (when to send an EOL, when the peer counts as dead) live in the sans-IO
``HeartbeatMonitor``; this class only owns the timer and asks the connection to act. The clock
and the timer are passed in (the event loop's by default, the clock the transports stamp
``last_received``/``last_sent`` with), so specs move time instead of waiting for it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from sluicemq.protocol.heartbeat import HeartbeatMonitor

if TYPE_CHECKING:
    from sluicemq.core.sessions.session import Session

log = logging.getLogger("sluicemq.keepalive")


class Beating(Protocol):
    """What a transport connection offers to its keepalive."""

    @property
    def session(self) -> Session | None: ...

    last_received: float  # monotonic time of the last bytes read
    last_sent: float  # monotonic time of the last bytes written

    @property
    def gone(self) -> bool: ...

    @property
    def reading_paused(self) -> bool: ...

    def send_heartbeat(self) -> None: ...


class Cancellable(Protocol):
    def cancel(self) -> None: ...


Timer = Callable[[float, Callable[[], None]], Cancellable]


class Keepalive:
    """Sends EOLs when we have been quiet and closes the connection when the peer is."""

    def __init__(self, conn: Beating, send_ms: int, expect_ms: int,
                 clock: Callable[[], float] = time.monotonic,
                 call_later: Timer | None = None) -> None:
        self.conn = conn
        self._clock = clock
        self._call_later = call_later or asyncio.get_running_loop().call_later
        self.monitor = HeartbeatMonitor(send_ms, expect_ms, clock())
        self._handle: Cancellable | None = None
        self._schedule()

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _schedule(self) -> None:
        self.monitor.received(self.conn.last_received)
        self.monitor.sent(self.conn.last_sent)
        deadline = self.monitor.next_deadline()
        if deadline is not None:
            self._handle = self._call_later(max(0.01, deadline - self._clock()), self._tick)

    def _tick(self) -> None:
        conn = self.conn
        if conn.gone:
            return
        now = self._clock()
        if conn.reading_paused:
            conn.last_received = now  # flow control stopped reading it: its silence is ours
        monitor = self.monitor
        monitor.received(conn.last_received)
        monitor.sent(conn.last_sent)
        session = conn.session
        if monitor.peer_dead(now) and session is not None:
            log.info("no heart-beat from %s for %.1fs: closing", session.peer,
                     now - conn.last_received)
            session.error("heart-beat timeout: no data received", fatal=True)
            return
        if monitor.should_send(now):
            conn.send_heartbeat()
            conn.last_sent = now
        self._schedule()
