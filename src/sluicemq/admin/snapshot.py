"""Read-only, JSON-ready views of broker state for the API, the pages and the CLI.

Each function walks live structures once on the event loop and returns plain dicts, so a view is
consistent (nothing changes while it is built) and costs nothing between requests.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sluicemq import __version__
from sluicemq.admin.process import broker_memory_limit, rss_bytes
from sluicemq.core.paging.flow import parse_size
from sluicemq.core.routing.names import QUEUE, TOPIC

if TYPE_CHECKING:
    from sluicemq.admin.sampler import RateSampler, StreamRates
    from sluicemq.config import Policy
    from sluicemq.core.routing.broker import Broker
    from sluicemq.core.routing.message import Message
    from sluicemq.core.routing.queue import Consumer, Queue
    from sluicemq.core.routing.topic import Topic
    from sluicemq.core.sessions.session import Session
    from sluicemq.storage.store import Store

PREVIEW_BYTES = 1024
DLQ_ORIGIN = "sluice-dlq-origin"
STREAM_ACTIVE = ("receiving", "dispatching", "resumed")


class NotFound(LookupError):
    """The named destination, message or connection does not exist (HTTP 404)."""


# -- destinations ------------------------------------------------------------------------------
def _inflight_bytes(q: Queue) -> int:
    return sum(m.size for c in q.consumers for m in c.inflight.values())


def queue_summary(name: str, q: Queue) -> dict[str, Any]:
    s = q.stats
    inflight = q.inflight_count
    return {
        "kind": QUEUE, "name": name, "destination": q.destination,
        "depth": len(q.pending) + inflight, "pending": len(q.pending), "inflight": inflight,
        "consumers": len(q.consumers), "enqueued": s.enqueued, "dequeued": s.dequeued,
        "redelivered": s.redelivered, "expired": s.expired, "dead_lettered": s.dead_lettered,
        "memory_bytes": q.pending.bytes + _inflight_bytes(q),
        "paged": q.pending.paged, "paged_bytes": q.pending.stored_bytes,
        "cursor": q.policy.cursor,
        "dlq": name.startswith(q.policy.dlq_prefix),
        "lag_bytes": q.lag() if q.consumers else None,
        "max_consumer_lag": parse_size(q.policy.max_consumer_lag),
    }


def topic_summary(name: str, t: Topic, policy: Policy) -> dict[str, Any]:
    subs = list(t.subscribers.values())
    return {
        "kind": TOPIC, "name": name, "destination": t.destination,
        "depth": sum(q.depth() for q in subs),
        "pending": sum(len(q.pending) for q in subs),
        "inflight": sum(q.inflight_count for q in subs),
        "consumers": sum(len(q.consumers) for q in subs),
        "subscriptions": len(subs), "durable_subscriptions": sum(q.durable for q in subs),
        "enqueued": t.published, "dequeued": sum(q.stats.dequeued for q in subs),
        "redelivered": sum(q.stats.redelivered for q in subs),
        "expired": sum(q.stats.expired for q in subs),
        "dead_lettered": sum(q.stats.dead_lettered for q in subs),
        "memory_bytes": sum(q.pending.bytes + _inflight_bytes(q) for q in subs),
        "paged": sum(q.pending.paged for q in subs),
        "dlq": False,
        "lag_bytes": min((q.lag() for q in subs if q.consumers), default=None),
        "max_consumer_lag": parse_size(policy.max_consumer_lag),
    }


def destinations(broker: Broker) -> list[dict[str, Any]]:
    """Every queue and topic with its counters, queues first, each kind sorted by name."""
    out = [queue_summary(n, q) for n, q in sorted(broker.queues.items())]
    out += [topic_summary(n, t, broker.policy(TOPIC, n)) for n, t in sorted(broker.topics.items())]
    return out


def find_queue(broker: Broker, name: str) -> Queue:
    q = broker.queues.get(name)
    if q is None:
        raise NotFound(f"no queue named {name!r}")
    return q


def find_topic(broker: Broker, name: str) -> Topic:
    t = broker.topics.get(name)
    if t is None:
        raise NotFound(f"no topic named {name!r}")
    return t


def consumer_view(c: Consumer) -> dict[str, Any]:
    session = c.delivery
    return {
        "subscription": c.sub_id, "destination": c.destination, "ack": c.ack_mode,
        "prefetch": c.prefetch, "inflight": len(c.inflight), "exclusive": c.exclusive,
        "selector": getattr(c.selector, "text", None) if c.selector is not None else None,
        "connection": getattr(session, "id", None), "peer": getattr(session, "peer", None),
    }


def destination_detail(broker: Broker, kind: str, name: str) -> dict[str, Any]:
    """One destination's summary, its consumers and (topics) its subscriptions."""
    if kind == QUEUE:
        q = find_queue(broker, name)
        detail = queue_summary(name, q)
        detail.update(ready_bytes=q.pending.held,
                      scheduled_bytes=broker.scheduled_bytes.get((QUEUE, name), 0),
                      store_limit=broker.flow.sizes_of(q.policy)[4])
        detail["consumers_detail"] = [consumer_view(c) for c in q.consumers]
        return detail
    if kind != TOPIC:
        raise NotFound(f"unknown destination kind {kind!r}")
    t = find_topic(broker, name)
    policy = broker.policy(TOPIC, name)
    detail = topic_summary(name, t, policy)
    # As flow control counts it: the subscriptions share records, the largest backlog holds.
    detail.update(ready_bytes=max((q.pending.held for q in t.subscribers.values()), default=0),
                  scheduled_bytes=broker.scheduled_bytes.get((TOPIC, name), 0),
                  store_limit=broker.flow.sizes_of(policy)[4])
    detail["consumers_detail"] = [consumer_view(c) for q in t.subscribers.values()
                                  for c in q.consumers]
    detail["subscriptions_detail"] = [
        {"key": key, "durable": q.durable, "depth": q.depth(), "consumers": len(q.consumers),
         "enqueued": q.stats.enqueued, "dequeued": q.stats.dequeued}
        for key, q in sorted(t.subscribers.items())]
    return detail


