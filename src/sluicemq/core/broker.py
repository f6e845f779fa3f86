"""The broker: destinations, durable subscriptions, routing, and the receipt/durability clock.

It owns no sockets and no threads: the transport calls it on the event-loop thread, time comes
from an injected clock and deferred work goes through an injected ``schedule`` (``call_soon``),
so the whole of it runs in tests without a network.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import time
from collections.abc import Callable
from typing import Any

from sluicemq.config import BrokerConfig, Policy
from sluicemq.core.consumer import Consumer
from sluicemq.core.dispatch import dispatch
from sluicemq.core.message import Message
from sluicemq.core.names import QUEUE, TOPIC, destination_of
from sluicemq.core.queue import Queue
from sluicemq.core.recovery import replay
from sluicemq.core.selectors import Selector, compile_selector
from sluicemq.core.topic import Topic
from sluicemq.errors import ProtocolError
from sluicemq.storage import records
from sluicemq.storage.store import Store, TicketLike

log = logging.getLogger("sluicemq.broker")

Waiter = Callable[[BaseException | None], None]
TX_RECORD_BYTES = 4 << 20  # a COMMIT larger than this is journaled as several parts + final


class Broker:
    """Routing and bookkeeping for every destination; sessions call in, queues call back."""

    def __init__(self, config: BrokerConfig, store: Store,
                 schedule: Callable[[Callable[[], None]], Any],
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.store = store
        self._schedule = schedule
        self._clock = clock
        self.queues: dict[str, Queue] = {}
        self.topics: dict[str, Topic] = {}
        self.durables: dict[str, tuple[records.DurableSub, Queue]] = {}
        self.client_ids: dict[str, object] = {}
        self.next_mid = 1
        self._dirty: dict[int, Queue] = {}
        self._dispatch_scheduled = False
        self._waiters: list[tuple[int, int, Waiter]] = []
        self._waiter_order = itertools.count()
        self.started = clock()
        store.on_durable = self._on_durable
        store.on_failed = self._on_failed

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    # -- destinations ------------------------------------------------------------------------
    def policy(self, kind: str, name: str) -> Policy:
        return self.config.policy_for(kind, name)

    def queue(self, name: str) -> Queue:
        q = self.queues.get(name)
        if q is None:
            q = Queue(self, f"q:{name}", destination_of(QUEUE, name), self.policy(QUEUE, name))
            self.queues[name] = q
        return q

    def topic(self, name: str) -> Topic:
        t = self.topics.get(name)
        if t is None:
            t = Topic(name, destination_of(TOPIC, name))
            self.topics[name] = t
        return t

    def allocate_mid(self) -> int:
        mid = self.next_mid
        self.next_mid += 1
        return mid

    # -- publishing --------------------------------------------------------------------------
    def publish(self, kind: str, name: str, msg: Message) -> None:
        """Route one message; a persistent one is journaled before any consumer sees it."""
        if kind == QUEUE:
            q = self.queue(name)
            if msg.persistent:
                msg.ticket = self._append_msg(q.key, msg)
                self.store.hold(msg.ticket)
            q.enqueue(msg)
            return
        topic = self.topic(name)
        topic.published += 1
        targets = topic.targets(msg)
        ticket = None
        durable = [q for q in targets if q.durable]
        if msg.persistent and durable:
            ticket = self._append_msg(f"t:{name}", msg)
            self.store.hold(ticket, len(durable))
        for q in targets:
            copy = msg.copy_for(msg.destination)
            copy.ticket = ticket if q.durable else None
            copy.persistent = msg.persistent and q.durable
            q.enqueue(copy)

    def _append_msg(self, key: str, msg: Message) -> TicketLike:
        return self.store.append_message(key, msg.mid, msg.timestamp, msg.expires,
                                         msg.priority, msg.headers, msg.body)

    # -- QueueOwner --------------------------------------------------------------------------
    def schedule_dispatch(self, queue: Queue) -> None:
        self._dirty[id(queue)] = queue
        if not self._dispatch_scheduled:
            self._dispatch_scheduled = True
            self._schedule(self.run_dispatch)

    def run_dispatch(self) -> None:
        self._dispatch_scheduled = False
        now = self.now_ms()
        while self._dirty:
            batch = list(self._dirty.values())
            self._dirty.clear()
            for q in batch:
                dispatch(q, now)

    def record_removal(self, queue: Queue, msgs: list[Message]) -> None:
        if not queue.durable:
            return
        for m in msgs:
            if m.persistent and m.ticket is not None:
                self.store.remove(queue.key, m.mid, m.ticket)

    def dead_letter(self, queue: Queue, msg: Message) -> None:
        """Move a message that exhausted its redeliveries to ``/queue/DLQ.<name>`` atomically."""
        origin = queue.destination.split("/", 2)[2]
        dlq = self.queue(f"{queue.policy.dlq_prefix}{origin}")
        moved = msg.copy_for(dlq.destination)
        moved.headers = dict(msg.headers, **{"sluice-dlq-origin": queue.destination,
                                             "sluice-dlq-deliveries": str(msg.deliveries)})
        if msg.persistent:
            ops: list[tuple[int, bytes]] = []
            if queue.durable and msg.ticket is not None:
                ops.append((records.ACK, records.encode_acks([(queue.key, msg.mid)])))
            ops.append((records.MSG, records.encode_message(
                dlq.key, moved.mid, moved.timestamp, moved.expires, moved.priority,
                moved.headers, moved.body)))
            ticket = self.store.append_tx(f"dlq:{msg.mid}", ops, final=True)
            if queue.durable and msg.ticket is not None:
                self.store.release_after(ticket.seq, [msg.ticket])
            moved.ticket = ticket
            self.store.hold(ticket)
        dlq.enqueue(moved)

    # -- subscriptions -----------------------------------------------------------------------
    def subscribe_queue(self, name: str) -> Queue:
        return self.queue(name)

    def subscribe_topic(self, name: str, key: str, selector: Selector | None) -> Queue:
        """A private, non-durable queue that receives the topic's messages from now on."""
        topic = self.topic(name)
        q = Queue(self, key, topic.destination, self.policy(TOPIC, name),
                  durable=False, selector=selector)
        topic.subscribers[key] = q
        return q

    def drop_topic_subscription(self, name: str, key: str) -> None:
        topic = self.topics.get(name)
        if topic is not None:
            topic.subscribers.pop(key, None)

    def durable_subscription(self, client_id: str, sub_name: str, topic_name: str,
                             selector_text: str | None) -> Queue:
        """Find or create (journaled) a durable subscription; a changed definition replaces it."""
        key = f"d:{client_id}:{sub_name}"
        existing = self.durables.get(key)
        if existing is not None:
            sub, q = existing
            if sub.topic == topic_name and sub.selector == selector_text:
                return q
            if q.consumers:
                raise ProtocolError(f"durable subscription {sub_name!r} is in use", fatal=False)
            self.remove_durable(key)
        sub = records.DurableSub(key, topic_name, client_id, sub_name, selector_text)
        self.store.append_sub(sub)
        return self._install_durable(sub)

    def _install_durable(self, sub: records.DurableSub) -> Queue:
        topic = self.topic(sub.topic)
        selector = compile_selector(sub.selector) if sub.selector else None
        q = Queue(self, sub.key, topic.destination, self.policy(TOPIC, sub.topic),
                  durable=True, selector=selector)
        topic.subscribers[sub.key] = q
        self.durables[sub.key] = (sub, q)
        return q

    def remove_durable(self, key: str) -> None:
        """Delete a durable subscription and everything it still held."""
        entry = self.durables.pop(key, None)
        if entry is None:
            raise ProtocolError(f"no durable subscription {key.split(':', 2)[-1]!r}", fatal=False)
        sub, q = entry
        self.drop_topic_subscription(sub.topic, key)
        held = [m for m in q.pending.clear() if m.ticket is not None]
        ticket = self.store.append_unsub(key)
        self.store.release_after(ticket.seq, [m.ticket for m in held])

    def attach(self, consumer: Consumer) -> None:
        consumer.queue.add_consumer(consumer)

    # -- transactions ------------------------------------------------------------------------
    def commit(self, txid: str, messages: list[tuple[str, str, Message]],
               acks: list[tuple[Queue, list[Message]]],
               nacks: list[tuple[Queue, list[Message]]]) -> None:
        """Apply a transaction: one TX record (or parts + final for big ones), then the effects."""
        ops: list[tuple[int, bytes]] = []
        holds: list[tuple[int, list[Any]]] = []  # index into part list, messages to hold
        parts: list[list[tuple[int, bytes]]] = []
        size = 0
        routed: list[tuple[Queue, Message]] = []
        part_msgs: list[Message] = []

        def close_part() -> None:
            nonlocal ops, size, part_msgs
            parts.append(ops)
            holds.append((len(parts) - 1, part_msgs))
            ops, size, part_msgs = [], 0, []

        for kind, name, msg in messages:
            if kind == QUEUE:
                q = self.queue(name)
                targets = [q]
                key = q.key
            else:
                topic = self.topic(name)
                topic.published += 1
                targets = topic.targets(msg)
                key = f"t:{name}"
            durable_targets = [q for q in targets if q.durable]
            for q in targets:
                copy = msg if kind == QUEUE else msg.copy_for(msg.destination)
                copy.persistent = msg.persistent and q.durable
                routed.append((q, copy))
                if copy.persistent:
                    part_msgs.append(copy)
            if msg.persistent and durable_targets:
                payload = records.encode_message(key, msg.mid, msg.timestamp, msg.expires,
                                                 msg.priority, msg.headers, msg.body)
                ops.append((records.MSG, payload))
                size += len(payload)
                if size >= TX_RECORD_BYTES:
                    close_part()
        removals: list[Any] = []
        ack_pairs: list[tuple[str, int]] = []
        for q, msgs in acks:
            for m in msgs:
                if q.durable and m.persistent and m.ticket is not None:
                    ack_pairs.append((q.key, m.mid))
                    removals.append(m.ticket)
        if ack_pairs:
            ops.append((records.ACK, records.encode_acks(ack_pairs)))
        if ops or parts:
            close_part()
        last_ticket = None
        for i, part in enumerate(parts):
            ticket = self.store.append_tx(txid, part, final=(i == len(parts) - 1))
            last_ticket = ticket
            for m in holds[i][1]:
                m.ticket = ticket
                self.store.hold(ticket)
        if last_ticket is not None and removals:
            self.store.release_after(last_ticket.seq, removals)
        for q, msgs in acks:
            q.acknowledge(msgs, record=False)
        for q, msgs in nacks:
            q.return_messages(msgs)
        for q, m in routed:
            q.enqueue(m)

    # -- durability --------------------------------------------------------------------------
    def when_durable(self, callback: Waiter) -> None:
        """Call back once everything appended so far is on disk (receipts wait on this)."""
        seq = self.store.flush()
        if seq <= self.store.durable_seq:
            callback(None)
            return
        heapq.heappush(self._waiters, (seq, next(self._waiter_order), callback))

    def _on_durable(self, seq: int) -> None:
        waiters = self._waiters
        while waiters and waiters[0][0] <= seq:
            heapq.heappop(waiters)[2](None)

    def _on_failed(self, first: int, last: int, exc: BaseException) -> None:
        """Records [first, last] never reached the disk: their receipts become ERRORs."""
        keep = []
        for entry in self._waiters:
            if first <= entry[0] <= last:
                entry[2](exc)
            else:
                keep.append(entry)
        heapq.heapify(keep)
        self._waiters = keep

    # -- recovery ----------------------------------------------------------------------------
    def recover(self) -> dict[str, int]:
        """Rebuild queues and durable subscriptions from the journal; returns counts."""
        return replay(self)
