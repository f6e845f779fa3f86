"""Administrative actions on live broker state: purge, delete, move/copy, retry, send, close.

Built only on the broker's public pieces (queues, pending lists, the store's typed appends), so
each action follows the same journaling rules as the STOMP path:

* A move between queues of persistent messages is one journal TX record per ~4 MiB of
  messages (ACK at the source + MSG at the target), like a DLQ move: after a crash each moved
  message is in exactly one of the two queues.
* A copy, or a move to a topic, publishes anew and then acknowledges the source; a crash in
  between can leave a duplicate, never a loss.

The core should eventually offer ``Broker.transfer(source, target, msgs)`` (and delete for
destinations); until then this module is the only place that composes those records by hand.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from sluicemq.admin.snapshot import DLQ_ORIGIN, NotFound, find_queue, find_topic
from sluicemq.core.routing.message import (
    ORIGINAL_ID,
    TRANSPORT_HEADERS,
    Message,
    parse_expires,
    parse_priority,
)
from sluicemq.core.routing.names import QUEUE, TOPIC, parse_destination
from sluicemq.errors import ProtocolError
from sluicemq.storage.store import TX_RECORD_BYTES, NewMessage, Removed

if TYPE_CHECKING:
    from sluicemq.core.routing.broker import Broker
    from sluicemq.core.routing.queue import Queue
    from sluicemq.core.sessions.session import Session

_txids = itertools.count(1)
_BOOT = os.urandom(3).hex()
DLQ_HEADERS = (DLQ_ORIGIN, "sluice-dlq-deliveries", "sluice-dlq-reason")  # what a retry drops


class OperationError(ValueError):
    """The request is not valid as asked (HTTP 400)."""


class Conflict(OperationError):
    """The request is valid but the destination's state forbids it now (HTTP 409)."""


def parse_target(destination: str) -> tuple[str, str]:
    """``/queue/NAME`` or ``/topic/NAME`` (a bare name means a queue), validated like SEND."""
    if destination and not destination.startswith("/"):
        destination = f"/queue/{destination}"
    try:
        return parse_destination(destination)
    except ProtocolError as exc:
        raise OperationError(str(exc)) from None


# -- purge / delete ----------------------------------------------------------------------------
def purge(broker: Broker, kind: str, name: str) -> int:
    """Drop every waiting message (in-flight ones stay with their consumers); returns count."""
    if kind == QUEUE:
        return find_queue(broker, name).purge()
    if kind == TOPIC:
        return sum(q.purge() for q in find_topic(broker, name).subscribers.values())
    raise NotFound(f"unknown destination kind {kind!r}")


def delete(broker: Broker, kind: str, name: str) -> int:
    """Remove an idle destination and what it holds (durable subscriptions included)."""
    if kind == QUEUE:
        q = find_queue(broker, name)
        if q.consumers:
            raise Conflict(f"queue {name!r} has {len(q.consumers)} consumer(s); close them first")
        dropped = q.purge()
        del broker.queues[name]
        broker.advisories.destination("removed", QUEUE, name)
        return dropped
    if kind != TOPIC:
        raise NotFound(f"unknown destination kind {kind!r}")
    t = find_topic(broker, name)
    busy = sum(len(q.consumers) for q in t.subscribers.values())
    if busy:
        raise Conflict(f"topic {name!r} has {busy} consumer(s); close them first")
    dropped = 0
    for key, q in list(t.subscribers.items()):
        dropped += len(q.pending)
        if key in broker.durables:
            broker.durable_subs.remove(key)
    del broker.topics[name]
    broker.advisories.destination("removed", TOPIC, name)
    return dropped


# -- send --------------------------------------------------------------------------------------
def send(broker: Broker, destination: str, body: bytes, headers: dict[str, str] | None = None,
         *, persistent: bool = True) -> Message:
    """Publish a message as if a producer had sent it (test messages from the console)."""
    kind, name = parse_target(destination)
    h = {k: str(v) for k, v in (headers or {}).items() if k not in TRANSPORT_HEADERS}
    if persistent:
        h["persistent"] = "true"
    else:
        h.pop("persistent", None)
    msg = Message(broker.allocate_mid(), f"/{kind}/{name}", h, body, persistent=persistent,
                  priority=parse_priority(h.get("priority")),
                  expires=parse_expires(h.get("expires")), timestamp=broker.now_ms())
    broker.publish(kind, name, msg)
    return msg


# -- move / copy / retry -----------------------------------------------------------------------
def _take(source: Queue, mids: Iterable[int] | None, *, remove: bool) -> list[Message]:
    """The chosen waiting messages in dispatch order; all of them or NotFound (nothing taken)."""
    pending = source.pending
    if mids is None:
        return pending.clear() if remove else list(pending)
    wanted = set(mids)
    chosen = [m for m in pending if m.mid in wanted]
    missing = wanted - {m.mid for m in chosen}
    if missing:
        raise NotFound(f"not waiting in {source.destination}: "
                       f"{', '.join(str(m) for m in sorted(missing)[:10])}")
    if remove:
        in_lanes = {m.mid for m in chosen if pending.take_aside(m.mid) is None}
        if in_lanes:  # (messages set aside by the scheduler stay aside)
            for m in pending.clear(aside=False):
                if m.mid not in in_lanes:
                    pending.push(m)
    return chosen


