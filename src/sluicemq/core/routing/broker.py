"""The broker: destinations, routing, and the services every destination shares.

What it delegates, each in a module of this package: large streams (``streams.StreamTable``),
who listens where (``subscriptions.Subscriptions``), durable subscriptions
(``durables.Durables``), the receipt clock (``receipts.DurableWaits``), the dispatch pass
(``dispatchpass.DispatchPass``), who holds journal records (``holders.JournalHolders``:
compaction, start-up recounts). Several messages that change at once are stored through
``Store.transaction`` (COMMIT, dead-lettering).

It owns no sockets and no threads: the transport calls it on the event-loop thread, time comes
from an injected clock and deferred work goes through an injected ``schedule`` (``call_soon``),
so the whole of it runs in tests without a network.
"""

from __future__ import annotations

import logging
import time
from array import array
from collections.abc import Callable, Iterable
from functools import partial
from operator import attrgetter
from typing import Any

from sluicemq.config import BrokerConfig, Policy
from sluicemq.core.dedup.producers import Producers
from sluicemq.core.limits.admission import Admission
from sluicemq.core.limits.sharestate import ShareSeed
from sluicemq.core.limits.turns import Turns
from sluicemq.core.limits.usershare import UserShares, recount
from sluicemq.core.limits.waits import ConsumerWaits
from sluicemq.core.paging.cursor import PendingList
from sluicemq.core.paging.flow import (
    Credit,
    FlowControl,
    MemoryAccount,
    resolve_limits,
    user_store_limit,
)
from sluicemq.core.paging.pager import Pager
from sluicemq.core.paging.trim import HeapTrimmer
from sluicemq.core.persistence.storelater import StoreLater
from sluicemq.core.routing import holders, keys, moves
from sluicemq.core.routing.advisories import Advisories
from sluicemq.core.routing.destinations import DestinationBudget
from sluicemq.core.routing.dispatchpass import DispatchPass
from sluicemq.core.routing.durables import Durables
from sluicemq.core.routing.message import Message
from sluicemq.core.routing.names import QUEUE, TOPIC, destination_of
from sluicemq.core.routing.queue import Consumer, Queue
from sluicemq.core.routing.receipts import DurableWaits, Waiter
from sluicemq.core.routing.streams import StreamTable
from sluicemq.core.routing.subscriptions import Subscriptions
from sluicemq.core.routing.temporary import TempDestinations
from sluicemq.core.routing.topic import Topic
from sluicemq.core.routing.virtual import VirtualTopicIndex
from sluicemq.core.routing.wildcards import MayRead, QueueWatch, WildcardIndex
from sluicemq.core.staging.stager import Stager
from sluicemq.core.streams.chunks import DISCARDED
from sluicemq.storage import records
from sluicemq.storage.compaction import Compactor
from sluicemq.storage.store import Store, TicketLike
from sluicemq.storage.tempstore import TempStore

log = logging.getLogger("sluicemq.broker")

def _anything(topic: str) -> bool:
    return True