# -- messages ----------------------------------------------------------------------------------
def body_preview(body: bytes, limit: int = PREVIEW_BYTES) -> tuple[str, bool]:
    """(text, is_binary): UTF-8 text as is, anything else as hex so the page stays readable."""
    head = body[:limit]
    try:
        return head.decode(), False
    except UnicodeDecodeError as exc:
        if exc.end == len(head) and len(body) > limit and exc.start >= len(head) - 3:
            return head[: exc.start].decode(), False  # a character cut by the limit
        return head[:64].hex(" "), True


def message_view(msg: Message, preview: int = PREVIEW_BYTES,
                 body: bytes | None = None) -> dict[str, Any]:
    """Headers, facts and a body preview; a body kept only in the journal (large persistent
    messages) is previewed only when the caller read it back and passes it as ``body``."""
    body = msg.body if body is None else body
    if body is None:
        text, binary = f"({msg.size} bytes kept in the journal: open the message to read)", False
    else:
        text, binary = body_preview(body, preview)
    return {
        "id": msg.message_id, "mid": msg.mid, "destination": msg.destination,
        "headers": dict(msg.headers), "persistent": msg.persistent, "priority": msg.priority,
        "timestamp": msg.timestamp, "expires": msg.expires, "deliveries": msg.deliveries,
        "size": msg.size, "body_preview": text, "binary": binary,
        "in_journal": msg.body is None, "truncated": msg.size > preview,
    }


def browse(q: Queue, offset: int = 0, limit: int = 50) -> dict[str, Any]:
    """A page of waiting messages in dispatch order (in-flight ones are with consumers)."""
    offset, limit = max(0, offset), max(1, min(limit, 1000))
    page = itertools.islice(q.pending, offset, offset + limit)
    return {"destination": q.destination, "total": len(q.pending), "inflight": q.inflight_count,
            "offset": offset, "limit": limit, "messages": [message_view(m) for m in page]}


