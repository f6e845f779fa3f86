"""SUBSCRIBE and UNSUBSCRIBE: queue consumers, topic and wildcard subscribers, durable
subscriptions (to a topic or a topic pattern), composite and queue-wildcard subscriptions
(several consumers under one id, sessions/fanin.py); a ``browser:true`` SUBSCRIBE is a range
read and goes to ``session.ranges``.

Everything a SUBSCRIBE asks for (ack mode, prefetch, selector, priority) is checked before
anything is created for it, so a refused SUBSCRIBE leaves nothing behind.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluicemq.core.routing import keys
from sluicemq.core.routing.names import (
    QUEUE,
    destination_of,
    parse_composite_subscription,
    parse_subscription,
)
from sluicemq.core.routing.queue import ACK_MODES, AUTO, Consumer, Queue
from sluicemq.core.routing.temporary import PREFIX as TEMP_PREFIX
from sluicemq.core.scheduling import scheduler as scheduled
from sluicemq.core.security.policy import READ
from sluicemq.core.selectors import Selector, SelectorError, compile_selector
from sluicemq.core.sessions.context import SessionContext
from sluicemq.core.sessions.fanin import FanIn
from sluicemq.core.streams.chunks import MAX_STREAMS, STREAM_CREDIT
from sluicemq.errors import ProtocolError
from sluicemq.protocol.frames import Frame
from sluicemq.protocol.numbers import natural


@dataclass(frozen=True, slots=True)
class Wanted:
    """What a SUBSCRIBE asks of each consumer it makes, checked before any is made."""

    sub_id: str
    destination: str
    ack_mode: str
    prefetch: int
    selector_text: str | None
    selector: Selector | None
    durable_name: str | None
    max_streams: int
    stream_credit: int  # -1: no limit
    priority: int
    exclusive: bool


def subscribe(session: SessionContext, frame: Frame) -> None:
    h = frame.headers
    broker = session.broker
    if h.get("destination", "").startswith(("/temp-", "/remote-temp-")):
        session.resolve_temporary(frame)
    destination = h.get("destination")
    parts = (parse_composite_subscription(destination) if destination and "," in destination
             else [parse_subscription(destination)])
    for kind, name, _pattern in parts:
        scheduled.refuse_direct(kind, name)
        if name.startswith(TEMP_PREFIX):
            broker.temps.check(kind, name, session.id, consuming=True)
    fan_in = len(parts) > 1 or (parts[0][0] == QUEUE and parts[0][2])
    if h.get("browser") == "true":  # range read, head query or ledger commit
        kind, name, pattern = parts[0]
        if fan_in or pattern:
            raise ProtocolError("a range read needs one destination, not a wildcard or a "
                                "composite", fatal=False)
        session.authorize(READ, kind, name)
        session.ranges.subscribe(session, frame, kind, name)
        return
    for kind, name, pattern in parts:  # patterns: read rights per destination they reach
        if not pattern:
            session.authorize(READ, kind, name)
            session.admit_destination(kind, name)
    wanted = _wanted(session, h, destination or "", *parts[0][:2])
    if fan_in:
        if wanted.durable_name:
            raise ProtocolError("a durable subscription is to one topic (or one topic "
                                "pattern), not to a composite or a queue", fatal=False)
        fanin = FanIn(session, wanted.sub_id, lambda kind, name, pattern: _open(
            session, wanted, kind, name, pattern, destination_of(kind, name)))
        session.fanins[wanted.sub_id] = fanin
        try:
            for kind, name, pattern in parts:
                if kind == QUEUE and pattern:
                    fanin.watch(name)
                else:
                    fanin.add(kind, name, pattern)
        except ProtocolError:
            del session.fanins[wanted.sub_id]
            fanin.close()
            raise
        session.receipt(frame)
        return
    kind, name, pattern = parts[0]
    consumer = _open(session, wanted, kind, name, pattern, destination or "")
    session.consumers[wanted.sub_id] = consumer
    session.receipt(frame)


def _wanted(session: SessionContext, h: dict[str, str], destination: str, kind: str,
            name: str) -> Wanted:
    """The SUBSCRIBE's options, each checked (``kind/name``: the first destination, whose
    policy gives the default prefetch)."""
    limits = session.broker.config.limits
    if len(session.consumers) >= limits.max_subscriptions:
        raise ProtocolError(f"too many subscriptions on this connection (limit "
                            f"{limits.max_subscriptions}, max_subscriptions)", fatal=False)
    sub_id = h.get("id")
    if sub_id is None:
        if session.version != "1.0":
            raise ProtocolError("SUBSCRIBE requires an 'id' header", fatal=False)
        sub_id = destination
    if sub_id in session.consumers or sub_id in session.fanins:
        raise ProtocolError(f"subscription id {sub_id!r} already in use", fatal=False)
    ack_mode = h.get("ack", AUTO)
    if ack_mode not in ACK_MODES:
        raise ProtocolError(f"invalid ack mode {ack_mode!r}; use one of {ACK_MODES}",
                            fatal=False)
    prefetch = _prefetch(h, session.broker.policy(kind, name).default_prefetch,
                         limits.max_unacked)
    selector_text = h.get("selector") or None
    try:
        selector = compile_selector(selector_text) if selector_text else None
    except SelectorError as exc:
        raise ProtocolError(f"invalid selector: {exc}", fatal=False) from None
    durable_name = h.get("activemq.subscriptionName") or h.get("durable-subscription-name")
    try:
        max_streams = int(h.get(MAX_STREAMS, "0"))
    except ValueError:
        raise ProtocolError(f"invalid {MAX_STREAMS} {h.get(MAX_STREAMS)!r}",
                            fatal=False) from None
    return Wanted(sub_id, destination, ack_mode, prefetch, selector_text, selector,
                  durable_name, max_streams, _stream_credit(h), consumer_priority(h),
                  h.get("activemq.exclusive") == "true")


def _stream_credit(h: dict[str, str]) -> int:
    """``sluice-stream-credit``: how many streams the consumer takes in all (-1: no limit)."""
    text = h.get(STREAM_CREDIT)
    if text is None:
        return -1
    credit = natural(text, 10)
    if credit is None or not 1 <= credit <= 1 << 31:
        raise ProtocolError(f"invalid {STREAM_CREDIT} {text!r}: a number of streams, at least 1",
                            fatal=False)
    return credit


def _open(session: SessionContext, wanted: Wanted, kind: str, name: str, pattern: bool,
          destination: str) -> Consumer:
    """Make one consumer of ``/kind/name`` (a topic part may be a pattern) and attach it."""
    broker = session.broker
    index = next(session.indexes)
    queue: Queue
    consumer_selector = wanted.selector
    durable_name = wanted.durable_name
    if kind == QUEUE and durable_name:  # as ActiveMQ: only topics have durable subscribers
        raise ProtocolError(f"activemq.subscriptionName {durable_name!r} on a queue: durable "
                            "subscriptions are for topics (/topic/...)", fatal=False)
    if kind == QUEUE:
        queue = broker.subscriptions.subscribe_queue(name)
    elif durable_name:  # a topic or a topic pattern
        if not session.client_id:
            raise ProtocolError("a durable subscription needs a client-id on CONNECT",
                                fatal=False)
        claim_durable(session, durable_name)
        queue = broker.durable_subs.open(session.client_id, durable_name, name,
                                         wanted.selector_text)
        if queue.consumers:
            raise ProtocolError(f"durable subscription {durable_name!r} is already active",
                                fatal=False)
        consumer_selector = None
    elif pattern:
        queue = broker.subscriptions.subscribe_topic_pattern(
            name, keys.session_key(session.id, index), wanted.selector,
            lambda topic: _may_read_topic(session, topic))
        consumer_selector = None
    else:
        queue = broker.subscriptions.subscribe_topic(
            name, keys.session_key(session.id, index), wanted.selector)
        consumer_selector = None
    consumer = Consumer(session, wanted.sub_id, index, destination, queue,
                        ack_mode=wanted.ack_mode, prefetch=wanted.prefetch,
                        selector=consumer_selector, exclusive=wanted.exclusive,
                        max_streams=wanted.max_streams, stream_credit=wanted.stream_credit,
                        priority=wanted.priority)
    session.by_index[index] = consumer
    broker.attach(consumer)
    broker.advisories.consumer("added", kind, name, session.id, wanted.sub_id)
    return consumer


def unsubscribe(session: SessionContext, frame: Frame) -> None:
    h = frame.headers
    sub_id = h.get("id") or (h.get("destination") if session.version == "1.0" else None)
    durable_name = h.get("activemq.subscriptionName") or h.get("durable-subscription-name")
    fanin = session.fanins.pop(sub_id, None) if sub_id is not None else None
    if fanin is not None:
        fanin.close()
        session.receipt(frame)
        return
    consumer = session.consumers.pop(sub_id, None) if sub_id is not None else None
    if (consumer is None and not durable_name and sub_id is not None
            and session.ranges.unsubscribe(session, sub_id)):
        session.receipt(frame)
        return
    if consumer is None and not durable_name:
        raise ProtocolError(f"no subscription with id {sub_id!r}", fatal=False)
    if consumer is not None:
        session.by_index.pop(consumer.index, None)
        session.drop_consumer(consumer)
    if durable_name:
        if not session.client_id:
            raise ProtocolError("removing a durable subscription needs a client-id",
                                fatal=False)
        claim_durable(session, durable_name)
        key = keys.durable_key(session.client_id, durable_name)
        session.broker.durable_subs.remove(key)
        if session.security.durables is not None:
            session.security.durables.release(key)
    session.receipt(frame)


def claim_durable(session: SessionContext, durable_name: str) -> None:
    """A durable subscription belongs to the user who made it; refuse anyone else."""
    owners = session.security.durables
    if owners is not None and not owners.claim(keys.durable_key(session.client_id or "",
                                                                durable_name), session.user):
        raise ProtocolError(f"durable subscription {durable_name!r} belongs to another user",
                            fatal=False)


def consumer_priority(h: dict[str, str]) -> int:
    """``activemq.priority`` of a SUBSCRIBE: 0 (the default) to 127, as ActiveMQ takes it."""
    value = h.get("activemq.priority", "0")
    priority = natural(value, 10)
    if priority is None or priority > 127:
        raise ProtocolError(f"invalid activemq.priority {value[:20]!r}: expected 0-127",
                            fatal=False)
    return priority


def _prefetch(h: dict[str, str], default: int, max_unacked: int) -> int:
    prefetch = default
    raw_prefetch = h.get("activemq.prefetchSize")
    if raw_prefetch is not None:
        try:
            prefetch = int(raw_prefetch)
        except ValueError:
            raise ProtocolError(f"invalid activemq.prefetchSize {raw_prefetch!r}",
                                fatal=False) from None
        if prefetch < 1:
            raise ProtocolError("activemq.prefetchSize must be at least 1", fatal=False)
    return min(prefetch, max_unacked)


def _may_read_topic(session: SessionContext, name: str) -> bool:
    """A wildcard subscription reaches a topic only if this user may read it."""
    return session.security.authorize(session.user, READ, f"/topic/{name}")
