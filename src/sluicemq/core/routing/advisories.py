"""Advisory topics (ActiveMQ): the broker tells subscribers what happens to it.

``/topic/ActiveMQ.Advisory.Connection``, ``.Consumer.Queue.<name>`` / ``.Consumer.Topic.<name>``,
``.Queue`` / ``.Topic`` / ``.TempQueue`` / ``.TempTopic`` (a destination added or removed),
``.Expired.Queue.<name>`` / ``.Expired.Topic.<name>``, ``.MessageDLQd.Queue.<name>``,
``.Producer.Queue.<name>`` / ``.Producer.Topic.<name>`` (a connection's first SEND to a
destination, and its end) and ``.SlowConsumer.Queue.<name>`` / ``.Topic.<name>`` (a consumer
whose prefetch stayed full, or whose connection stopped reading, while messages waited for
``slow_consumer_seconds``; once per episode) carry one non-persistent message per event:
a JSON body and the key facts as headers (``advisory-type``, ``event``, and the
destination, connection and consumer concerned, as ``advisory-destination``, ``connection``,
``advisory-subscription``). An
advisory is built only when its topic has a subscriber (plain or wildcard, e.g.
``/topic/ActiveMQ.Advisory.>``), so the hot path pays one lookup when nobody listens;
``[advisories] enabled = false`` turns them off.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from sluicemq.core.routing.message import Message
from sluicemq.core.routing.names import QUEUE
from sluicemq.core.routing.temporary import PREFIX as TEMP_PREFIX

if TYPE_CHECKING:
    from sluicemq.core.routing.queue import Consumer, Queue

PREFIX = "ActiveMQ.Advisory."
MAX_PRODUCED = 1000  # destinations remembered per connection for its Producer advisories
# What the broker puts on every MESSAGE (the advisory topic, its subscription, its id): a
# fact of the same name goes in as advisory-<name> (advisory-destination: the queue advised
# about), so clients route and acknowledge advisories like any message.
MESSAGE_HEADERS = frozenset({"destination", "subscription", "message-id", "ack", "timestamp",
                             "expires", "priority", "persistent", "redelivered"})

Listening = Callable[[str], bool]
Publish = Callable[[str, Message], None]
NextMid = Callable[[], int]


class Advisories:
    """Publishes advisory messages through the broker's own topic publication."""

    def __init__(self, enabled: bool, listening: Listening, publish: Publish,
                 next_mid: NextMid, slow_seconds: float = 30.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.enabled = enabled
        self._clock = clock  # the broker's: what an advisory's timestamp and time say
        self._listening = listening
        self._publish = publish
        self._next_mid = next_mid
        self.published = 0
        self._produced: dict[str, set[tuple[str, str]]] = {}  # connection -> destinations
        self.slow_seconds = slow_seconds
        self._stalled: dict[int, float] = {}  # id(consumer) -> when it was first seen stalled
        self._advised: set[int] = set()  # consumers advised as slow in this episode

    def producer(self, conn: str, kind: str, name: str) -> None:
        """A SEND from ``conn`` to ``/kind/name``: advised the first time (STOMP has no
        producer objects: a connection is a producer of what it sends to)."""
        if not self.enabled:
            return
        seen = self._produced.setdefault(conn, set())
        if (kind, name) in seen or len(seen) >= MAX_PRODUCED:
            return
        seen.add((kind, name))
        self._producer_event("added", conn, kind, name)

    def connection_ended(self, conn: str) -> None:
        """Its producers go with it."""
        for kind, name in self._produced.pop(conn, ()):
            self._producer_event("removed", conn, kind, name)

    def _producer_event(self, event: str, conn: str, kind: str, name: str) -> None:
        what = "Queue" if kind == QUEUE else "Topic"
        self._emit(f"{PREFIX}Producer.{what}.{name}", "ProducerInfo", event,
                   {"destination": f"/{kind}/{name}", "connection": conn})

    def check_slow(self, now: float, queues: Iterable[Queue]) -> None:
        """Once a second: a consumer that could take nothing while its queue held messages
        for ``slow_seconds`` is advised once, until it takes messages again."""
        if not self.enabled or self.slow_seconds <= 0:
            return
        stalled: dict[int, float] = {}
        for q in queues:
            if not q.consumers or not q.pending:
                continue
            for c in q.consumers:
                if c.ready():
                    continue
                key = id(c)
                since = stalled[key] = self._stalled.get(key, now)
                if now - since >= self.slow_seconds and key not in self._advised:
                    self._advised.add(key)
                    self._slow(q, c, now - since)
        self._stalled = stalled
        self._advised &= stalled.keys()

    def _slow(self, queue: Queue, consumer: Consumer, seconds: float) -> None:
        kind, _, name = queue.destination[1:].partition("/")
        what = "Queue" if kind == QUEUE else "Topic"
        session = consumer.delivery
        self._emit(f"{PREFIX}SlowConsumer.{what}.{name}", "ConsumerInfo", "slow",
                   {"destination": queue.destination,
                    "connection": str(getattr(session, "id", "")),
                    "subscription": consumer.sub_id,
                    "inflight": str(len(consumer.inflight)),
                    "prefetch": str(consumer.prefetch),
                    "pending": str(len(queue.pending)),
                    "stalled-seconds": str(round(seconds, 1))})

    def connection(self, event: str, conn: str, peer: str, user: str | None) -> None:
        """``event``: "added" or "removed"."""
        self._emit(f"{PREFIX}Connection", "ConnectionInfo", event,
                   {"connection": conn, "peer": peer, "user": user or ""})

    def consumer(self, event: str, kind: str, name: str, conn: str, sub_id: str) -> None:
        if "*" in name or ">" in name:
            return  # a wildcard subscription has no single destination to advise about
        what = "Queue" if kind == QUEUE else "Topic"
        self._emit(f"{PREFIX}Consumer.{what}.{name}", "ConsumerInfo", event,
                   {"destination": f"/{kind}/{name}", "connection": conn,
                    "subscription": sub_id})

    def destination(self, event: str, kind: str, name: str) -> None:
        """A destination was created (``added``) or removed (``removed``); the advisory topics
        themselves and the broker's own ``sluice.`` queues are not advised about."""
        if name.startswith(PREFIX) or (name.startswith("sluice.")
                                       and not name.startswith(TEMP_PREFIX)):
            return
        what = ("Temp" if name.startswith(TEMP_PREFIX) else "") + (
            "Queue" if kind == QUEUE else "Topic")
        self._emit(f"{PREFIX}{what}", "DestinationInfo", event,
                   {"destination": f"/{kind}/{name}"})

    def expired(self, destination: str, message_ids: list[str]) -> None:
        """Messages of ``destination`` expired before anyone took them (one advisory each)."""
        kind, _, name = destination[1:].partition("/")
        topic = f"{PREFIX}Expired.{'Queue' if kind == QUEUE else 'Topic'}.{name}"
        for message_id in message_ids:
            self._emit(topic, "MessageExpired", "expired",
                       {"destination": destination, "message-id": message_id})

    def dead_lettered(self, origin: str, dlq: str, message_id: str, reason: str) -> None:
        kind, _, name = origin[1:].partition("/")
        what = "Queue" if kind == QUEUE else "Topic"
        self._emit(f"{PREFIX}MessageDLQd.{what}.{name}", "MessageDLQd", "dead-lettered",
                   {"destination": origin, "dlq": dlq, "message-id": message_id,
                    "reason": reason})

    def _emit(self, topic: str, kind: str, event: str, facts: dict[str, str]) -> None:
        if not self.enabled or not self._listening(topic):
            return
        now = int(self._clock() * 1000)
        headers = {"advisory-type": kind, "event": event, "timestamp": str(now)}
        for key, value in facts.items():  # a fact never stands in for the MESSAGE's own
            headers[f"advisory-{key}" if key in MESSAGE_HEADERS else key] = value
        body = json.dumps({"type": kind, "event": event, **facts, "time": now}).encode()
        self._publish(topic, Message(self._next_mid(), f"/topic/{topic}", headers, body,
                                     persistent=False, timestamp=now))
        self.published += 1