def _rebuild(broker: Broker, msg: Message, destination: str,
             rewrite: Callable[[dict[str, str]], dict[str, str]] | None) -> Message:
    """A fresh message with the same content under a fresh id (its seq in the target: it
    becomes visible there now), the id it was first sent with kept as ``sluice-original-id``.
    A body spilled to the journal is read back, since the new record that will hold it is
    not a plain message record."""
    headers = dict(msg.headers)
    if rewrite is not None:
        headers = rewrite(headers)
    headers.setdefault(ORIGINAL_ID, msg.message_id)
    mid = broker.allocate_mid()
    body = msg.body if msg.body is not None else bytes(broker.body_of(msg))
    new = Message(mid, destination, headers, body, persistent=msg.persistent,
                  priority=msg.priority, expires=msg.expires, timestamp=msg.timestamp)
    new.owner = msg.owner  # still its sender's share of the store
    return new


def transfer(broker: Broker, source: Queue, target: str, mids: Iterable[int] | None = None,
             *, copy: bool = False,
             rewrite: Callable[[dict[str, str]], dict[str, str]] | None = None) -> int:
    """Move (or copy) waiting messages of ``source`` to ``target``; returns how many."""
    kind, name = parse_target(target)
    if kind == QUEUE and broker.queues.get(name) is source:
        raise OperationError("source and target are the same queue")
    taken = _take(source, mids, remove=not copy)
    if not taken:
        return 0
    destination = f"/{kind}/{name}"
    if copy or kind == TOPIC:
        for m in taken:
            broker.publish(kind, name, _rebuild(broker, m, destination, rewrite))
        if not copy:
            source.acknowledge(taken)
        return len(taken)
    _move_atomically(broker, source, broker.queue(name), taken, rewrite)
    return len(taken)


def _loaded(body: bytes | None) -> bytes:
    """A rebuilt message's body (``_rebuild`` reads a spilled one back, so it is never None)."""
    assert body is not None
    return body


def _move_atomically(broker: Broker, source: Queue, target: Queue, msgs: list[Message],
                     rewrite: Callable[[dict[str, str]], dict[str, str]] | None) -> None:
    """Queue to queue: persistent messages move in TX records of at most ~4 MiB each."""
    store = broker.store
    broker.later.store_all()  # deferred messages (concurrent store and dispatch) get records first
    batch: list[Message] = []
    size = 0

    def flush() -> None:
        nonlocal batch, size
        moved = [_rebuild(broker, m, target.destination, rewrite) for m in batch]
        durable = [(old, new) for old, new in zip(batch, moved, strict=True) if new.persistent]
        if durable:
            placed = store.transaction(
                f"admin:{_BOOT}:{next(_txids)}",
                [NewMessage(target.key, new.mid, new.timestamp, new.expires, new.priority,
                            new.headers, _loaded(new.body), owner=new.owner)
                 for _, new in durable],
                [Removed(source.key, old.mid, old.ticket) for old, _ in durable
                 if old.ticket is not None])
            for (_, new), (ticket, inner) in zip(durable, placed, strict=True):
                new.ticket, new.inner = ticket, inner
        source.acknowledge(batch, record=False)
        for new in moved:
            target.enqueue(new)
        batch, size = [], 0

    for m in msgs:
        batch.append(m)
        size += m.size
        if size >= TX_RECORD_BYTES:
            flush()
    if batch:
        flush()


def _strip_dlq_headers(headers: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k not in DLQ_HEADERS}


def retry_dead_letters(broker: Broker, name: str,
                       mids: Iterable[int] | None = None) -> dict[str, int]:
    """Send DLQ messages back to the destination they died in; returns count per origin."""
    q = find_queue(broker, name)
    chosen = _take(q, mids, remove=False)
    by_origin: dict[str, list[int]] = {}
    for m in chosen:
        origin = m.headers.get(DLQ_ORIGIN)
        if origin is None:
            if mids is not None:
                raise OperationError(f"message {m.mid} has no {DLQ_ORIGIN} header")
            continue
        by_origin.setdefault(origin, []).append(m.mid)
    for origin, ids in by_origin.items():
        transfer(broker, q, origin, ids, rewrite=_strip_dlq_headers)
    return {origin: len(ids) for origin, ids in by_origin.items()}


# -- connections -------------------------------------------------------------------------------
def close_connection(sessions: Iterable[Session], connection_id: str) -> dict[str, Any]:
    """Tell the client why (an ERROR frame), then close; its unacked messages are redelivered."""
    for s in sessions:
        if s.id == connection_id and not s.closed:
            s.error("connection closed by an administrator", fatal=True)
            return {"id": s.id, "peer": s.peer, "closed": True}
    raise NotFound(f"no open connection {connection_id!r}")


def remove_messages(source: Queue, mids: Iterable[int]) -> int:
    """Delete chosen waiting messages (journaled like an ACK); returns how many."""
    taken = _take(source, list(mids), remove=True)
    source.acknowledge(taken)
    return len(taken)
