"""Several messages stored at once: a COMMIT, and a move to the dead-letter queue.

Both hand their messages to ``Store.transaction`` (one journal transaction: all of it or none
survives a crash) and then apply the effects in memory; the broker calls in here.
"""

from __future__ import annotations

from typing import Protocol

from sluicemq.core.persistence.storelater import StoreLater
from sluicemq.core.routing import keys
from sluicemq.core.routing.advisories import Advisories
from sluicemq.core.routing.message import Message
from sluicemq.core.routing.names import QUEUE
from sluicemq.core.routing.queue import Queue
from sluicemq.core.routing.topic import Topic
from sluicemq.storage.store import NewMessage, Removed, Store


class MoveHost(Protocol):
    """What moves need of the broker: destinations, ids, bodies and the store."""

    store: Store
    later: StoreLater

    @property
    def advisories(self) -> Advisories: ...

    def queue(self, name: str) -> Queue: ...

    def topic(self, name: str) -> Topic: ...

    def topic_targets(self, topic: Topic, msg: Message) -> list[Queue]: ...

    def allocate_mid(self) -> int: ...

    def body_of(self, msg: Message) -> bytes | memoryview: ...


def commit(broker: MoveHost, txid: str, messages: list[tuple[str, str, Message]],
           acks: list[tuple[Queue, list[Message]]],
           nacks: list[tuple[Queue, list[Message]]]) -> None:
    """Apply a transaction: stored as one (``Store.transaction``), then the effects."""
    broker.later.store_all()  # acks of deferred messages: journal them first, then the acks
    routed: list[tuple[Queue, Message]] = []
    stored: list[tuple[NewMessage, list[Message]]] = []  # a record and its persistent copies
    for kind, name, msg in messages:
        if kind == QUEUE:
            q = broker.queue(name)
            targets = [q]
            key = q.key
        else:
            topic = broker.topic(name)
            topic.published += 1
            targets = broker.topic_targets(topic, msg)
            key = keys.topic_key(name)
        copies = []
        for q in targets:
            copy = msg if kind == QUEUE else msg.copy_for(msg.destination)
            copy.persistent = msg.persistent and q.durable
            routed.append((q, copy))
            if copy.persistent:
                copies.append(copy)
        if copies:
            stored.append((_record(key, msg, len(copies)), copies))
    removed = [Removed(q.key, m.mid, m.ticket) for q, msgs in acks for m in msgs
               if q.durable and m.persistent and m.ticket is not None]
    placed = broker.store.transaction(txid, [record for record, _ in stored], removed)
    for (_, copies), (ticket, inner) in zip(stored, placed, strict=True):
        for copy in copies:
            copy.ticket, copy.inner = ticket, inner
    for q, msgs in acks:
        q.acknowledge(msgs, record=False)
    for q, msgs in nacks:
        q.return_messages(msgs)
    for q, m in routed:
        q.enqueue(m)


def dead_letter(broker: MoveHost, queue: Queue, msg: Message, reason: str) -> None:
    """Move a message that exhausted its redeliveries (or, by policy, expired) to
    ``/queue/DLQ.<name>`` atomically; an expired one never expires there."""
    origin = queue.destination.split("/", 2)[2]
    dlq = broker.queue(f"{queue.policy.dlq_prefix}{origin}")
    moved = msg.moved_to(dlq.destination, broker.allocate_mid())  # a fresh seq in the DLQ
    moved.body = bytes(broker.body_of(msg))
    moved.headers.update({"sluice-dlq-origin": queue.destination,
                          "sluice-dlq-deliveries": str(msg.deliveries),
                          "sluice-dlq-reason": reason})
    if reason == "expired":
        moved.expires = 0
        moved.headers.pop("expires", None)
    broker.advisories.dead_lettered(queue.destination, dlq.destination, msg.message_id, reason)
    if msg.persistent:
        broker.later.store_all()  # a deferred one gets its record first, then its removal
        removed = ([Removed(queue.key, msg.mid, msg.ticket)]
                   if queue.durable and msg.ticket is not None else [])
        [(moved.ticket, moved.inner)] = broker.store.transaction(
            f"dlq:{msg.mid}", [_record(dlq.key, moved)], removed)
    dlq.enqueue(moved)


def _record(key: str, msg: Message, holders: int = 1) -> NewMessage:
    return NewMessage(key, msg.mid, msg.timestamp, msg.expires, msg.priority, msg.headers,
                      msg.loaded_body, holders, msg.owner)
