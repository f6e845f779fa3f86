"""Virtual topics (ActiveMQ): consumer-group queues that each get a copy of a topic.

A queue named ``<consumer_prefix><group>.<topic_prefix>X`` (``Consumer.A.VirtualTopic.Orders``)
is one consumer group's copy of the topic ``<topic_prefix>X``: a SEND to that topic also goes
to every such queue, which its group's consumers share like any queue (persistent, paged,
acknowledged). The index is kept from the queues that exist, so a group's queue receives from
the moment it is created (by its first SUBSCRIBE, as in ActiveMQ) and survives restarts like
any queue.
"""

from __future__ import annotations

from sluicemq.config import VirtualTopics


class VirtualTopicIndex:
    """Topic name -> names of the consumer-group queues that copy it."""

    def __init__(self, settings: VirtualTopics) -> None:
        self.settings = settings
        self._queues: dict[str, set[str]] = {}

    def topic_of(self, queue: str) -> str | None:
        """The virtual topic a queue name copies, or None for an ordinary queue."""
        s = self.settings
        if not s.enabled or not queue.startswith(s.consumer_prefix):
            return None
        group, sep, topic = queue[len(s.consumer_prefix):].partition(".")
        if not group or not sep or not topic.startswith(s.topic_prefix):
            return None
        return topic if len(topic) > len(s.topic_prefix) else None

    def added(self, queue: str) -> None:
        topic = self.topic_of(queue)
        if topic is not None:
            self._queues.setdefault(topic, set()).add(queue)

    def removed(self, queue: str) -> None:
        topic = self.topic_of(queue)
        if topic is not None and topic in self._queues:
            self._queues[topic].discard(queue)
            if not self._queues[topic]:
                del self._queues[topic]

    def queues(self, topic: str) -> list[str]:
        """The group queues copying ``topic``, in a stable order."""
        found = self._queues.get(topic)
        return sorted(found) if found else []
