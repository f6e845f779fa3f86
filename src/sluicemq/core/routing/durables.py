"""Durable topic subscriptions: a queue per (client id, subscription name), kept on disk.

Each is journaled as a SUB record (pinned while the subscription exists) and removed with an
UNSUB record that also lets go of every message it still held. A SUBSCRIBE with a changed
topic or selector replaces the old definition, as in ActiveMQ. The topic may be a wildcard
pattern (``prices.>``): the subscription then collects every matching topic's messages that
its owner may read, while its client is away too (``durable_reader`` says what the owner
may read, from who created it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from sluicemq.config import BrokerConfig, Limits, Policy
from sluicemq.core.routing import keys
from sluicemq.core.routing.names import TOPIC
from sluicemq.core.routing.queue import Queue, QueueOwner
from sluicemq.core.routing.subscriptions import Subscriptions
from sluicemq.core.routing.topic import Topic
from sluicemq.core.routing.wildcards import MayRead, WildcardIndex, is_pattern
from sluicemq.core.selectors import compile_selector
from sluicemq.errors import ProtocolError
from sluicemq.storage import records
from sluicemq.storage.store import Store, TicketLike


class DurableHost(QueueOwner, Protocol):
    """What durable subscriptions need of the broker: topics, policies, consumer caps."""

    config: BrokerConfig
    wildcards: WildcardIndex[Queue]
    durable_reader: Callable[[str], MayRead]  # subscription key -> what its owner may read
    subscriptions: Subscriptions  # consumer caps; a replaced definition's topic subscription

    def topic(self, name: str) -> Topic: ...

    def policy(self, kind: str, name: str) -> Policy: ...



class Durables:
    """Every durable subscription by key (``d:CLIENT:NAME``), and its SUB record's ticket."""

    def __init__(self, host: DurableHost, store: Store) -> None:
        self.host = host
        self.store = store
        self.by_key: dict[str, tuple[records.DurableSub, Queue]] = {}
        self.tickets: dict[str, TicketLike] = {}  # SUB records pin their segment

    def open(self, client_id: str, sub_name: str, topic_name: str,
             selector_text: str | None) -> Queue:
        """Find or create (journaled) a durable subscription; a changed definition replaces it."""
        key = keys.durable_key(client_id, sub_name)
        self.host.subscriptions.check_max_consumers(TOPIC, topic_name)
        existing = self.by_key.get(key)
        if existing is not None:
            sub, q = existing
            if sub.topic == topic_name and sub.selector == selector_text:
                return q
            if q.consumers:
                raise ProtocolError(f"durable subscription {sub_name!r} is in use", fatal=False)
            self.remove(key)
        else:
            check_durable_cap(self.by_key, client_id, self.host.config.limits)
        sub = records.DurableSub(key, topic_name, client_id, sub_name, selector_text)
        self.tickets[key] = self.store.keep_sub(sub)
        return self.install(sub)

    def install(self, sub: records.DurableSub) -> Queue:
        """Set up a subscription that is already journaled (new, or found at start-up)."""
        selector = compile_selector(sub.selector) if sub.selector else None
        policy = self.host.policy(TOPIC, sub.topic)
        key = keys.DestKey(sub.key)  # a d: key, as journaled
        if is_pattern(sub.topic):
            q = Queue(self.host, key, f"/topic/{sub.topic}", policy, durable=True,
                      selector=selector)
            self.host.wildcards.add(sub.topic, sub.key, q, self.host.durable_reader(sub.key))
        else:
            topic = self.host.topic(sub.topic)
            q = Queue(self.host, key, topic.destination, policy, durable=True,
                      selector=selector)
            topic.subscribers[sub.key] = q
        self.by_key[sub.key] = (sub, q)
        return q

    def remove(self, key: str) -> None:
        """Delete a durable subscription and everything it still held."""
        entry = self.by_key.pop(key, None)
        if entry is None:
            raise ProtocolError(f"no durable subscription {keys.subscription_of(key)!r}",
                                fatal=False)
        sub, q = entry
        self.host.subscriptions.drop_topic_subscription(sub.topic, key)
        stubs = q.pending.drain_stubs()
        shares = self.store.shares  # its messages leave their senders' shares (UNSUB below)
        if shares is not None:
            for m in stubs:
                shares.release(m.mid)
        self.store.shared.release_run(m.mid for m in stubs)  # and their records' holders
        held = [m.ticket for m in stubs if m.ticket is not None]
        sub_ticket = self.tickets.pop(key, None)
        if sub_ticket is not None:
            held.append(sub_ticket)
        self.store.end_sub(key, held)


def check_durable_cap(durables: Mapping[str, Any], client_id: str, limits: Limits) -> None:
    """One client id may hold ``max_durable_subscriptions`` (each is a queue of its own that
    every matching publish copies into)."""
    prefix = keys.durable_prefix(client_id)
    held = sum(1 for key in durables if key.startswith(prefix))
    limit = limits.max_durable_subscriptions
    if held >= limit:
        raise ProtocolError(f"client-id {client_id!r} has too many durable subscriptions "
                            f"(limit {limit}, max_durable_subscriptions)", fatal=False)
