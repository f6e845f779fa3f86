"""What the console, API and metrics share: the broker's parts plus the once-a-second samplers."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from sluicemq.admin.sampler import FsyncHistogram, RateSampler, StreamRates

if TYPE_CHECKING:
    from sluicemq.core.routing.broker import Broker
    from sluicemq.core.security.policy import Security
    from sluicemq.core.sessions.session import Session
    from sluicemq.standby import HaState
    from sluicemq.storage.store import Store


class AdminContext:
    """The broker as operators see it; ``connections`` yields transport objects with ``session``.

    A connection object may name its transport in ``transport_name`` (``"websocket"``);
    anything without one is a TCP connection.
    """

    def __init__(self, broker: Broker, store: Store | None,
                 connections: Callable[[], Iterable[Any]], security: Security) -> None:
        self.broker = broker
        self.security = security
        self.store = store
        self._connections = connections
        self.sampler = RateSampler()
        self.stream_rates = StreamRates()
        self.fsync = FsyncHistogram()
        self.ha: HaState | None = None  # master/standby role (standby.py)

    def connections(self) -> list[tuple[Session, str]]:
        """(session, transport name) for every connection that has a session."""
        out = []
        for conn in list(self._connections()):
            session = getattr(conn, "session", None)
            if session is not None:
                out.append((session, getattr(conn, "transport_name", "tcp")))
        return out

    def sessions(self) -> list[Session]:
        return [s for s, _ in self.connections()]

    def tick(self, now: float | None = None) -> None:
        """One sample of everything that is shown as a rate or folded into a histogram."""
        now = time.monotonic() if now is None else now
        broker = self.broker
        routed = (sum(q.stats.enqueued for q in broker.queues.values())
                  + sum(t.published for t in broker.topics.values()))
        self.sampler.sample(now, routed, self.sessions())
        streams = getattr(self.broker, "streams", None) or {}
        self.stream_rates.sample(now, streams.values())
        if self.store is not None:
            self.fsync.fold(self.store.journal.stats)