def find_message(q: Queue, mid: int) -> Message:
    for m in q.pending:
        if m.mid == mid:
            return m
    raise NotFound(f"no waiting message {mid} in {q.destination}")


# -- connections -------------------------------------------------------------------------------
def connection_view(session: Session, transport: str) -> dict[str, Any]:
    return {
        "id": session.id, "peer": session.peer, "transport": transport,
        "version": session.version, "connected": session.connected, "login": session.login,
        "client_id": session.client_id,
        "heartbeat": {"send_ms": session.heartbeat[0], "expect_ms": session.heartbeat[1]},
        "received": session.received, "delivered": session.delivered,
        "transactions": len(session.transactions),
        "output_buffered": getattr(session.out, "buffered", 0),
        "subscriptions": [consumer_view(c) for c in session.consumers.values()],
    }


# -- streams -----------------------------------------------------------------------------------
def stream_view(st: Any, rates: StreamRates | None = None) -> dict[str, Any]:
    size = st.size
    received, delivered = int(st.received_bytes or 0), int(st.delivered_bytes or 0)
    in_rate, out_rate = rates.rates(st) if rates is not None else (0.0, 0.0)
    return {
        "id": str(st.id), "name": st.name, "destination": st.destination, "size": size,
        "received_bytes": received, "delivered_bytes": delivered, "chunks": st.chunks,
        "state": st.state, "producer": st.producer, "consumer": st.consumer,
        "started": st.started, "updated": st.updated,
        "received_fraction": received / size if size else None,
        "delivered_fraction": delivered / size if size else None,
        "receive_rate": in_rate, "deliver_rate": out_rate,
    }


def streams(broker: Broker, rates: StreamRates | None = None) -> list[dict[str, Any]]:
    """Streams in progress, then recently finished ones, newest first within each."""
    live = getattr(broker, "streams", None) or {}
    done = getattr(broker, "finished_streams", None) or {}
    table = {**done, **live}
    ordered = sorted(table.values(), key=lambda st: (st.key not in live, -st.started))
    return [stream_view(st, rates) for st in ordered]


