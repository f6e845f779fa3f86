"""One SUBSCRIBE that consumes from several destinations, as ActiveMQ allows: a composite
(``/queue/a,/queue/b,/topic/c``) or a queue wildcard (``/queue/orders.>``, ``*``).

Why one consumer per destination (a *member*): acknowledgement, prefetch, redelivery,
message groups and exclusive/priority rules are a queue's business, written once in
core/routing; a member is an ordinary consumer of one queue (or topic subscription) that
happens to share its subscription id with its siblings. Each MESSAGE names its concrete
destination and carries the SUBSCRIBE's id; an ACK finds its member by the ack id.

A wildcard reaches the queues that match it now and every one created later, each only if
the user may read it (checked per concrete queue when it is joined), never the broker's own
``sluice.`` queues (scheduler, temporary destinations).
"""

from __future__ import annotations

from collections.abc import Callable

from sluicemq.config import match_destination
from sluicemq.core.routing.names import QUEUE, destination_of
from sluicemq.core.routing.queue import Consumer
from sluicemq.core.security.policy import READ
from sluicemq.core.sessions.context import SessionContext
from sluicemq.errors import ProtocolError

OpenMember = Callable[[str, str, bool], Consumer]  # (kind, name, is pattern) -> consumer
INTERNAL = "sluice."  # the broker's own queues: never reached through a wildcard


def member_key(sub_id: str, destination: str) -> str:
    """A member's key in ``session.consumers`` (the subscription id stays on the consumer)."""
    return f"{sub_id}\x00{destination}"


class FanIn:
    """The members of one multi-destination subscription, and its queue wildcards' watch."""

    def __init__(self, session: SessionContext, sub_id: str, open_member: OpenMember) -> None:
        self.session = session
        self.sub_id = sub_id
        self._open = open_member
        self.members: dict[str, Consumer] = {}  # concrete destination -> member
        self._watches: list[str] = []

    def add(self, kind: str, name: str, pattern: bool = False) -> None:
        """Consume from ``/kind/name`` too (a topic part may itself be a pattern)."""
        destination = destination_of(kind, name)
        if destination in self.members:
            return
        limit = self.session.broker.config.limits.max_subscriptions
        if len(self.session.consumers) >= limit:
            raise ProtocolError(f"too many subscriptions on this connection (limit {limit}, "
                                f"max_subscriptions): {destination} not joined", fatal=False)
        consumer = self._open(kind, name, pattern)
        self.members[destination] = consumer
        self.session.consumers[member_key(self.sub_id, destination)] = consumer

    def watch(self, pattern: str) -> None:
        """Consume from every queue matching ``pattern``: those there now, and later ones."""
        broker = self.session.broker
        key = f"{self.session.id}\x00{self.sub_id}\x00{pattern}"
        self._watches.append(key)
        broker.queue_watch.add(key, pattern, self._created)
        for name in sorted(broker.queues):
            if match_destination(pattern, name):
                self._join(name)

    def _created(self, name: str) -> None:
        """A queue the pattern matches was created: join it, or tell the client why not."""
        try:
            self._join(name)
        except ProtocolError as exc:
            self.session.error(f"subscription {self.sub_id!r}: {exc}", fatal=False)

    def _join(self, name: str) -> None:
        if name.startswith(INTERNAL):
            return
        if not self.session.security.authorize(self.session.user, READ, f"/queue/{name}"):
            return  # a wildcard never reaches a queue its user may not read
        self.add(QUEUE, name)

    def _drop(self, destination: str) -> None:
        consumer = self.members.pop(destination)
        self.session.consumers.pop(member_key(self.sub_id, destination), None)
        self.session.by_index.pop(consumer.index, None)
        self.session.drop_consumer(consumer)

    def close(self) -> None:
        """UNSUBSCRIBE or the connection's end: every member goes, the watch too."""
        session = self.session
        for key in self._watches:
            session.broker.queue_watch.remove(key)
        self._watches.clear()
        for destination in list(self.members):
            self._drop(destination)
