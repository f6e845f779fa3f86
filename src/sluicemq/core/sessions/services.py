"""The services every session works with, built once by the composition root (``app.py``).

Passed to each ``Session`` by its transport instead of being looked up per broker in
module-level registries, so a test builds a session from exactly the parts it names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from sluicemq.buffers import InputBuffers
    from sluicemq.core.routing.broker import Broker
    from sluicemq.core.routing.queue import Queue
    from sluicemq.core.scheduling.scheduler import Scheduler
    from sluicemq.core.security.policy import Security
    from sluicemq.core.sessions.peer import SessionPeer
    from sluicemq.protocol.frames import Frame


class RangeReads(Protocol):
    """Range reads, head queries and ledger commits (``core/replay/ranges.py``)."""

    def subscribe(self, session: SessionPeer, frame: Frame, kind: str, name: str) -> None: ...

    def unsubscribe(self, session: SessionPeer, sub_id: str) -> bool: ...

    def ignorable_ack(self, queue: Queue, mid: int) -> bool: ...


@dataclass(frozen=True, slots=True)
class Services:
    broker: Broker
    security: Security
    ranges: RangeReads
    scheduler: Scheduler
    inputs: InputBuffers  # what TCP connections read into (transport/tcp.py)
