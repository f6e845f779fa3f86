"""The dispatch pass: hand a queue's pending messages to consumers that have room.

Rules, in the order they apply to each message (highest priority first, FIFO within):
1. an expired message is dropped (and counted), never delivered - or, with the policy's
   ``dead_letter_expired`` (ActiveMQ's processExpired), a persistent one moves to the DLQ;
2. if any consumer subscribed with ``activemq.exclusive:true``, only the first of them receives;
3. a message with ``JMSXGroupID`` goes to the consumer that owns its group (assigned on the
   group's first message, released when that consumer leaves); it waits while the owner is full;
   a stream's chunks are a group too, and a consumer subscribed with ``sluice-max-streams:N``
   is given a new stream only while it has fewer than N open (final chunk not yet acked), so
   chunks of different streams never interleave for it;
4. otherwise consumers take turns (round robin from where the last pass stopped) among those
   with room whose selector matches - the ones of the highest ``activemq.priority`` first:
   a lower-priority consumer gets a message only while every higher one is full or unwilling.
A message no consumer can take now is skipped, not lost. A pass looks at no more than
``scan_limit`` messages, so a backlog no consumer's selector wants cannot stall the loop.
"""

from __future__ import annotations

from sluicemq.core.routing.message import Message
from sluicemq.core.routing.queue import AUTO, Consumer, Queue
from sluicemq.core.streams.chunks import SEQ, is_chunk, is_final

DEFAULT_SCAN_LIMIT = 10_000


def _candidates(queue: Queue) -> list[Consumer]:
    exclusive = [c for c in queue.consumers if c.exclusive]
    return exclusive[:1] if exclusive else queue.consumers


def _levels(candidates: list[Consumer]) -> list[list[Consumer]]:
    """Candidates by consumer priority, highest first (one level in the common case)."""
    priorities = {c.priority for c in candidates}
    if len(priorities) == 1:
        return [candidates]
    return [[c for c in candidates if c.priority == p] for p in sorted(priorities, reverse=True)]


def _pick(queue: Queue, levels: list[list[Consumer]], msg: Message,
          new_stream: bool = False) -> Consumer | None:
    for candidates in levels:
        n = len(candidates)
        for i in range(n):
            c = candidates[(queue.rr + i) % n]
            if c.ready() and c.accepts(msg) and (not new_stream or c.can_open_stream()):
                queue.rr = (queue.rr + i + 1) % n
                return c
    return None


def dispatch(queue: Queue, now_ms: int, scan_limit: int = DEFAULT_SCAN_LIMIT,
             max_deliveries: int = 1 << 30) -> int:
    """Run one pass; returns how many messages were delivered (at most ``max_deliveries``)."""
    candidates = _candidates(queue)
    if not candidates or not queue.pending:
        return 0
    delivered = 0
    if len(candidates) == 1:
        only = candidates[0]
        if only.ack_mode == AUTO and only.selector is None and only.ready():
            delivered, grouped = _auto_run(queue, only, now_ms, min(scan_limit,
                                                                    max_deliveries))
            if not grouped or not only.ready():
                return delivered
            max_deliveries -= delivered
    return delivered + _each(queue, candidates, now_ms, scan_limit, max_deliveries)


def _auto_run(queue: Queue, consumer: Consumer, now_ms: int, limit: int) -> tuple[int, bool]:
    """The pass for the common queue - one consumer, acking automatically, no selector - in
    runs: messages taken off the cursor together and handed to the consumer's connection
    together (``Delivery.deliver_run``), which is how a queue at full speed is served (the
    rules above reduce to FIFO and expiry). Stops before a message of a group (a stream's
    chunks too), which ``_each`` places; returns (delivered, whether one stopped it)."""
    pending = queue.pending
    taken = pending.take(limit)
    run: list[Message] = []
    expired: list[Message] = []
    grouped = False
    for i, msg in enumerate(taken):
        if msg.group is not None:
            pending.restore(taken[i:])
            grouped = True
            break
        if msg.expires and msg.expired(now_ms):
            expired.append(msg)
        else:
            run.append(msg)
    delivered = consumer.delivery.deliver_run(consumer, run) if run else 0
    if delivered < len(run):  # the connection filled up: the rest waits, in order
        pending.restore(run[delivered:])
        del run[delivered:]
    if expired:
        _expire(queue, expired)
    if run:
        queue.stats.dequeued += delivered
        queue.owner.record_delivered(queue, consumer, run)
    return delivered, grouped


def _each(queue: Queue, candidates: list[Consumer], now_ms: int, scan_limit: int,
          max_deliveries: int) -> int:
    """The pass message by message, every rule applied to each."""
    levels = _levels(candidates)
    delivered = 0
    skipped: list[Message] = []
    expired: list[Message] = []
    auto_acked: dict[Consumer, list[Message]] = {}
    pending = queue.pending
    scanned = 0
    # Readiness only changes within a pass by our own deliveries, so count it, don't poll it.
    n_ready = sum(1 for c in candidates if c.ready())
    # One candidate (the usual queue): while n_ready it is ready, so only its selector asks
    only = candidates[0] if len(candidates) == 1 else None
    while n_ready and scanned < scan_limit and delivered < max_deliveries:
        msg = pending.pop()
        if msg is None:
            break
        scanned += 1
        if msg.expires and msg.expired(now_ms):
            expired.append(msg)
            continue
        if msg.group is not None:
            owner = queue.groups.get(msg.group)
            if owner is not None:
                consumer = owner if owner.ready() and owner in candidates else None
            else:
                chunk = is_chunk(msg)
                consumer = _pick(queue, levels, msg, chunk)
                if consumer is not None:
                    queue.groups[msg.group] = consumer
                    if chunk:
                        consumer.open_stream(msg.group)
                        if msg.headers.get(SEQ, "0") != "0":
                            consumer.resumed.add(msg.group)
                        queue.owner.stream_assigned(queue, msg.group, consumer)
        elif only is not None:
            selector = only.selector
            consumer = only if selector is None or selector.matches(msg.headers) else None
            queue.rr = 0  # as _pick leaves it with one candidate
        else:
            consumer = _pick(queue, levels, msg)
        if consumer is None:
            skipped.append(msg)
            continue
        msg.deliveries += 1
        if consumer.ack_mode == AUTO:
            taken = auto_acked.get(consumer)
            if taken is None:
                auto_acked[consumer] = [msg]
            else:
                taken.append(msg)
            if consumer.open_streams and is_final(msg):
                queue.close_stream(consumer, msg.group)
        else:
            consumer.inflight[msg.mid] = msg
        consumer.delivery.deliver(consumer, msg)
        delivered += 1
        if not consumer.ready():
            n_ready -= 1
    pending.restore(skipped)
    if expired:
        _expire(queue, expired)
    for taker, taken in auto_acked.items():
        queue.stats.dequeued += len(taken)
        queue.owner.record_delivered(queue, taker, taken)
    return delivered


def _expire(queue: Queue, expired: list[Message]) -> None:
    """Rule 1 for messages a pass found expired: counted, dropped or dead-lettered."""
    queue.stats.expired += len(expired)
    queue.owner.note_expired(queue, expired)
    dlq = queue.policy.dlq_prefix
    kept = [m for m in expired if m.persistent] if (
        queue.policy.dead_letter_expired
        and not queue.destination.startswith(f"/queue/{dlq}")) else []
    for msg in kept:
        queue.owner.dead_letter(queue, msg, "expired")
    moved = {id(m) for m in kept}
    queue.owner.record_removal(queue, [m for m in expired if id(m) not in moved])
