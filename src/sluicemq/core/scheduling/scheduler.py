"""Scheduled delivery the ActiveMQ way: ``AMQ_SCHEDULED_DELAY``, ``_PERIOD`` and ``_REPEAT``.

Where a scheduled message waits: in the broker's own queue ``sluice.scheduled``, stored and
paged like any other message - a persistent one is in the journal before its RECEIPT, a
restart keeps the schedule, and a million waiting messages cost their index slots in memory,
not their bodies. Its headers say where it goes (``sluice-scheduled-destination``), when
(``sluice-scheduled-at``, ms since the epoch) and how many repetitions are left.

When it is due it moves in one journal transaction: removed from ``sluice.scheduled``, a copy
under a fresh id stored at its destination and, if it repeats, the next repetition stored back
in ``sluice.scheduled`` - so a crash at any moment neither loses a scheduled message nor
delivers one twice. In memory the scheduler keeps a heap of (due time, id): ~60 bytes a
scheduled message. Nobody may send to, subscribe to or read ``sluice.scheduled`` directly;
the admin API lists and purges it like any queue (that cancels what it removes).

``AMQ_SCHEDULED_CRON`` (core/scheduling/cron.py) combines with the others as in ActiveMQ: at
each time the entry names, the message goes after ``AMQ_SCHEDULED_DELAY``, then
``AMQ_SCHEDULED_REPEAT`` more times ``AMQ_SCHEDULED_PERIOD`` apart; then it waits for the
entry's next time (counted from when the last copy went), for ever or until cancelled. The
entry's current time rides in a header (``sluice-scheduled-cron-at``), so a restart keeps it.
A scheduled SEND in a transaction or to several destinations at once gets an ERROR.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sluicemq.core.routing.names import QUEUE, parse_destination
from sluicemq.core.scheduling import cron
from sluicemq.core.scheduling.redelivery import redelivery_delay
from sluicemq.core.streams.chunks import is_chunk
from sluicemq.errors import ProtocolError

if TYPE_CHECKING:
    from sluicemq.core.routing.broker import Broker
    from sluicemq.core.routing.message import Message

log = logging.getLogger(__name__)

NAME = "sluice.scheduled"  # the queue scheduled messages wait in
DELAY = "AMQ_SCHEDULED_DELAY"
PERIOD = "AMQ_SCHEDULED_PERIOD"
REPEAT = "AMQ_SCHEDULED_REPEAT"
CRON = "AMQ_SCHEDULED_CRON"
HEADERS = (DELAY, PERIOD, REPEAT, CRON)
DESTINATION = "sluice-scheduled-destination"
AT = "sluice-scheduled-at"
LEFT = "sluice-scheduled-repeats-left"
CRON_AT = "sluice-scheduled-cron-at"  # the cron entry's time the current round belongs to
REDELIVERY = "sluice-scheduled-redelivery"  # a given-back message: its deliveries so far
INTERNAL = (DESTINATION, AT, LEFT, CRON_AT, REDELIVERY)
MAX_FIRES_PER_TURN = 500  # a burst of due messages yields the loop between turns
_MAX_MS = 10 * 365 * 24 * 3600 * 1000  # ten years: anything longer is surely a mistake

Timer = Callable[[float, Callable[[], None]], Any]  # loop.call_later


def asks_for_schedule(headers: dict[str, str]) -> bool:
    """Whether a SEND carries any of ActiveMQ's scheduling headers."""
    return any(key in headers for key in HEADERS)


def refuse_direct(kind: str, name: str) -> None:
    """``sluice.scheduled`` belongs to the broker: clients reach it only through the headers."""
    if kind == QUEUE and name == NAME:
        raise ProtocolError(f"/queue/{NAME} is the broker's own queue of scheduled messages: "
                            f"send with {DELAY} instead", fatal=False)


