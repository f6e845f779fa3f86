"""Concurrent store-and-dispatch: a persistent message a consumer is ready for goes out first
and is written to the journal only if it is still unacknowledged ``delay`` seconds later.

Why: with a live consumer most messages are acknowledged within a millisecond or two, and a
message acknowledged before its write need never be written at all - a stream with a consumer
then moves at the speed of the sockets, not of the disk (ActiveMQ's concurrent store and
dispatch and RabbitMQ do the same). The promise a receipt makes does not weaken: a receipt
asked for while its connection's messages are deferred waits until each of them is durable or
acknowledged by its consumer (other connections' deferred messages do not hold it). For
``ack:auto`` "acknowledged" means its bytes have left the broker for good: the peer's TCP
acknowledged every byte of the connection up to the message's end, so neither a kill -9 nor a
reset can lose it any more; until then it counts as unacknowledged.

When a large message is due: ``delay`` after its consumer *has* it. A client-ack consumer can
only ACK what reached it, and a large body reaches it behind everything sent before: with 8
MiB chunks in flight the last one arrives ~8 ms after its publication, so "5 ms after
publication" wrote a third of a live stream's chunks that their consumer acked a moment later
(each costing the disk a MiB and the journal a removal). So for bodies of ``spill_bytes`` and
more the delay starts once the consumer's TCP acknowledged the message's last byte, and the
write is due ``AUTO_SECONDS`` after the send at the latest (a consumer that stopped reading).
The receipt still waits for the ACK or the write, whichever comes first.

The same watch serves stored messages (journaled before a consumer was ready) that an ack:auto
consumer takes: their removal is journaled only once the connection's bytes up to their end
have left user space (``remove_when_written``). Journaled as they were handed over, a kill -9
lost what the broker still held unsent - up to the connection's output share, never received.
Bytes in the kernel go out after the kill; a reset can still lose those (TCP's own limit).

Room: a deferred message takes room in the store from its SEND, though its record comes
later or never - else a burst to a consumer that never acknowledges passed the limits by up
to its prefetch before the first write. Its body bytes count in the broker-wide store's use
(``bytes``, read by ``Store.disk_estimate``) and, while the per-user share of the store is
kept (``shares``), in its sender's share; the write charges the share again as it stores it,
so the reservation is given back when the message leaves the list (written or settled).

Order: deferred messages are written in the order they were published, and all of them before
any other record (the store calls ``store_all`` before every append), so the journal holds
everything in publish order; an acknowledged deferred message leaves no record at all.
Everything here runs on the event-loop thread.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any, Protocol

from sluicemq.core.routing.message import Message
from sluicemq.core.routing.queue import Consumer, Queue
from sluicemq.storage.records import PRODUCER_HEADER
from sluicemq.storage.store import ShareBook, TicketLike

Waiter = Callable[[BaseException | None], None]
# An ack:auto delivery: (bytes of the connection its peer has acknowledged - a function, -1
# when unknown -, the connection's byte count at the end of the message).
Sent = tuple[Callable[[], int], int]
RECHECK_SECONDS = 0.001  # how often an ack:auto delivery is looked at again until it is due
# how often removals held back for unwritten bytes are looked at again: their consumer's
# socket is full (a slow reader), the removal record is merely later
UNWRITTEN_RECHECK_SECONDS = 0.01
# An ack:auto consumer that is reading is given this long to take a message in before it is
# written after all: such a consumer paces the producer (as RabbitMQ's confirms do), and its
# bytes reach it behind what was sent before, however short the store delay.
AUTO_SECONDS = 0.5
MAX_BYTES = 16 << 20  # deferred bodies held at most; past it the oldest are written at once


class _Entry:
    __slots__ = ("arriving", "consumer", "due", "index", "key", "msg", "removed", "sender",
                 "settled", "unsent")

    def __init__(self, key: str, msg: Message, index: int, due: float, sender: object) -> None:
        self.key = key
        self.msg = msg
        self.index = index
        self.due = due
        self.sender = sender  # the connection that published it (None: not a connection)
        self.settled = False  # written or acknowledged: it left ``entries``
        self.consumer: Consumer | None = None  # who it was last handed to
        self.unsent: Sent | None = None  # set when handed to an ack:auto consumer
        self.arriving: Sent | None = None  # a large body on its way to a client-ack consumer
        self.removed = False  # an ack:auto consumer took it: nothing holds it any more


class Journaling(Protocol):
    """What deferred writes need of the store (``Store``): a shape, so that a spec can record
    the calls instead of writing a journal."""

    def append_message(self, key: str, mid: int, timestamp: int, expires: int, priority: int,
                       headers: dict[str, str], body: bytes, holds: int = ...,
                       owner: bytes = ...) -> TicketLike: ...

    def hold(self, ticket: TicketLike, count: int = ...) -> None: ...

    def remove(self, key: str, mid: int, ticket: TicketLike) -> None: ...


class StoreLater:
    """The deferred messages, oldest first, and the receipts waiting for them to settle.

    ``store`` journals them (bodies of ``spill_bytes`` and more are then dropped from memory
    once a consumer, not a queue's cursor, holds the message). ``soon`` and ``later`` schedule on
    the loop (call_soon, call_later); ``clock`` is the loop's monotonic time.
    """

    def __init__(self, store: Journaling, spill_bytes: int,
                 soon: Callable[[Callable[[], None]], Any],
                 later: Callable[[float, Callable[[], None]], Any] | None,
                 clock: Callable[[], float], *, delay: float,
                 max_bytes: int = MAX_BYTES) -> None:
        self._store = store
        self.spill_bytes = spill_bytes
        self._soon = soon
        self._later = later or _no_timer
        self._clock = clock
        self.delay = delay if later is not None else 0.0
        self.max_bytes = max_bytes
        self.entries: OrderedDict[int, _Entry] = OrderedDict()  # id(msg) -> entry
        self._keys: dict[str, int] = {}  # deferred messages per queue key
        self.bytes = 0
        self._index = itertools.count(1)
        self._last = 0
        self._waiters: list[tuple[int, int, Waiter]] = []
        # per sender (a connection): its deferred messages in publish order (settled ones
        # leave from the front), and its receipts waiting, each for those up to an index
        self._sent_by: dict[object, deque[_Entry]] = {}
        self._sender_waits: dict[object, deque[tuple[int, Waiter]]] = {}
        self._settled_for: set[object] = set()  # senders whose waits _release looks at
        self._order = itertools.count()
        self._timer: Any = None
        self._timer_at = 0.0  # when the armed timer runs _due
        self._timer_gen = 0  # a timer armed earlier than the current one ignores itself
        self._recheck: Any = None
        self._sent_auto: list[_Entry] = []
        # removals of stored messages handed to ack:auto consumers, waiting for their bytes
        # to leave user space: per connection (its bytes_written), in delivery order, (queue
        # key, messages, where their bytes end) - a check stops at a connection's first
        # unwritten one, so a fast consumer's backlog of held runs costs one look a turn
        self._unwritten: dict[Callable[[], int], deque[tuple[str, list[Message], int]]] = {}
        self.unwritten = 0  # messages in _unwritten
        self._unwritten_soon = False  # _check_unwritten is scheduled
        self._storing = False
        self.deferred = 0  # counters, for /metrics and the benchmarks
        self.skipped = 0  # acknowledged before they were due: never written
        self.stored = 0
        self.shares: ShareBook | None = None  # the per-user share, while it is kept

    @property
    def enabled(self) -> bool:
        return self.delay > 0

    def wants(self, q: Queue, msg: Message) -> bool:
        """Defer the write of ``msg``, a persistent message for ``q``? Only a plain message a
        ready consumer will take soon: nothing but deferred messages waits before it (they go
        out on the next dispatch pass); a producer id (duplicate detection reads its record)
        or a group keep the plain path."""
        if not (self.delay > 0 and q.consumers and msg.group is None
                and len(q.pending) <= self._keys.get(q.key, 0)
                and PRODUCER_HEADER not in msg.headers):
            return False
        return any(c.ready() for c in q.consumers)

    def add(self, key: str, msg: Message, sender: object = None) -> None:
        """Defer ``msg`` (not yet journaled; its ticket stays None until it is), published by
        ``sender`` (its connection: a receipt it asks for waits for it, ``wait``)."""
        index = self._last = next(self._index)
        entry = self.entries[id(msg)] = _Entry(key, msg, index, self._clock() + self.delay,
                                               sender)
        if sender is not None:
            line = self._sent_by.get(sender)
            if line is None:
                line = self._sent_by[sender] = deque()
            line.append(entry)
        self._keys[key] = self._keys.get(key, 0) + 1
        self.bytes += msg.size
        self.deferred += 1
        shares = self.shares
        if shares is not None:  # reserved in her share until written or settled (``_drop``)
            shares.charge(msg.owner, msg.mid, msg.size, 1)
        self._arm(next(iter(self.entries.values())).due)  # nothing is written before the head
        if self.bytes > self.max_bytes:
            self._store_oldest(lambda: self.bytes > self.max_bytes)

    def sent(self, msg: Message, consumer: Consumer | None, unsent: Sent | None, *,
             auto: bool = True) -> None:
        """``msg`` was handed to ``consumer``; ``unsent``: where its bytes end on the
        connection, for a consumer that acks automatically (``auto``) or, for a large body,
        one that acks itself (its store delay then counts from their arrival)."""
        entry = self.entries.get(id(msg))
        if entry is None:
            return
        entry.consumer = consumer
        if unsent is None or not (auto or msg.size >= self.spill_bytes):
            return
        if auto:
            entry.unsent = unsent
        else:
            entry.arriving = unsent
        entry.due = max(entry.due, self._clock() + AUTO_SECONDS)
        self._sent_auto.append(entry)
        if self._recheck is None:
            # call_soon runs after the transport's own flush scheduled by this delivery
            self._recheck = self._soon(self._check_sent)

    def removed(self, msg: Message) -> bool:
        """A queue let go of ``msg`` (acked, expired, purged). True when it was deferred: it
        needs no record then - unless an ack:auto consumer's bytes are not out yet."""
        entry = self.entries.get(id(msg))
        if entry is None:
            return False
        if entry.unsent is not None:
            entry.removed = True  # settled by _check_sent, or stored with its removal
            return True
        self._settle(entry)
        self._release()
        return True

    def remove_when_written(self, key: str, msgs: list[Message], written: Sent | None) -> None:
        """An ack:auto consumer was handed ``msgs``, stored messages of queue ``key``: journal their
        removal once ``written`` (how much of the connection left user space, where their
        bytes end) says the kernel has all their bytes - it sends them even if the broker is
        killed -9 next, while bytes still in our buffers would be gone with it. At once when
        the transport cannot say (None). Until then they are the queue's in the journal, in index
        snapshots (``unwritten_of``) and for compaction; a closed connection releases them
        (-1: in memory they were consumed when handed over). At most the connection's output
        share of them waits."""
        if written is None:
            remove = self._store.remove
            for m in msgs:
                if m.ticket is not None:
                    remove(key, m.mid, m.ticket)
            return
        written_fn, end = written
        line = self._unwritten.get(written_fn)
        if line is None:
            line = self._unwritten[written_fn] = deque()
        line.append((key, msgs, end))
        self.unwritten += len(msgs)
        if not self._unwritten_soon:  # each dispatch turn's removals looked at right after it
            self._unwritten_soon = True
            # call_soon runs after the transport's own flush scheduled by this delivery
            self._soon(self._check_unwritten)

    def release_written(self) -> None:
        """Journal the held-back removals whose bytes have left user space (``capture`` calls
        it first, so that a snapshot keeps only what is still unwritten)."""
        remove = self._store.remove
        lines = self._unwritten
        for written in list(lines):
            line = lines[written]
            seen = written()
            while line and (seen < 0 or line[0][2] <= seen):
                key, msgs, _ = line.popleft()
                self.unwritten -= len(msgs)
                for m in msgs:
                    if m.ticket is not None:  # (compaction may have moved it: the current one)
                        remove(key, m.mid, m.ticket)
            if not line:
                del lines[written]

    def _check_unwritten(self) -> None:
        self._unwritten_soon = False
        self.release_written()
        if self._unwritten and self._recheck is None:  # a full socket: look again later
            self._recheck = self._later(UNWRITTEN_RECHECK_SECONDS, self._check_sent)

    def release_all(self) -> None:
        """Journal every held-back removal now, written or not: the broker stops cleanly and
        its connections with it; in memory those messages were consumed when handed over, so
        none comes back after the restart behind messages consumed after it."""
        remove = self._store.remove
        for line in self._unwritten.values():
            for key, msgs, _ in line:
                for m in msgs:
                    if m.ticket is not None:
                        remove(key, m.mid, m.ticket)
        self._unwritten = {}
        self.unwritten = 0

    def give_back(self, msgs: list[Message]) -> None:
        """``msgs``, handed to an ack:auto consumer, go back to their queue: their bytes never
        left the broker (its connection ended first, ``sessions/unwritten.py``). A removal held
        for their bytes is dropped unjournaled (the queue holds them again); a deferred one is
        the queue's again, written when due unless acknowledged first."""
        ids = {id(m) for m in msgs}
        for m in msgs:
            entry = self.entries.get(id(m))
            if entry is not None:
                entry.removed = False
                entry.unsent = None
        lines = self._unwritten
        for written in list(lines):
            kept: deque[tuple[str, list[Message], int]] = deque()
            for key, held, end in lines[written]:
                left = [m for m in held if id(m) not in ids]
                self.unwritten -= len(held) - len(left)
                if left:
                    kept.append((key, left, end))
            if kept:
                lines[written] = kept
            else:
                del lines[written]

    def unwritten_of(self) -> dict[str, list[Message]]:
        """The messages whose removal waits for their bytes, by queue key, in delivery order:
        index snapshots and compaction count them as the queue's."""
        found: dict[str, list[Message]] = {}
        for line in self._unwritten.values():
            for key, msgs, _ in line:
                found.setdefault(key, []).extend(msgs)
        return found

    def wait(self, waiter: Waiter, sender: object = None) -> bool:
        """Hold ``waiter`` until every message deferred so far has settled - of ``sender``
        only, when given; False (and nothing held) when none is outstanding.

        Why per sender: a receipt promises what its own connection sent; waiting for every
        deferred message held one user's receipts until another's consumer acknowledged
        (``bench/fairness.py``). Journal order needs no more: deferred messages are written
        oldest first, and before any other record of their queue (``store_all``)."""
        if not self.entries:
            return False
        if sender is None:
            heapq.heappush(self._waiters, (self._last, next(self._order), waiter))
            return True
        line = self._sent_by.get(sender)
        if line is None:
            return False
        self._sender_waits.setdefault(sender, deque()).append((line[-1].index, waiter))
        return True

    def store_all(self, key: str | None = None) -> None:
        """Journal every deferred message now: a record is about to be appended (``key``: a
        message of that queue, which needs only that queue's deferred messages before it) or
        the broker stops. The journal's order stays the publish order of every queue."""
        if self.entries and not self._storing and (key is None or key in self._keys):
            self._store_oldest(lambda: True)

    # -- internals ---------------------------------------------------------------------------
    def _check_sent(self) -> None:
        self._recheck = None
        if self._unwritten:
            self.release_written()
        waiting = self._sent_auto
        self._sent_auto = []
        now = self._clock()
        for entry in waiting:
            if id(entry.msg) not in self.entries:
                continue
            arriving = entry.arriving
            if arriving is None and entry.unsent is None:
                continue  # given back to its queue (give_back): nothing to watch
            if arriving is not None:
                if _arrived(arriving):  # its consumer has it: an ACK is due within the delay
                    entry.arriving = None
                    entry.due = now + self.delay
                else:
                    self._sent_auto.append(entry)
            elif _out(entry):
                self._settle(entry)
            else:
                self._sent_auto.append(entry)
        self._release()
        if self.entries:
            self._arm(next(iter(self.entries.values())).due)
        if self._sent_auto:
            self._recheck = self._later(RECHECK_SECONDS, self._check_sent)
        elif self._unwritten:
            self._recheck = self._later(UNWRITTEN_RECHECK_SECONDS, self._check_sent)

    def _arm(self, at: float) -> None:
        """Have ``_due`` run at ``at``, unless a timer already runs it as early."""
        if self._timer is not None and self._timer_at <= at:
            return
        self._timer_gen += 1
        gen = self._timer_gen
        self._timer_at = at
        self._timer = self._later(max(0.0, at - self._clock()), lambda: self._due(gen))

    def _due(self, gen: int) -> None:
        if gen != self._timer_gen:
            return  # an earlier timer replaced this one
        self._timer = None
        now = self._clock()
        self._store_oldest(lambda: next(iter(self.entries.values())).due <= now)
        if self.entries:
            self._arm(next(iter(self.entries.values())).due)

    def _store_oldest(self, more: Callable[[], bool]) -> None:
        """Settle or journal deferred messages oldest first while ``more()`` says so."""
        self._storing = True
        try:
            while self.entries and more():
                entry = next(iter(self.entries.values()))
                if _out(entry):
                    self._settle(entry)
                    continue
                self._drop(entry)
                self.stored += 1
                self._write(entry)
        finally:
            self._storing = False
        self._release()

    def _write(self, entry: _Entry) -> None:
        """Journal a message not acknowledged in time; one an ack:auto consumer took whose
        bytes were not out yet (``removed``) gets its removal journaled right behind it."""
        msg, store = entry.msg, self._store
        msg.ticket = store.append_message(entry.key, msg.mid, msg.timestamp, msg.expires,
                                          msg.priority, msg.headers, msg.loaded_body, 0,
                                          msg.owner)
        msg.inner = 0
        store.hold(msg.ticket)
        consumer = entry.consumer
        if entry.removed:  # its removal too, once its bytes left user space (or at once)
            sent = entry.unsent
            mark = consumer.delivery.written_mark() if consumer is not None else None
            self.remove_when_written(entry.key, [msg], None if mark is None or sent is None
                                     else (mark[0], sent[1]))
        elif (msg.size >= self.spill_bytes and consumer is not None
              and consumer.inflight.get(msg.mid) is msg):
            msg.body = None  # no cursor counts its body (a consumer has it): the journal keeps it

    def _settle(self, entry: _Entry) -> None:
        self._drop(entry)
        self.skipped += 1

    def _drop(self, entry: _Entry) -> None:
        msg = entry.msg
        del self.entries[id(msg)]
        sender = entry.sender
        if sender is not None:
            entry.settled = True
            line = self._sent_by[sender]
            while line and line[0].settled:
                line.popleft()
            if not line:
                del self._sent_by[sender]
            if sender in self._sender_waits:  # released by _release, after any write
                self._settled_for.add(sender)
        self.bytes -= msg.size
        shares = self.shares
        if shares is not None:
            shares.release(msg.mid)
        left = self._keys[entry.key] - 1
        if left:
            self._keys[entry.key] = left
        else:
            del self._keys[entry.key]

    def _release(self) -> None:
        """Hand every waiter whose deferred messages have all settled on to the journal."""
        if self._settled_for:
            self._release_senders()
        waiters = self._waiters
        if not waiters:
            return
        first = next(iter(self.entries.values())).index if self.entries else self._last + 1
        ready = []
        while waiters and waiters[0][0] < first:
            ready.append(heapq.heappop(waiters)[2])
        for waiter in ready:
            waiter(None)

    def _release_senders(self) -> None:
        """``_release`` for the senders whose deferred messages settled since the last."""
        ready: list[Waiter] = []
        for sender in self._settled_for:
            line = self._sent_by.get(sender)
            first = line[0].index if line else self._last + 1
            waits = self._sender_waits[sender]
            while waits and waits[0][0] < first:
                ready.append(waits.popleft()[1])
            if not waits:
                del self._sender_waits[sender]
        self._settled_for.clear()
        for waiter in ready:
            waiter(None)


def _out(entry: _Entry) -> bool:
    """Has an ack:auto consumer's TCP acknowledged every byte of this message?"""
    sent = entry.unsent
    if not entry.removed or sent is None:
        return False
    acked, end = sent
    return acked() >= end


def _arrived(sent: Sent) -> bool:
    """Has the peer's TCP acknowledged every byte up to the message's end? Yes when that
    cannot be known (the delay then counts from the send, as for a small message)."""
    acked, end = sent
    seen = acked()
    return seen < 0 or seen >= end


def _no_timer(delay: float, fn: Callable[[], None]) -> None:
    raise AssertionError("nothing is deferred without a timer")
