"""SUBSCRIBE and UNSUBSCRIBE: queue consumers, topic and wildcard subscribers, durable
subscriptions; a ``browser:true`` SUBSCRIBE is a range read and goes to ``session.ranges``.

Everything a SUBSCRIBE asks for (ack mode, prefetch, selector, priority) is checked before
anything is created for it, so a refused SUBSCRIBE leaves nothing behind.
"""

from __future__ import annotations

from sluicemq.core.routing.names import QUEUE, parse_subscription
from sluicemq.core.routing.queue import ACK_MODES, AUTO, Consumer, Queue
from sluicemq.core.routing.temporary import PREFIX as TEMP_PREFIX
from sluicemq.core.scheduling import scheduler as scheduled
from sluicemq.core.security.policy import READ
from sluicemq.core.selectors import SelectorError, compile_selector
from sluicemq.core.sessions.context import SessionContext
from sluicemq.core.streams.chunks import MAX_STREAMS
from sluicemq.errors import ProtocolError
from sluicemq.protocol.frames import Frame


def subscribe(session: SessionContext, frame: Frame) -> None:
    h = frame.headers
    broker = session.broker
    if h.get("destination", "").startswith(("/temp-", "/remote-temp-")):
        session.resolve_temporary(frame)
    destination = h.get("destination")
    kind, name, pattern = parse_subscription(destination)
    scheduled.refuse_direct(kind, name)
    if name.startswith(TEMP_PREFIX):
        broker.temps.check(kind, name, session.id, consuming=True)
    if pattern:  # read rights are checked per topic the pattern reaches, per message
        if h.get("browser") == "true":
            raise ProtocolError("a range read needs one destination, not a wildcard",
                                fatal=False)
    else:
        session.authorize(READ, kind, name)
        if h.get("browser") == "true":  # range read, head query or ledger commit
            session.ranges.subscribe(session, frame, kind, name)
            return
        session.admit_destination(kind, name)
    limits = broker.config.limits
    if len(session.consumers) >= limits.max_subscriptions:
        raise ProtocolError(f"too many subscriptions on this connection (limit "
                            f"{limits.max_subscriptions}, max_subscriptions)", fatal=False)
    sub_id = h.get("id")
    if sub_id is None:
        if session.version != "1.0":
            raise ProtocolError("SUBSCRIBE requires an 'id' header", fatal=False)
        sub_id = destination or ""
    if sub_id in session.consumers:
        raise ProtocolError(f"subscription id {sub_id!r} already in use", fatal=False)
    ack_mode = h.get("ack", AUTO)
    if ack_mode not in ACK_MODES:
        raise ProtocolError(f"invalid ack mode {ack_mode!r}; use one of {ACK_MODES}",
                            fatal=False)
    prefetch = _prefetch(h, broker.policy(kind, name).default_prefetch, limits.max_unacked)
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
    priority = consumer_priority(h)  # checked before anything is created for it
    index = next(session.indexes)
    queue: Queue
    consumer_selector = selector
    if kind == QUEUE and durable_name:  # as ActiveMQ: only topics have durable subscribers
        raise ProtocolError(f"activemq.subscriptionName {durable_name!r} on a queue: durable "
                            "subscriptions are for topics (/topic/...)", fatal=False)
    if kind == QUEUE:
        queue = broker.subscribe_queue(name)
    elif pattern:
        if durable_name:
            raise ProtocolError("durable subscriptions to a wildcard pattern are not "
                                "supported yet", fatal=False)
        queue = broker.subscribe_topic_pattern(name, f"s:{session.id}:{index}", selector,
                                               lambda topic: _may_read_topic(session, topic))
        consumer_selector = None
    elif durable_name:
        if not session.client_id:
            raise ProtocolError("a durable subscription needs a client-id on CONNECT",
                                fatal=False)
        claim_durable(session, durable_name)
        queue = broker.durable_subs.open(session.client_id, durable_name, name,
                                            selector_text)
        if queue.consumers:
            raise ProtocolError(f"durable subscription {durable_name!r} is already active",
                                fatal=False)
        consumer_selector = None
    else:
        queue = broker.subscribe_topic(name, f"s:{session.id}:{index}", selector)
        consumer_selector = None
    consumer = Consumer(session, sub_id, index, destination or "", queue, ack_mode=ack_mode,
                        prefetch=prefetch, selector=consumer_selector,
                        exclusive=h.get("activemq.exclusive") == "true",
                        max_streams=max_streams, priority=priority)
    session.consumers[sub_id] = consumer
    session.by_index[index] = consumer
    broker.attach(consumer)
    broker.advisories.consumer("added", kind, name, session.id, sub_id)
    session.receipt(frame)


def unsubscribe(session: SessionContext, frame: Frame) -> None:
    h = frame.headers
    sub_id = h.get("id") or (h.get("destination") if session.version == "1.0" else None)
    durable_name = h.get("activemq.subscriptionName") or h.get("durable-subscription-name")
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
        session.broker.durable_subs.remove(f"d:{session.client_id}:{durable_name}")
        if session.security.durables is not None:
            session.security.durables.release(f"d:{session.client_id}:{durable_name}")
    session.receipt(frame)


def claim_durable(session: SessionContext, durable_name: str) -> None:
    """A durable subscription belongs to the user who made it; refuse anyone else."""
    owners = session.security.durables
    if owners is not None and not owners.claim(f"d:{session.client_id}:{durable_name}",
                                               session.user):
        raise ProtocolError(f"durable subscription {durable_name!r} belongs to another user",
                            fatal=False)


def consumer_priority(h: dict[str, str]) -> int:
    """``activemq.priority`` of a SUBSCRIBE: 0 (the default) to 127, as ActiveMQ takes it."""
    value = h.get("activemq.priority", "0")
    if not (value.isascii() and value.isdigit()) or int(value) > 127:
        raise ProtocolError(f"invalid activemq.priority {value[:20]!r}: expected 0-127",
                            fatal=False)
    return int(value)


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