class Broker:
    """Routing and bookkeeping for every destination; sessions call in, queues call back."""

    def __init__(self, config: BrokerConfig, store: Store,
                 schedule: Callable[[Callable[[], None]], Any],
                 clock: Callable[[], float] = time.time,
                 trim_heap: Callable[[], object] | None = None,
                 free_heap: Callable[[], int] | None = None,
                 call_later: Callable[[float, Callable[[], None]], Any] | None = None) -> None:
        self.config = config
        self.store = store
        self._schedule = schedule
        self._clock = clock
        self._policies: dict[tuple[str, str], Policy] = {}
        self.queues: dict[str, Queue] = {}
        self.topics: dict[str, Topic] = {}
        self.queue_watch = QueueWatch()  # wildcard queue subscriptions (orders.>)
        self.wildcards = WildcardIndex[Queue]()  # topic subscriptions by pattern (prices.*.eu)
        self.virtual = VirtualTopicIndex(config.virtual_topics)  # Consumer.<g>.VirtualTopic.X
        self.temps = TempDestinations()  # /temp-queue/, /temp-topic/: owned by a connection
        self.subscriptions = Subscriptions(self)  # who listens where; consumer caps
        self.advisories = Advisories(config.advisories.enabled,
                                     self.subscriptions.has_listeners,
                                     lambda name, msg: self.publish(TOPIC, name, msg),
                                     self.allocate_mid,
                                     config.advisories.slow_consumer_seconds, clock)
        self.durable_subs = Durables(self, store)
        self.durables = self.durable_subs.by_key  # what snapshots and the console read
        self.sub_tickets = self.durable_subs.tickets
        self.redelivery: Callable[[Queue, list[Message]], list[Message]] | None = None
        # (kind, name) of a destination with a store_limit -> body bytes of its persistent
        # messages waiting in the scheduler's queues: kept by the scheduler, counted with its
        # ready bytes against the cap (``room_for``), so parked messages do not get past it
        self.scheduled_bytes: dict[tuple[str, str], int] = {}
        # What a durable subscription's owner may read (wired to security by app.py)
        self.durable_reader: Callable[[str], MayRead] = lambda key: _anything
        self.client_ids: dict[tuple[str | None, str], object] = {}  # (owner, id) -> session
        self.turns = Turns(time.perf_counter, schedule,  # each loop turn's input budget
                           budget=config.limits.turn_budget_ms / 1000)
        self.destinations = DestinationBudget(self)  # creation caps, idle reclaiming
        self.next_mid = 1
        self.durable_waits = DurableWaits(store)  # receipts wait here
        self.started = clock()
        self.large_streams = StreamTable(self, store, clock)
        # the table's open and recent streams, by (destination key, stream id): what recovery,
        # snapshots and range reads look at
        self.streams = self.large_streams.open
        self.finished_streams = self.large_streams.finished
        self.consumer_waits = ConsumerWaits(config.limits,
                                            self.subscriptions.consumer_count)
        # a default store limit is taken from the free disk: the journal's own files count
        # as room it has, not as room others took
        self.limits = resolve_limits(config.limits, config.data_dir,
                                     store.journal.pool.on_disk())
        # spares are journal disk too: within the store limit, and given back under pressure
        store.journal.pool.bound(self.limits.store, config.journal.recycle_min_free)
        self.memory = MemoryAccount(self.limits.memory)
        # [limits] user_store_limit: each login's share of the store (None: not kept, and no
        # per-message cost); the store keeps it once recovery counted it (``count_shares``)
        share = user_store_limit(config.limits.user_store_limit, self.limits.store)
        self.shares = UserShares(share) if share else None
        # the senders the index snapshot knew (core/limits/sharestate.py), until counted
        self.share_seed: ShareSeed | None = None
        # connections, every transport; their output is held within the memory limit
        self.admission = Admission(config.limits, self.memory.room)
        self.temp = TempStore(config.data_dir / "tmp")
        self.pager = Pager(store, self.temp, config.journal.spill_bytes)
        self.flow = FlowControl(self.limits, self.memory, store.disk_estimate,
                                lambda: self.temp.bytes_used,
                                HeapTrimmer(trim_heap, free=free_heap),
                                # asked on every persistent SEND: read in C, no lambda frame
                                partial(attrgetter("unwritten_bytes"), store.journal))
        # the dispatch pass (dispatchpass.py), its entry points bound here once: a queue asks
        # for a pass per message (QueueOwner.schedule_dispatch), a frame with a receipt may
        # settle it first, the idle sweep asks whether a queue waits for one
        passes = self.dispatch_pass = DispatchPass(schedule, self.now_ms, self.turns,
                                                   self.flow.poll)
        self.schedule_dispatch = passes.schedule
        self.settle_dispatch = passes.settle
        self.is_dirty = passes.is_dirty
        self.stager = Stager(self)  # staged publishing (docs/replay-protocol.md, section 3)
        self.producers = Producers(store, config.limits.dedup_window)  # section 4
        store.reclaim_watchers += [self.stager.anchor.move_if_oldest,
                                   self.producers.anchor.move_if_oldest]
        store.on_durable = self._on_durable
        store.on_failed = self._on_failed
        # Concurrent store and dispatch (never without a timer to write deferred messages by)
        self.later = StoreLater(store, config.journal.spill_bytes, schedule, call_later,
                                clock, delay=config.journal.store_delay_ms / 1000)
        store.pre_append = self.later.store_all
        store.deferred = self.later
        # who holds journal records (holders.py): compaction's questions, start-up recounts
        journal_holders = self.journal_holders = holders.JournalHolders(
            self.queues, self.durables, self.sub_tickets, self.large_streams,
            self.later.unwritten_of)
        self.compactor = Compactor(store, journal_holders.holders, journal_holders.relocate,
                                   self._schedule)

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on a later loop turn (paced work such as range reads and commits)."""
        self._schedule(fn)

    # -- destinations ------------------------------------------------------------------------
    def policy(self, kind: str, name: str) -> Policy:
        """The destination's policy; cached, since the config never changes while running."""
        key = (kind, name)
        policy = self._policies.get(key)
        if policy is None:
            policy = self._policies[key] = self.config.policy_for(kind, name)
        return policy

    def forget_policies(self) -> None:
        """Drop cached policies (destinations were reclaimed; their names need none)."""
        self._policies.clear()

    def make_pending(self, destination: str, policy: Policy) -> PendingList:
        """A destination's cursor: paging (``store``) unless its policy says ``vm``."""
        pager = self.pager if policy.cursor == "store" else None
        return PendingList(pager, destination=destination, window=policy.cursor_window,
                           account=self.memory)

    def room_for(self, kind: str, name: str, persistent: bool,
                 policy: Policy | None = None, size: int = 0,
                 owner: bytes | None = None, stored: int = -1,
                 credit: Credit | None = None, several: bool = False) -> str | None:
        """Why ``kind/name`` cannot take a message of ``size`` body bytes now (producer flow
        control; ``FlowControl.refusal``), or None. ``owner``: the sender
        (``records.encode_owner``), whose share of the store a persistent message meets;
        ``stored``: the bytes it would store, when not ``size`` (a COMMIT's spool).
        ``credit``: a COMMIT's own ACKs (those of the sender's own messages free her share).
        ``several``: ``stored`` is more than one message (no pass past an empty share)."""
        shares = self.shares
        if shares is not None and persistent and owner is not None:
            why = (shares.refusal(owner, size if stored < 0 else stored, 0, not several)
                   if credit is None
                   else shares.refusal(owner, credit.added_store,
                                       credit.freed_by.get(owner, 0), credit.sends <= 1))
            if why is not None:
                return why
        policy = policy or self.policy(kind, name)
        flow = self.flow
        # A capped destination's ready bytes count what the scheduler holds for it too.
        if kind == QUEUE:  # consumer_lag, inlined: once per SEND
            q = self.queues.get(name)
            if q is None:
                return flow.refusal(policy, size, persistent, 0, None,
                                    self.scheduled_bytes.get((kind, name), 0), credit)
            pending = q.pending  # and ``Queue.lag``
            held = (pending.held + self.scheduled_bytes.get((kind, name), 0)
                    if policy.store_limit else 0)
            if credit is not None and held:
                held = credit.held(kind, name, q, held)
            return flow.refusal(policy, size, persistent, pending.memory,
                                pending.memory + pending.stored_bytes if q.consumers else None,
                                held, credit)
        t = self.topics.get(name)
        used = sum(q.pending.memory for q in t.subscribers.values()) if t else 0
        # A topic's record is shared by its subscriptions: it holds what its largest backlog does.
        held = 0
        if policy.store_limit:
            scheduled = self.scheduled_bytes.get((kind, name), 0)
            held = max((q.pending.held + scheduled if credit is None
                        else credit.held(kind, name, q, q.pending.held + scheduled)
                        for q in t.subscribers.values()), default=scheduled) if t else scheduled
        return flow.refusal(policy, size, persistent, used, self.consumer_lag(kind, name), held,
                            credit)

    def consumer_lag(self, kind: str, name: str) -> int | None:
        """Body bytes the destination's consumers are behind, as producer pacing sees it; None
        when it has no consumer (a backlog being filled is never paced). A topic counts its
        subscriber that keeps up best: a slow one must not hold the rest back (it pages to temp
        files instead)."""
        if kind == QUEUE:
            q = self.queues.get(name)
            return q.lag() if q is not None and q.consumers else None
        t = self.topics.get(name)
        if t is None:
            return None
        lags = [q.lag() for q in t.subscribers.values() if q.consumers]
        return min(lags) if lags else None

    def queue(self, name: str) -> Queue:
        q = self.queues.get(name)
        if q is None:
            q = Queue(self, keys.queue_key(name), destination_of(QUEUE, name),
                      self.policy(QUEUE, name))
            self.queues[name] = q
            self.destinations.charge()
            self.virtual.added(name)
            self.advisories.destination("added", QUEUE, name)
            if self.queue_watch:
                self.queue_watch.created(name)
        return q

    def topic(self, name: str) -> Topic:
        t = self.topics.get(name)
        if t is None:
            t = Topic(name, destination_of(TOPIC, name))
            self.topics[name] = t
            self.destinations.charge()
            self.advisories.destination("added", TOPIC, name)
        return t

    def allocate_mid(self) -> int:
        mid = self.next_mid
        self.next_mid += 1
        return mid

    def allocate_mids(self, count: int) -> int:
        """A block of ``count`` consecutive ids (a staged publication); returns the first."""
        first = self.next_mid
        self.next_mid += count
        return first

    # -- publishing --------------------------------------------------------------------------
    def publish(self, kind: str, name: str, msg: Message, sender: object = None) -> None:
        """Route one message; a persistent one is journaled before any consumer sees it, or
        its write deferred (``later``) for a ready consumer: ``sender``'s receipts wait."""
        streams = self.large_streams
        stream = None if msg.group is None else streams.of(kind, name, msg)  # chunks have one
        if stream is not None and stream.state == DISCARDED:
            kind, name = QUEUE, f"{self.policy(kind, name).dlq_prefix}{name}"
        if kind == QUEUE:
            q = self.queues.get(name) or self.queue(name)  # once per message
            if msg.persistent and stream is None and q.consumers and self.later.wants(q, msg):
                self.later.add(q.key, msg, sender)  # a consumer is ready: it may ack first
            elif msg.persistent:  # held by q from the start (``_append_msg``, written out)
                msg.ticket = self.store.append_message(q.key, msg.mid, msg.timestamp,
                                                       msg.expires, msg.priority, msg.headers,
                                                       msg.loaded_body, 1, msg.owner)
                msg.inner = 0
                if msg.size >= self.config.journal.spill_bytes:
                    msg.body = None  # the journal has it; memory keeps the headers only
                if stream is not None:
                    streams.pin_tail(stream, msg.ticket)
            if stream is not None and streams.hold_chunk(stream, q, msg):
                return
            q.enqueue(msg)
            return
        topic = self.topic(name)
        topic.published += 1
        targets = self.topic_targets(topic, msg)
        if len(targets) > 1:  # the publisher's input pays for the deliveries beyond its own
            self.turns.fan_out(sum(1 for q in targets if any(c.ready() for c in q.consumers)) - 1)
        ticket = None
        durable = [q for q in targets if q.durable]
        if msg.persistent and durable:
            ticket = self._append_msg(keys.topic_key(name), msg, len(durable))
            msg.inner = 0
        if ticket is not None and msg.size >= self.config.journal.spill_bytes:
            msg.body = None
        if stream is not None and ticket is not None:
            streams.pin_tail(stream, ticket)
        for q in targets:
            copy = msg.copy_for(msg.destination)
            copy.ticket = ticket if q.durable else None
            copy.persistent = msg.persistent and q.durable
            if stream is not None and streams.hold_chunk(stream, q, copy):
                continue
            q.enqueue(copy)

    def body_of(self, msg: Message) -> bytes | memoryview:
        """The body, from memory or read back from the journal (large persistent messages)."""
        if msg.body is not None:
            return msg.body
        payload: bytes | memoryview = self.store.read(msg.ticket.loc)
        if msg.inner > 0:  # stored inside a transaction record
            payload = records.tx_op_at(payload, msg.inner)
        return records.message_body(payload)

    def _append_msg(self, key: str, msg: Message, holds: int) -> TicketLike:
        return self.store.append_message(key, msg.mid, msg.timestamp, msg.expires,
                                         msg.priority, msg.headers, msg.loaded_body, holds,
                                         msg.owner)

    # -- streams (the queues call these through QueueOwner) --------------------------------
    def stream_assigned(self, queue: Queue, stream_id: str, consumer: Consumer) -> None:
        self.large_streams.assigned(queue, stream_id, consumer)

    def stream_finished(self, queue: Queue, stream_id: str) -> None:
        self.large_streams.finish(queue, stream_id)

    def stream_discarded(self, queue: Queue, stream_id: str) -> None:
        self.large_streams.discarded(queue, stream_id)

    def wait_for_consumer(self, kind: str, name: str, timeout: float,
                          callback: Callable[[int], None], owner: object = None) -> None:
        """Call back with the consumer count once the destination has one, or at timeout
        (bounded per ``owner``, see core/limits/waits.py)."""
        self.consumer_waits.add(self._clock(), kind, name, timeout, callback, owner)

    def tick(self) -> None:
        """Once a second: abandon silent streams, answer consumer waits that timed out,
        compact the journal, give spare segment files back if their room is needed, resume
        producers whose destinations have room."""
        now = self._clock()
        self.consumer_waits.check(now)
        self.compactor.tick()
        self.store.journal.trim_spares()
        self.stager.tick(int(now * 1000))
        self.producers.tick(int(now * 1000))
        self.destinations.sweep(now)
        self.destinations.charge()
        self.flow.tick()
        self.flow.trimmer.observe_connections(self.admission.total)
        if self.advisories.enabled:
            self.advisories.check_slow(now, self.subscriptions.consumer_queues())
        self.large_streams.tick(now)

    def count_shares(self) -> tuple[int, int]:
        """Start-up, once recovery is done: charge every stored message to its sender's
        share, then let the store keep the shares (no-op without ``user_store_limit``).
        Returns the messages counted and the senders read from their records (the index
        snapshot names the others')."""
        if self.shares is None:
            return 0, 0
        counted = recount(self.shares, self.journal_holders.queues(), self.large_streams,
                          self.store.journal, self.stager.staged(), self.share_seed)
        self.share_seed = None
        self.store.shares = self.later.shares = self.shares
        return counted

    def count_holders(self) -> int:
        """Start-up, once recovery is done: how many durable subscriptions hold each topic
        record several of them do (``Store.shared``); returns the records found shared."""
        return self.store.shared.recount(self.journal_holders.shared_mids())

    # -- QueueOwner (and ``schedule_dispatch``, bound in ``__init__``) ------------------------
    def record_removal(self, queue: Queue, msgs: Iterable[Message]) -> None:
        if not queue.durable:
            return
        later = self.later
        for m in msgs:
            if m.persistent:
                if m.ticket is not None:
                    self.store.remove(queue.key, m.mid, m.ticket)
                elif later.entries:
                    later.removed(m)  # deferred and now settled: it needs no record at all

    def record_delivered(self, queue: Queue, consumer: Consumer, msgs: list[Message]) -> None:
        """``msgs`` went to ``consumer``, which acks automatically: consumed. A stored one's
        removal is journaled only once its bytes have left user space (``StoreLater.
        remove_when_written``): journaled at once, a kill -9 lost what the broker still held
        unsent (up to the connection's output share), although the client never got it."""
        if not queue.durable:
            return
        later = self.later
        stored: list[Message] = []
        for m in msgs:
            if m.persistent:
                if m.ticket is not None:
                    stored.append(m)
                elif later.entries:
                    later.removed(m)  # deferred: settled once its consumer's TCP has it
        if stored:
            later.remove_when_written(queue.key, stored, consumer.delivery.written_mark())

    def record_removal_run(self, queue: Queue, mids: array, segments: array,
                           offsets: array) -> None:
        if queue.durable:
            self.store.remove_run(queue.key, mids, segments, offsets)

    def note_expired(self, queue: Queue, msgs: list[Message]) -> None:
        """Expired before anyone took them: advisories (the removal is journaled apart)."""
        if self.advisories.enabled:
            self.advisories.expired(queue.destination, [m.message_id for m in msgs])

    def redeliver_later(self, queue: Queue, msgs: list[Message]) -> list[Message]:
        """Messages given back that the policy delays go to the scheduler (``redelivery``,
        wired by the composition root); returns the ones to redeliver at once."""
        return msgs if self.redelivery is None else self.redelivery(queue, msgs)

    def dead_letter(self, queue: Queue, msg: Message, reason: str = "redelivered") -> None:
        """Move a message that exhausted its redeliveries (or, by policy, expired) to
        ``/queue/DLQ.<name>`` atomically (``moves.dead_letter``)."""
        moves.dead_letter(self, queue, msg, reason)

    # -- subscriptions (the rest in ``subscriptions.Subscriptions``) -------------------------
    def topic_targets(self, topic: Topic, msg: Message) -> list[Queue]:
        """The topic's own subscribers, then wildcard subscribers whose pattern matches it."""
        targets = topic.targets(msg)
        if self.wildcards:
            targets += self.wildcards.targets(topic.name, msg)
        return targets

    def attach(self, consumer: Consumer) -> None:
        consumer.queue.add_consumer(consumer)
        if self.consumer_waits:
            self.consumer_waits.check(self._clock())

    # -- transactions ------------------------------------------------------------------------
    def commit(self, txid: str, messages: list[tuple[str, str, Message]],
               acks: list[tuple[Queue, list[Message]]],
               nacks: list[tuple[Queue, list[Message]]]) -> None:
        """Apply a transaction: stored as one (``moves.commit``), then the effects."""
        moves.commit(self, txid, messages, acks, nacks)

    # -- durability --------------------------------------------------------------------------
    def when_durable(self, callback: Waiter, sender: object = None) -> None:
        """Call back once everything appended so far is on disk (receipts wait on this) and
        every message deferred so far - ``sender``'s, when given (a receipt's connection) -
        is on disk or acknowledged by its consumer."""
        later = self.later
        if not later.entries or not later.wait(lambda exc: self.durable_waits.add(callback),
                                               sender):
            self.durable_waits.add(callback)

    def _on_durable(self, seq: int) -> None:
        self.pager.settle(seq)
        self.durable_waits.durable(seq)
        self.flow.poll()

    def _on_failed(self, first: int, last: int, exc: BaseException) -> None:
        """Records [first, last] never reached the disk: their receipts become ERRORs."""
        self.stager.failed(first, last)
        self.producers.failed(first, last)
        self.durable_waits.failed(first, last, exc)

