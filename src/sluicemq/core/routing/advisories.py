"""Advisory topics (ActiveMQ): the broker tells subscribers what happens to it.

``/topic/ActiveMQ.Advisory.Connection``, ``.Consumer.Queue.<name>`` / ``.Consumer.Topic.<name>``,
``.Queue`` / ``.Topic`` / ``.TempQueue`` / ``.TempTopic`` (a destination added or removed),
``.Expired.Queue.<name>`` / ``.Expired.Topic.<name>`` and ``.MessageDLQd.Queue.<name>`` carry
one non-persistent message per event: a JSON body and the key facts as headers
(``advisory-type``, ``event``, and the destination, connection and consumer concerned). An
advisory is built only when its topic has a subscriber (plain or wildcard, e.g.
``/topic/ActiveMQ.Advisory.>``), so the hot path pays one lookup when nobody listens;
``[advisories] enabled = false`` turns them off.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from sluicemq.core.routing.message import Message
from sluicemq.core.routing.names import QUEUE
from sluicemq.core.routing.temporary import PREFIX as TEMP_PREFIX

PREFIX = "ActiveMQ.Advisory."

Listening = Callable[[str], bool]
Publish = Callable[[str, Message], None]
NextMid = Callable[[], int]


class Advisories:
    """Publishes advisory messages through the broker's own topic publication."""

    def __init__(self, enabled: bool, listening: Listening, publish: Publish,
                 next_mid: NextMid) -> None:
        self.enabled = enabled
        self._listening = listening
        self._publish = publish
        self._next_mid = next_mid
        self.published = 0

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
        now = int(time.time() * 1000)
        headers = {"advisory-type": kind, "event": event, **facts, "timestamp": str(now)}
        body = json.dumps({"type": kind, "event": event, **facts, "time": now}).encode()
        self._publish(topic, Message(self._next_mid(), f"/topic/{topic}", headers, body,
                                     persistent=False, timestamp=now))
        self.published += 1
