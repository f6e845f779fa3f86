"""A topic: fan-out of each message to a queue per subscriber (durable or not)."""

from __future__ import annotations

from sluicemq.core.routing.message import Message
from sluicemq.core.routing.queue import Queue


class Topic:
    """Subscriber queues keyed by their journal key (``d:…`` durable, ``s:…`` transient)."""

    def __init__(self, name: str, destination: str) -> None:
        self.name = name
        self.destination = destination
        self.subscribers: dict[str, Queue] = {}
        self.published = 0

    def targets(self, msg: Message) -> list[Queue]:
        """Subscriber queues whose subscription selector accepts the message."""
        return [q for q in self.subscribers.values()
                if q.selector is None or q.selector.matches(msg.headers)]

    def durable_targets(self, targets: list[Queue]) -> bool:
        return any(q.durable for q in targets)

    def __repr__(self) -> str:
        return f"<Topic {self.name} subscribers={len(self.subscribers)}>"
