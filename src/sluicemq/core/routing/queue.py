"""A queue and its consumers: pending messages, subscriptions, and what happens on ack, nack
and departure (one module: a consumer is a queue's view of one subscription).

Also the shape of every topic subscription (each subscriber gets a queue of its own), so that
acks, prefetch, redelivery and DLQ rules are written once.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from sluicemq.config import Policy
from sluicemq.core.paging.cursor import PendingList
from sluicemq.core.routing.keys import DestKey
from sluicemq.core.routing.message import Message
from sluicemq.core.streams.chunks import DISCARD, RESTART, is_chunk, is_final

if TYPE_CHECKING:
    from sluicemq.core.selectors import Selector


AUTO, CLIENT, CLIENT_INDIVIDUAL = "auto", "client", "client-individual"
ACK_MODES = (AUTO, CLIENT, CLIENT_INDIVIDUAL)


class Delivery(Protocol):
    """What a consumer needs from its connection: write a MESSAGE, tell if it can take more."""

    peer: str

    @property
    def writable(self) -> bool: ...

    def deliver(self, consumer: Consumer, msg: Message) -> None: ...

    def deliver_run(self, consumer: Consumer, msgs: list[Message]) -> int:
        """``deliver`` each of ``msgs`` in order (counting its delivery) until the connection
        has no room; returns how many went."""
        ...

    def written_mark(self) -> tuple[Callable[[], int], int] | None:
        """Where the connection's output ends now, with a function telling how much of it has
        left user space (the kernel sends that even if the broker dies); None when the
        transport cannot tell."""
        ...

    def stream_error(self, stream_id: str, text: str) -> None: ...


class Consumer:
    """A subscription: where it reads from, how it acks, how much it may hold unacknowledged.

    ``inflight`` keeps delivered-but-unacked messages in delivery order, which is what a
    cumulative (``client``) ACK needs.
    """

    __slots__ = (
        "ack_mode", "delivery", "destination", "exclusive", "index", "inflight", "max_streams",
        "open_streams", "prefetch", "priority", "queue", "resumed", "selector", "stream_acked",
        "stream_credit", "sub_id", "wire",
    )

    def __init__(
        self,
        delivery: Delivery,
        sub_id: str,
        index: int,
        destination: str,
        queue: Queue,
        *,
        ack_mode: str = AUTO,
        prefetch: int = 1000,
        selector: Selector | None = None,
        exclusive: bool = False,
        max_streams: int = 0,
        stream_credit: int = -1,
        priority: int = 0,
    ) -> None:
        self.delivery = delivery
        self.sub_id = sub_id
        self.index = index
        self.destination = destination
        self.queue = queue
        self.ack_mode = ack_mode
        self.prefetch = max(1, prefetch)
        self.selector = selector
        self.exclusive = exclusive
        self.priority = priority  # activemq.priority: higher ones are served first
        self.inflight: dict[int, Message] = {}
        self.max_streams = max_streams  # 0: any number of streams at once
        self.open_streams: set[str] = set()  # streams given to us whose final chunk is unacked
        # Streams we may still be given (-1: any number): a receiver that wants N streams
        # gets no chunk of the N+1st to leave unread (sluice-stream-credit)
        self.stream_credit = stream_credit
        self.resumed: set[str] = set()  # streams taken over mid-way: mark the next chunk
        self.stream_acked: dict[str, list[Message]] = {}  # `restart` policy: acks held back
        # What its MESSAGE heads start with, for the destination it was last written for
        # (the delivering session's, to a 1.2 peer: sessions/context.py)
        self.wire: tuple[str, str, str, str] | None = None

    def ready(self) -> bool:
        """Room for one more message: the socket drains and the prefetch window is open."""
        if not self.delivery.writable:
            return False
        return self.ack_mode == AUTO or len(self.inflight) < self.prefetch

    def can_open_stream(self) -> bool:
        return self.stream_credit != 0 and (self.max_streams <= 0
                                            or len(self.open_streams) < self.max_streams)

    def open_stream(self, group: str) -> None:
        """A stream is given to us: it is open until we ack its final chunk."""
        self.open_streams.add(group)
        if self.stream_credit > 0:
            self.stream_credit -= 1

    def accepts(self, msg: Message) -> bool:
        return self.selector is None or self.selector.matches(msg.headers)

    def take_inflight_upto(self, mid: int) -> list[Message]:
        """Cumulative ACK: every message delivered up to and including ``mid``."""
        taken: list[Message] = []
        for key in list(self.inflight):
            taken.append(self.inflight.pop(key))
            if key == mid:
                break
        return taken

    def take_inflight_below(self, mid: int) -> list[Message]:
        """Cumulative ACK of a message no longer held (a ledger commit removed it): the
        unacknowledged ones with lower ids."""
        taken = [m for m in self.inflight.values() if m.mid < mid]
        for m in taken:
            del self.inflight[m.mid]
        return taken

    def __repr__(self) -> str:
        return f"<Consumer {self.sub_id} on {self.destination} {self.ack_mode}>"


class QueueOwner(Protocol):
    """The broker services a queue relies on, injected so queues stay testable alone."""

    def schedule_dispatch(self, queue: Queue) -> None: ...

    def make_pending(self, destination: str, policy: Policy) -> PendingList: ...

    def record_removal(self, queue: Queue, msgs: Iterable[Message]) -> None: ...

    def record_delivered(self, queue: Queue, consumer: Consumer, msgs: list[Message]) -> None:
        """``record_removal`` of messages handed to ``consumer``, which acks automatically."""
        ...

    def record_removal_run(self, queue: Queue, mids: array, segments: array,
                           offsets: array) -> None: ...

    def dead_letter(self, queue: Queue, msg: Message, reason: str = "redelivered") -> None: ...

    def redeliver_later(self, queue: Queue, msgs: list[Message]) -> list[Message]: ...

    def note_expired(self, queue: Queue, msgs: list[Message]) -> None: ...

    def stream_assigned(self, queue: Queue, stream_id: str, consumer: Consumer) -> None: ...

    def stream_finished(self, queue: Queue, stream_id: str) -> None: ...

    def stream_discarded(self, queue: Queue, stream_id: str) -> None: ...


@dataclass(slots=True)
class QueueStats:
    """Lifetime counters (since broker start)."""

    enqueued: int = 0
    dequeued: int = 0
    redelivered: int = 0
    expired: int = 0
    dead_lettered: int = 0


class Queue:
    """Pending messages plus consumers; ``durable`` queues journal the removal of persistent ones.

    ``key`` names the queue in the journal: ``q:NAME`` for queues, ``d:CLIENT:SUB`` for durable
    topic subscriptions; non-durable topic subscriptions are not journaled at all.
    """

    def __init__(
        self,
        owner: QueueOwner,
        key: DestKey,
        destination: str,
        policy: Policy,
        *,
        durable: bool = True,
        selector: Selector | None = None,
    ) -> None:
        self.owner = owner
        self.key = key
        self.destination = destination
        self.policy = policy
        self.durable = durable
        self.selector = selector  # topic subscriptions filter at publish time
        self.pending = owner.make_pending(destination, policy)
        self.consumers: list[Consumer] = []
        self.groups: dict[str, Consumer] = {}
        self.rr = 0
        self.stats = QueueStats()
        # told of the messages that leave for good (``acknowledge``, whoever journals it):
        # the scheduler's own queues, whose bytes it tallies per destination
        self.on_removed: Callable[[list[Message]], None] | None = None

    # -- producers -------------------------------------------------------------------------
    def enqueue(self, msg: Message) -> None:
        self.pending.push(msg)
        self.stats.enqueued += 1
        if self.consumers:
            self.owner.schedule_dispatch(self)

    # -- consumers -------------------------------------------------------------------------
    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)
        self.owner.schedule_dispatch(self)

    def remove_consumer(self, consumer: Consumer) -> None:
        """A consumer left: its unacked messages come back for redelivery, its groups free up."""
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        for group, owner in list(self.groups.items()):
            if owner is consumer:
                del self.groups[group]
        held = [m for msgs in consumer.stream_acked.values() for m in msgs]
        returned = held + list(consumer.inflight.values())
        consumer.stream_acked.clear()
        consumer.inflight.clear()
        if consumer.open_streams and self.policy.stream_redelivery == DISCARD:
            returned = self._discard_streams(consumer.open_streams, returned)
        consumer.open_streams.clear()
        consumer.resumed.clear()
        self.return_messages(returned)
        if self.consumers and self.pending:
            self.owner.schedule_dispatch(self)  # what the leaver was skipped for may go now

    def lag(self) -> int:
        """Body bytes the consumers have yet to be handed (in memory and paged out): what
        producer pacing (``max_consumer_lag``) bounds."""
        return self.pending.memory + self.pending.stored_bytes

    @property
    def inflight_count(self) -> int:
        return sum(len(c.inflight) for c in self.consumers)

    def depth(self) -> int:
        """Messages not yet consumed: pending plus delivered-but-unacked."""
        return len(self.pending) + self.inflight_count

    # -- acknowledgement -------------------------------------------------------------------
    def acknowledge(self, msgs: Iterable[Message], *, record: bool = True,
                    consumer: Consumer | None = None) -> None:
        """Consumed for good: count it and let the journal forget it.

        ``record=False`` when the caller journals the removal itself (a transaction's COMMIT).
        ``consumer`` is who acked: acking a stream's final chunk closes that stream for it.
        """
        msgs = list(msgs)
        if consumer is not None and consumer.open_streams:
            msgs = self._stream_acks(consumer, msgs)
            if self.consumers:
                self.owner.schedule_dispatch(self)  # held-back acks still free prefetch room
        if not msgs:
            return
        self.stats.dequeued += len(msgs)
        if self.on_removed is not None:
            self.on_removed(msgs)
        if record:
            self.owner.record_removal(self, msgs)
        if self.consumers:
            self.owner.schedule_dispatch(self)

    def acknowledge_run(self, mids: array, segments: array, offsets: array) -> None:
        """``acknowledge`` of paged-out messages given as columns (a ledger commit)."""
        if not mids:
            return
        self.stats.dequeued += len(mids)
        self.owner.record_removal_run(self, mids, segments, offsets)
        if self.consumers:
            self.owner.schedule_dispatch(self)

    # -- streams -----------------------------------------------------------------------------
    def _stream_acks(self, consumer: Consumer, msgs: list[Message]) -> list[Message]:
        """Acks of stream chunks: `restart` holds them back until the final chunk is acked."""
        restart = self.policy.stream_redelivery == RESTART
        out: list[Message] = []
        for m in msgs:
            group = m.group
            if group is None or group not in consumer.open_streams or not is_chunk(m):
                out.append(m)
            elif is_final(m):
                out.extend(consumer.stream_acked.pop(group, ()))
                out.append(m)
                self.close_stream(consumer, group)
            elif restart:
                consumer.stream_acked.setdefault(group, []).append(m)
            else:
                out.append(m)
        return out

    def close_stream(self, consumer: Consumer, group: str | None) -> None:
        """The consumer has the whole stream: free it for its next one."""
        if group is None:
            return
        consumer.open_streams.discard(group)
        consumer.resumed.discard(group)
        if self.groups.get(group) is consumer:
            del self.groups[group]
        self.owner.stream_finished(self, group)

    def release_stream(self, consumer: Consumer, group: str) -> list[Message]:
        """The consumer gives a stream back (NACK): returns its held and unread chunks, for the
        caller to put back, so that the next consumer resumes the stream."""
        held = consumer.stream_acked.pop(group, [])
        unread = [m for m in consumer.inflight.values() if m.group == group]
        for m in unread:
            del consumer.inflight[m.mid]
        consumer.open_streams.discard(group)
        consumer.resumed.discard(group)
        if consumer.stream_credit >= 0:  # given back: it did not use up the credit
            consumer.stream_credit += 1
        if self.groups.get(group) is consumer:
            del self.groups[group]
        return held + unread

    def take_group(self, group: str) -> list[Message]:
        """Remove every pending message of one group (stream discard and abandonment)."""
        kept: list[Message] = []
        taken: list[Message] = []
        while (m := self.pending.pop()) is not None:
            (taken if m.group == group else kept).append(m)
        for m in kept:
            self.pending.push(m)
        return taken

    def _discard_streams(self, groups: set[str], returned: list[Message]) -> list[Message]:
        """`discard` policy: the rest of each open stream goes to the DLQ, not to another."""
        keep = [m for m in returned if m.group not in groups]
        for group in groups:
            doomed = [m for m in returned if m.group == group] + self.take_group(group)
            for m in doomed:
                self.stats.dead_lettered += 1
                self.owner.dead_letter(self, m)
            self.owner.stream_discarded(self, group)
        return keep

    def return_messages(self, msgs: list[Message]) -> None:
        """NACK or consumer loss: back to the front for redelivery, or to the DLQ when spent;
        with a redelivery delay in the policy, to the scheduler until the delay is over."""
        again: list[Message] = []
        for msg in reversed(msgs):
            if msg.deliveries > self.policy.max_redeliveries:
                self.stats.dead_lettered += 1
                self.owner.dead_letter(self, msg)
            else:
                self.stats.redelivered += 1
                again.append(msg)
        if again and (self.policy.initial_redelivery_delay or self.policy.redelivery_delay):
            again = self.owner.redeliver_later(self, again)
        for msg in again:
            self.pending.push_front(msg)
        if msgs and self.consumers:
            self.owner.schedule_dispatch(self)

    def purge(self) -> int:
        removed = self.pending.drain_stubs()  # a paged-out backlog is not read back to drop it
        self.acknowledge(removed)
        return len(removed)

    def discard(self) -> None:
        """A non-durable subscription ended: what it still held goes with it (its memory and
        temp records are given back; it holds no journal record unless a bug put one there,
        and that one is let go like an acknowledged message)."""
        removed = self.pending.discard()
        if removed:
            self.acknowledge(removed)

    def __repr__(self) -> str:
        return f"<Queue {self.key} pending={len(self.pending)} consumers={len(self.consumers)}>"