def _millis(headers: dict[str, str], key: str) -> int:
    raw = headers.get(key)
    if raw is None:
        return 0
    try:
        value = int(raw.strip())
    except ValueError:
        raise ProtocolError(f"invalid {key} {raw[:40]!r}: a whole number is needed",
                            fatal=False) from None
    if not 0 <= value <= _MAX_MS:
        raise ProtocolError(f"invalid {key} {value}: 0 to {_MAX_MS} is allowed", fatal=False)
    return value


class Scheduler:
    """Holds scheduled messages until they are due, then moves them (see the module doc)."""

    def __init__(self, broker: Broker, call_later: Timer, *, enabled: bool = True) -> None:
        self.broker = broker
        self.enabled = enabled
        self._call_later = call_later
        self._heap: list[tuple[int, int]] = []  # (due ms, id in sluice.scheduled)
        self._armed_for: int | None = None
        self._handle: Any = None

    def wants(self, headers: dict[str, str]) -> bool:
        """Whether this SEND is to be scheduled (the switch is on and it asks for it)."""
        return self.enabled and asks_for_schedule(headers)

    def schedule(self, kind: str, name: str, msg: Message) -> bool:
        """Park ``msg`` (built for ``/kind/name``) until it is due; False when the headers
        ask for nothing later than now (the caller publishes it at once). ProtocolError
        for headers that cannot be honoured."""
        h = msg.headers
        delay, period = _millis(h, DELAY), _millis(h, PERIOD)
        repeat = _millis(h, REPEAT)
        if repeat and not period:
            raise ProtocolError(f"{REPEAT} needs {PERIOD} (the time between repetitions)",
                                fatal=False)
        entry = _cron(h)
        if entry is None and delay == 0 and repeat == 0:
            return False
        for key in INTERNAL:
            h.pop(key, None)
        due = self.broker.now_ms() + delay
        if entry is not None:
            base = cron.next_after(entry, self.broker.now_ms())
            h[CRON_AT] = str(base)
            due = base + delay
        h[DESTINATION] = msg.destination
        h[AT] = str(due)
        h[LEFT] = str(repeat)
        msg.destination = f"/queue/{NAME}"
        self.broker.publish(QUEUE, NAME, msg)
        self._add(due, msg.mid)
        return True

    def redeliver(self, queue: Any, msgs: list[Message]) -> list[Message]:
        """Messages given back to ``queue`` (NACK, consumer gone) wait out its policy's
        redelivery delay here: one journal transaction takes them off the queue and stores
        them in ``sluice.scheduled``; when due they go to the queue's tail with their
        delivery count (ActiveMQ's redelivery plugin). Returns the ones to redeliver at once:
        the scheduler is off, a topic subscription's, a stream chunk, no delay due."""
        if not self.enabled or not queue.key.startswith("q:") or queue.key == f"q:{NAME}":
            return msgs
        now = self.broker.now_ms()
        at_once: list[Message] = []
        parked: list[Message] = []
        copies: list[tuple[str, str, Message]] = []
        for msg in msgs:
            delay = 0 if is_chunk(msg) else redelivery_delay(queue.policy, msg.deliveries)
            if delay <= 0:
                at_once.append(msg)
                continue
            copy = msg.moved_to(f"/queue/{NAME}", self.broker.allocate_mid())
            copy.body = bytes(self.broker.body_of(msg))
            copy.headers.update({DESTINATION: queue.destination, AT: str(now + delay),
                                 LEFT: "0", REDELIVERY: str(msg.deliveries)})
            parked.append(msg)
            copies.append((QUEUE, NAME, copy))
        if parked:
            self.broker.commit(f"redeliver:{copies[0][2].mid}", copies, [(queue, parked)], [])
            for _kind, _name, copy in copies:
                self._add(int(copy.headers[AT]), copy.mid)
        return at_once

    def recover(self) -> int:
        """After the broker recovered: rebuild the heap from what ``sluice.scheduled`` holds
        (each waiting message is read once); returns how many wait."""
        queue = self.broker.queues.get(NAME)
        if queue is None:
            return 0
        for msg in queue.pending:
            try:
                due = int(msg.headers[AT])
            except (KeyError, ValueError):
                due = 0  # unreadable schedule: deliver it now rather than never
            self._heap.append((due, msg.mid))
        heapq.heapify(self._heap)
        self._arm()
        return len(self._heap)

    # -- firing ------------------------------------------------------------------------------
    def _add(self, due: int, mid: int) -> None:
        heapq.heappush(self._heap, (due, mid))
        if self._armed_for is None or due < self._armed_for:
            self._arm()

    def _arm(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._armed_for = None
        if not self._heap:
            return
        due = self._heap[0][0]
        self._armed_for = due
        self._handle = self._call_later(max(0.0, (due - self.broker.now_ms()) / 1000), self.fire)

    def fire(self) -> None:
        """Move what is due (up to a turn's worth, as one journal transaction), then wait for
        the next."""
        self._handle = None
        now = self.broker.now_ms()
        queue = self.broker.queue(NAME)
        moves: list[tuple[str, str, Message]] = []
        taken: list[Message] = []
        again: list[tuple[int, int]] = []
        due_now: list[tuple[int, int]] = []
        while self._heap and self._heap[0][0] <= now and len(due_now) < MAX_FIRES_PER_TURN:
            due_now.append(heapq.heappop(self._heap))
        # taken out in id order (neighbours in the queue's paged blocks), moved in due order
        found = {mid: queue.pending.remove_ordered(mid) for mid in sorted(m for _d, m in due_now)}
        for due, mid in due_now:
            msg = found[mid]
            if msg is None:
                continue  # purged or moved by an admin: cancelled
            try:
                moves += self._moves(queue, msg, due, again)
            except (ProtocolError, ValueError) as exc:
                log.error("scheduled message %s cannot be delivered (%s): dropped",
                          msg.message_id, exc)
            taken.append(msg)
        if taken:
            self.broker.commit(f"sched:{taken[0].mid}", moves, [(queue, taken)], [])
        for entry in again:
            heapq.heappush(self._heap, entry)
        self._arm()

    def _moves(self, queue: Any, msg: Message, due: int, again: list[tuple[int, int]]
               ) -> list[tuple[str, str, Message]]:
        """Where ``msg`` goes now: its destination and, while it repeats, back here."""
        h = msg.headers
        target = h[DESTINATION]
        kind, name = parse_destination(target)
        left = int(h.get(LEFT, "0"))
        body = bytes(self.broker.body_of(msg))
        out = msg.moved_to(target, self.broker.allocate_mid())
        out.body = body
        for key in INTERNAL:
            out.headers.pop(key, None)
        moves: list[tuple[str, str, Message]] = [(kind, name, out)]
        if REDELIVERY in h:  # back to its queue: a redelivery, never a new round
            out.deliveries = int(h[REDELIVERY])
            return moves
        entry = _cron(h)
        base = None
        if left > 0:
            at, left = due + _millis(h, PERIOD), left - 1
        elif entry is not None:  # the round is over: the entry's next time, from now on
            base = cron.next_after(entry, max(int(h.get(CRON_AT, "0")), self.broker.now_ms()))
            at, left = base + _millis(h, DELAY), _millis(h, REPEAT)
        else:
            return moves
        nxt = msg.moved_to(queue.destination, self.broker.allocate_mid())
        nxt.body = body
        nxt.headers[AT] = str(at)
        nxt.headers[LEFT] = str(left)
        if base is not None:
            nxt.headers[CRON_AT] = str(base)
        moves.append((QUEUE, NAME, nxt))
        again.append((at, nxt.mid))
        return moves


def _cron(headers: dict[str, str]) -> cron.Cron | None:
    text = headers.get(CRON)
    if text is None:
        return None
    try:
        return cron.parse(text)
    except ValueError as exc:
        raise ProtocolError(f"invalid {CRON} {text[:60]!r}: {exc}", fatal=False) from None
