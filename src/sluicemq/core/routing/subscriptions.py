"""Who listens where: queue and non-durable topic subscriptions, consumer caps and counts.

A queue subscription is the queue itself; a topic subscription is a private queue the topic
(or, for a pattern such as ``prices.>``, the wildcard index) copies messages into from then on.
Here too: the per-destination ``max_consumers`` cap, whether a topic has anyone listening (so
advisories cost nothing when nobody reads them), virtual topic groups that exist, and a
temporary destination going with its connection. Durable subscriptions keep their own records
(``durables.py``) and ask this for the cap. Split out of ``Broker`` so that routing a message
and keeping track of who may receive it read apart; the broker is reached through
``SubscriptionHost`` only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from sluicemq.config import Policy
from sluicemq.core.routing import keys
from sluicemq.core.routing.advisories import Advisories
from sluicemq.core.routing.message import Message
from sluicemq.core.routing.names import QUEUE, TOPIC, destination_of
from sluicemq.core.routing.queue import Queue, QueueOwner
from sluicemq.core.routing.topic import Topic
from sluicemq.core.routing.virtual import VirtualTopicIndex
from sluicemq.core.routing.wildcards import MayRead, WildcardIndex
from sluicemq.core.selectors import Selector
from sluicemq.errors import ProtocolError


class SubscriptionHost(QueueOwner, Protocol):
    """What subscriptions need of the broker: its destinations, policies and indexes."""

    queues: dict[str, Queue]
    topics: dict[str, Topic]
    wildcards: WildcardIndex[Queue]
    virtual: VirtualTopicIndex
    advisories: Advisories

    def policy(self, kind: str, name: str) -> Policy: ...

    def queue(self, name: str) -> Queue: ...

    def topic(self, name: str) -> Topic: ...


class Subscriptions:
    """Subscribing to queues, topics and topic patterns, and the counts that limits read."""

    def __init__(self, host: SubscriptionHost) -> None:
        self.host = host

    def consumer_count(self, kind: str, name: str) -> int:
        """Consumers of a queue, or of every subscription of a topic."""
        if kind == QUEUE:
            q = self.host.queues.get(name)
            return len(q.consumers) if q is not None else 0
        t = self.host.topics.get(name)
        return sum(len(q.consumers) for q in t.subscribers.values()) if t is not None else 0

    def check_max_consumers(self, kind: str, name: str) -> None:
        limit = self.host.policy(kind, name).max_consumers
        if limit and self.consumer_count(kind, name) >= limit:
            raise ProtocolError(f"/{kind}/{name} already has its maximum of {limit} consumers",
                                fatal=False)

    def subscribe_queue(self, name: str) -> Queue:
        self.check_max_consumers(QUEUE, name)
        return self.host.queue(name)

    def subscribe_topic(self, name: str, key: keys.DestKey,
                        selector: Selector | None) -> Queue:
        """A private, non-durable queue that receives the topic's messages from now on."""
        host = self.host
        self.check_max_consumers(TOPIC, name)
        topic = host.topic(name)
        q = Queue(host, key, topic.destination, host.policy(TOPIC, name),
                  durable=False, selector=selector)
        topic.subscribers[key] = q
        return q

    def subscribe_topic_pattern(self, pattern: str, key: keys.DestKey,
                                selector: Selector | None, may_read: MayRead) -> Queue:
        """A private, non-durable queue that receives the messages of every topic matching
        ``pattern`` (existing or future) that ``may_read`` allows, from now on."""
        host = self.host
        q = Queue(host, key, destination_of(TOPIC, pattern), host.policy(TOPIC, pattern),
                  durable=False, selector=selector)
        host.wildcards.add(pattern, key, q, may_read)
        return q

    def drop_topic_subscription(self, name: str, key: str) -> None:
        topic = self.host.topics.get(name)
        if topic is not None:
            topic.subscribers.pop(key, None)
        self.host.wildcards.remove(key)

    def consumer_queues(self) -> Iterator[Queue]:
        """Every queue a consumer can wait on: queues, and each topic's subscribers."""
        yield from self.host.queues.values()
        for topic in self.host.topics.values():
            yield from topic.subscribers.values()

    def has_listeners(self, topic: str) -> bool:
        """Would a message published to ``topic`` reach anyone (plain or wildcard)?"""
        t = self.host.topics.get(topic)
        if t is not None and t.subscribers:
            return True
        wildcards = self.host.wildcards
        probe = Message(0, "", {}, b"", persistent=False)
        return bool(wildcards) and bool(wildcards.targets(topic, probe))

    def drop_temporary(self, kind: str, name: str) -> None:
        """Its connection ended: a temporary destination goes, with what it holds."""
        host = self.host
        if kind == QUEUE:
            q = host.queues.pop(name, None)
            if q is not None:
                q.purge()
        else:
            host.topics.pop(name, None)
        host.advisories.destination("removed", kind, name)

    def virtual_queues(self, topic: str) -> list[str]:
        """The consumer-group queues (that exist now) copying virtual topic ``topic``."""
        host = self.host
        names = host.virtual.queues(topic)
        for n in [n for n in names if n not in host.queues]:
            host.virtual.removed(n)
        return [n for n in names if n in host.queues]