# -- overview ----------------------------------------------------------------------------------
def overview(broker: Broker, store: Store | None, sessions: Iterable[Session],
             sampler: RateSampler) -> dict[str, Any]:
    """The broker at a glance: uptime, connections, memory, journal, current rates."""
    sessions = list(sessions)
    limit, source = broker_memory_limit(broker)
    journal: dict[str, Any] = {}
    if store is not None:
        js = store.journal.stats
        lat = sorted(js.fsync_latency_s.copy())
        journal = {
            "disk_bytes": store.journal.disk_bytes(), "records": js.records,
            "spare_bytes": store.journal.pool.spare_bytes,
            "bytes": js.bytes, "fsyncs": js.fsyncs, "batches": js.batches,
            "mean_batch": js.mean_batch, "max_batch": js.max_batch, "failures": js.failures,
            "fsync_p50_ms": lat[len(lat) // 2] * 1000 if lat else None,
            "fsync_p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000 if lat else None,
            "sync": store.journal.sync,
        }
    point = sampler.latest()
    table = getattr(broker, "streams", None) or {}
    return {
        "version": __version__, "started": broker.started,
        "uptime_s": time.time() - broker.started,
        "connections": len(sessions),
        "queues": len(broker.queues), "topics": len(broker.topics),
        "durable_subscriptions": len(broker.durables),
        "depth": sum(q.depth() for q in broker.queues.values()),
        "memory": {"rss_bytes": rss_bytes(), "limit_bytes": limit, "limit_source": source},
        "journal": journal,
        "rates": {"in": point.msgs_in if point else 0.0, "out": point.msgs_out if point else 0.0,
                  "total_in": sampler.total_in, "total_out": sampler.total_out},
        "streams_in_progress": sum(1 for st in table.values() if st.state in STREAM_ACTIVE),
        "flow": flow_view(broker),
        "user_shares": user_shares_view(broker),
        "limits": {**limits_view(broker), "output_buffered": sum(
            getattr(s.out, "buffered", 0) for s in sessions)},
    }


def limits_view(broker: Broker) -> dict[str, Any]:
    """Every [limits] cap a hostile client could fill, with what is used of it now."""
    limits, admission, budget = broker.config.limits, broker.admission, broker.destinations
    return {
        "connections": {"used": admission.total, "limit": limits.max_connections},
        "connections_per_address": {"used": admission.busiest(),
                                    "limit": limits.max_connections_per_address},
        "destinations": {"used": budget.count, "limit": limits.max_destinations},
        "destinations_per_user": {"used": max(budget.per_owner.values(), default=0),
                                  "limit": limits.max_destinations_per_user},
        "connect_timeout_s": limits.connect_timeout,
        "max_frame_bytes": limits.max_frame_bytes,
        "max_header_bytes": limits.max_header_bytes,
        "turn_budget_ms": limits.turn_budget_ms,
        "output_buffer": {"limit": admission.output_bytes,
                          "per_connection": admission.output_share()},
        # connections' and destinations' own state: together at most the limit's unpaged part
        "connection_memory": {"used": broker.memory.connections,
                              "limit": broker.memory.limit - broker.memory.high_water},
        "destination_memory": {"used": broker.memory.objects,
                               "limit": broker.memory.limit - broker.memory.high_water},
        "turns_deferred": broker.turns.deferred_total,
        "max_transaction_bytes": parse_size(limits.max_transaction_bytes),
        "max_durable_subscriptions": limits.max_durable_subscriptions,
        "max_consumer_waits": limits.max_consumer_waits,
        "consumer_waits": len(broker.consumer_waits),
        "max_consumer_wait_s": limits.max_consumer_wait_seconds,
        "idle_destination_s": limits.idle_destination_seconds,
        "refused": {"connections": admission.refused_total,
                    "destinations": budget.refused_total},
        "reclaimed_destinations": budget.reclaimed_total,
        "configured": configured_limits(broker),
    }


def configured_limits(broker: Broker) -> dict[str, float]:
    """Every [limits] setting by its name, sizes in bytes; the broker-wide sizes as the
    broker resolved them (0 in the file: derived from the machine, see core/paging/flow.py)."""
    limits, rl = broker.config.limits, broker.limits
    resolved = {"memory_limit": rl.memory, "store_limit": rl.store, "temp_limit": rl.temp,
                "max_message_bytes": rl.max_message, "journal_backlog": rl.journal_backlog,
                "user_store_limit": broker.shares.limit if broker.shares is not None else 0}
    out: dict[str, float] = {}
    for f in dataclasses.fields(limits):
        value = resolved.get(f.name, getattr(limits, f.name))
        out[f.name] = parse_size(value) if isinstance(value, str) else value
    return out


def user_shares_view(broker: Broker) -> dict[str, Any]:
    """Each login's share of the store (``[limits] user_store_limit``): body bytes and count
    of its stored persistent messages, largest first; no users while no share is kept."""
    shares = broker.shares
    if shares is None:
        return {"user_store_limit": 0, "users": []}
    by_user = shares.by_user()
    users = [{"user": name, **by_user[name]}
             for name in sorted(by_user, key=lambda n: (-by_user[n]["bytes"], n))]
    return {"user_store_limit": shares.limit, "users": users}


def flow_view(broker: Broker) -> dict[str, Any]:
    """Limits against usage, and producers held by flow control now and since start."""
    flow = broker.flow
    return {"limits": flow.usage(), "producers_waiting": flow.waiting,
            "blocked_total": flow.blocked_total,
            "paced_total": flow.paced_total, "refused_total": flow.failed_total,
            "paged": sum(q.pending.paged for q in broker.queues.values())
            + sum(q.pending.paged for t in broker.topics.values()
                  for q in t.subscribers.values())}
