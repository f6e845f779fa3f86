"""A queue: pending messages, its consumers, and what happens on ack, nack and departure.

Also the shape of every topic subscription (each subscriber gets a queue of its own), so that
acks, prefetch, redelivery and DLQ rules are written once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from sluicemq.config import Policy
from sluicemq.core.consumer import Consumer
from sluicemq.core.message import Message
from sluicemq.core.pending import PendingList

if TYPE_CHECKING:
    from sluicemq.core.selectors import Selector


class QueueOwner(Protocol):
    """The broker services a queue relies on, injected so queues stay testable alone."""

    def schedule_dispatch(self, queue: Queue) -> None: ...

    def record_removal(self, queue: Queue, msgs: Iterable[Message]) -> None: ...

    def dead_letter(self, queue: Queue, msg: Message) -> None: ...


@dataclass(slots=True)
class QueueStats:
    """Lifetime counters (since broker start)."""

    enqueued: int = 0
    dequeued: int = 0
    redelivered: int = 0
    expired: int = 0
    dead_lettered: int = 0


class Queue:
    """Pending messages plus consumers; ``durable`` queues journal the removal of persistent ones.

    ``key`` names the queue in the journal: ``q:NAME`` for queues, ``d:CLIENT:SUB`` for durable
    topic subscriptions; non-durable topic subscriptions are not journaled at all.
    """

    def __init__(
        self,
        owner: QueueOwner,
        key: str,
        destination: str,
        policy: Policy,
        *,
        durable: bool = True,
        selector: Selector | None = None,
    ) -> None:
        self.owner = owner
        self.key = key
        self.destination = destination
        self.policy = policy
        self.durable = durable
        self.selector = selector  # topic subscriptions filter at publish time
        self.pending = PendingList()
        self.consumers: list[Consumer] = []
        self.groups: dict[str, Consumer] = {}
        self.rr = 0
        self.stats = QueueStats()

    # -- producers -------------------------------------------------------------------------
    def enqueue(self, msg: Message) -> None:
        self.pending.push(msg)
        self.stats.enqueued += 1
        if self.consumers:
            self.owner.schedule_dispatch(self)

    # -- consumers -------------------------------------------------------------------------
    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)
        self.owner.schedule_dispatch(self)

    def remove_consumer(self, consumer: Consumer) -> None:
        """A consumer left: its unacked messages come back for redelivery, its groups free up."""
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        for group, owner in list(self.groups.items()):
            if owner is consumer:
                del self.groups[group]
        returned = list(consumer.inflight.values())
        consumer.inflight.clear()
        self.return_messages(returned)
        if self.consumers and self.pending:
            self.owner.schedule_dispatch(self)  # what the leaver was skipped for may go now

    @property
    def inflight_count(self) -> int:
        return sum(len(c.inflight) for c in self.consumers)

    def depth(self) -> int:
        """Messages not yet consumed: pending plus delivered-but-unacked."""
        return len(self.pending) + self.inflight_count

    # -- acknowledgement -------------------------------------------------------------------
    def acknowledge(self, msgs: Iterable[Message], *, record: bool = True) -> None:
        """Consumed for good: count it and let the journal forget it.

        ``record=False`` when the caller journals the removal itself (a transaction's COMMIT).
        """
        msgs = list(msgs)
        if not msgs:
            return
        self.stats.dequeued += len(msgs)
        if record:
            self.owner.record_removal(self, msgs)
        if self.consumers:
            self.owner.schedule_dispatch(self)

    def return_messages(self, msgs: list[Message]) -> None:
        """NACK or consumer loss: back to the front for redelivery, or to the DLQ when spent."""
        for msg in reversed(msgs):
            if msg.deliveries > self.policy.max_redeliveries:
                self.stats.dead_lettered += 1
                self.owner.dead_letter(self, msg)
            else:
                self.stats.redelivered += 1
                self.pending.push_front(msg)
        if msgs and self.consumers:
            self.owner.schedule_dispatch(self)

    def purge(self) -> int:
        removed = self.pending.clear()
        self.acknowledge(removed)
        return len(removed)

    def __repr__(self) -> str:
        return f"<Queue {self.key} pending={len(self.pending)} consumers={len(self.consumers)}>"
