"""Scheduled delivery the ActiveMQ way: ``AMQ_SCHEDULED_DELAY``, ``_PERIOD`` and ``_REPEAT``.

Where a scheduled message waits: in the broker's own queues ``sluice.scheduled`` (due in
more than a minute) and ``sluice.scheduled.<second>`` (due in that second), filed by due time
(core/scheduling/calendar.py), stored and paged like any other message - a persistent one is
in the journal before its RECEIPT, a restart keeps the schedule, and a million waiting
messages cost their index slots in memory, not their bodies. Its headers say where it goes
(``sluice-scheduled-destination``), when (``sluice-scheduled-at``, ms since the epoch) and how
many repetitions are left.

When it is due it moves in one journal transaction: removed from its queue, a copy under a
fresh id stored at its destination and, if it repeats, the next repetition filed again - so a
crash at any moment neither loses a scheduled message nor delivers one twice. A persistent
due message whose destination is at its policy's ``store_limit`` (or, when its move adds a
message - a repetition follows - at the broker's store limit) does not move: it stays set aside
in its bucket (stored, listed, cancellable) and waits in its destination's line, behind which
every later due message to that destination waits too (due order kept); it moves once the
destination has room (flow control's poll says so), while other destinations' messages go on
time. Without this a scheduled burst overshot the limit when it came due.

What waits here for a destination with a ``store_limit`` counts against it from the SEND on:
the scheduler keeps each such destination's tally of persistent scheduled bytes
(``Broker.scheduled_bytes``: filed at SEND, redelivery, refiling and a repetition; out when a
message leaves its queue for good - moved when due, refiled, cancelled through the admin API;
rebuilt at recovery), and producer flow control adds it to the destination's ready bytes, so
a SEND, scheduled or not, waits (or gets the ERROR of ``fail_if_no_space``) once ready plus
scheduled bytes reach the cap. A due move then only turns scheduled bytes into ready ones;
what still meets the cap when due is a repetition's copy (one scheduled copy, many ready
ones) or a cap lowered across a restart. Nobody may
send to, subscribe to or read the ``sluice.scheduled`` queues directly; the admin API lists
and purges them like any queue (that cancels what it removes).

``AMQ_SCHEDULED_CRON`` (core/scheduling/cron.py) combines with the others as in ActiveMQ: at
each time the entry names, the message goes after ``AMQ_SCHEDULED_DELAY``, then
``AMQ_SCHEDULED_REPEAT`` more times ``AMQ_SCHEDULED_PERIOD`` apart; then it waits for the
entry's next time (counted from when the last copy went), for ever or until cancelled. The
entry's current time rides in a header (``sluice-scheduled-cron-at``), so a restart keeps it.
A scheduled SEND in a transaction or to several destinations at once gets an ERROR.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sluicemq.core.routing import keys
from sluicemq.core.routing.names import QUEUE, parse_destination
from sluicemq.core.scheduling import cron
from sluicemq.core.scheduling.calendar import NAME, Calendar, bucket_of_name, is_scheduler_queue
from sluicemq.core.scheduling.redelivery import redelivery_delay
from sluicemq.core.streams.chunks import is_chunk
from sluicemq.errors import ProtocolError

if TYPE_CHECKING:
    from sluicemq.core.routing.broker import Broker
    from sluicemq.core.routing.message import Message

log = logging.getLogger(__name__)

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
MAX_FIRES_PER_TURN = 64  # as many as one dispatch turn delivers (dispatchpass.DISPATCH_BUDGET)
MAX_READS_PER_TURN = 256  # messages read out of a bucket per loop turn
_MAX_MS = 10 * 365 * 24 * 3600 * 1000  # ten years: anything longer is surely a mistake

Timer = Callable[[float, Callable[[], None]], Any]  # loop.call_later


def asks_for_schedule(headers: dict[str, str]) -> bool:
    """Whether a SEND carries any of ActiveMQ's scheduling headers."""
    return not headers.keys().isdisjoint(HEADERS)  # in C: every SEND asks


def refuse_direct(kind: str, name: str) -> None:
    """``sluice.scheduled`` belongs to the broker: clients reach it only through the headers."""
    if kind == QUEUE and is_scheduler_queue(name):
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

    def __init__(self, broker: Broker, call_later: Timer, *, enabled: bool = True,
                 horizon_ms: int = 60_000) -> None:
        self.broker = broker
        self.enabled = enabled
        self._call_later = call_later
        self.calendar = Calendar(horizon_ms)
        self._armed_for: int | None = None
        self._handle: Any = None
        # destination -> its due messages waiting for room, (due, id, bucket) in due order
        self._lines: dict[str, deque[tuple[int, int, Any]]] = {}
        self._watched: set[str] = set()  # destinations whose room flow control watches for us
        self._room_came = False  # a line's destination got room during this turn
        # mid -> (destination, body bytes) of each message in the tally (module doc)
        self._parked: dict[int, tuple[tuple[str, str], int]] = {}

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
        now = self.broker.now_ms()
        due = now + delay
        if entry is not None:
            base = cron.next_after(entry, now)
            h[CRON_AT] = str(base)
            due = base + delay
        h[DESTINATION] = msg.destination
        h[AT] = str(due)
        h[LEFT] = str(repeat)
        where = self.calendar.place(due, now)
        msg.destination = f"/queue/{where}"
        self.broker.publish(QUEUE, where, msg)
        self._park(msg)
        self._filed(where, due, msg.mid)
        return True

    def redeliver(self, queue: Any, msgs: list[Message]) -> list[Message]:
        """Messages given back to ``queue`` (NACK, consumer gone) wait out its policy's
        redelivery delay here: one journal transaction takes them off the queue and files
        them; when due they go to the queue's tail with their delivery count (ActiveMQ's
        redelivery plugin). Returns the ones to redeliver at once: the scheduler is off, a
        topic subscription's, a stream chunk, no delay due."""
        if (not self.enabled or not keys.is_queue(queue.key)
                or is_scheduler_queue(keys.name_of(queue.key))):
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
            where = self.calendar.place(now + delay, now)
            copy = msg.moved_to(f"/queue/{where}", self.broker.allocate_mid())
            copy.body = bytes(self.broker.body_of(msg))
            copy.headers.update({DESTINATION: queue.destination, AT: str(now + delay),
                                 LEFT: "0", REDELIVERY: str(msg.deliveries)})
            parked.append(msg)
            copies.append((QUEUE, where, copy))
        if parked:
            self.broker.commit(f"redeliver:{copies[0][2].mid}", copies, [(queue, parked)], [])
            for _kind, where, copy in copies:
                self._park(copy)
                self._filed(where, int(copy.headers[AT]), copy.mid)
        return at_once

    def recover(self) -> int:
        """After the broker recovered: know every bucket again by its name, and read the far
        queue once for its (due, id) entries; returns how many wait."""
        waiting = 0
        capped = self._any_cap()
        for name, queue in list(self.broker.queues.items()):
            bucket = bucket_of_name(name)
            if bucket is not None:
                waiting += len(queue.pending)
                for msg in queue.pending if capped else ():
                    self._park(msg)
                self._filed(name, bucket * 1000, 0)
            elif name == NAME:
                for msg in queue.pending:
                    self.calendar.filed(NAME, _due(msg), msg.mid)
                    if capped:
                        self._park(msg)
                    waiting += 1
                queue.on_removed = self._left
        self._arm()
        return waiting

    # -- the tally of scheduled bytes per capped destination ----------------------------------
    def _any_cap(self) -> bool:
        """Whether any destination may have a ``store_limit`` (else recovery reads no bucket)."""
        config = self.broker.config
        return bool(config.policy.store_limit) or any(
            entry.overrides.get("store_limit") for entry in config.policies)

    def _park(self, msg: Message) -> None:
        """Count ``msg``, just filed in one of the scheduler's queues, in its destination's
        tally if it is persistent and the destination has a ``store_limit``."""
        if not msg.persistent:
            return
        try:
            target = parse_destination(msg.headers.get(DESTINATION))
        except (ProtocolError, ValueError):
            return  # _moves says why it cannot go
        if not self.broker.policy(*target).store_limit:
            return
        self._parked[msg.mid] = (target, msg.size)
        tally = self.broker.scheduled_bytes
        tally[target] = tally.get(target, 0) + msg.size

    def _left(self, msgs: list[Message]) -> None:
        """Messages gone from a scheduler's queue for good (``Queue.on_removed``: moved when
        due, refiled, cancelled through the admin API): out of their destination's tally."""
        parked, tally = self._parked, self.broker.scheduled_bytes
        for msg in msgs:
            entry = parked.pop(msg.mid, None)
            if entry is not None:
                target, size = entry
                left = tally[target] - size
                if left > 0:
                    tally[target] = left
                else:
                    del tally[target]

    def tallied(self) -> int:
        """Messages counted in the tally (metrics, specs)."""
        return len(self._parked)

    # -- firing ------------------------------------------------------------------------------
    def _filed(self, where: str, due: int, mid: int) -> None:
        queue = self.broker.queues.get(where)
        if queue is not None:  # (made, or made again after an admin delete, by its first message)
            queue.on_removed = self._left
        self.calendar.filed(where, due, mid)
        wake = self.calendar.wake_at()
        if wake is not None and (self._armed_for is None or wake < self._armed_for):
            self._arm()

    def _arm(self, at_once: bool = False) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._armed_for = None
        wake = self.calendar.wake_at()
        if wake is None and not at_once:
            return
        now = self.broker.now_ms()
        if at_once or wake is None:
            self._armed_for = now
            self._handle = self._call_later(0.0, self.fire)
        else:
            self._armed_for = wake
            self._handle = self._call_later(max(0.0, (wake - now) / 1000), self.fire)

    def fire(self) -> None:
        """One turn: read buckets whose time has come, move what is due (one journal
        transaction), refile far messages whose time has come; yield between turns."""
        self._handle = None
        self._room_came = False
        now = self.broker.now_ms()
        busy = self._read_buckets(now)
        busy |= self._move_due(now)
        busy |= self._refile(now)
        self._arm(at_once=busy or self._room_came)  # (room may come within the turn's commit)

    def _read_buckets(self, now: int) -> bool:
        """Read due buckets front to back into RAM (each message waits there until due);
        True if the turn's budget ran out first."""
        budget = MAX_READS_PER_TURN
        while (bucket := self.calendar.bucket_to_read(now)) is not None:
            queue = self.broker.queues.get(f"{NAME}.{bucket}")
            while queue is not None and budget > 0 and (msg := queue.pending.pop()) is not None:
                queue.pending.set_aside(msg)  # still the bucket's: counted, cancellable
                self.calendar.hold(_due(msg), msg.mid, queue)
                budget -= 1
            if budget <= 0:
                return True
            self.calendar.bucket_read(bucket)
        return False

    def _move_due(self, now: int) -> bool:
        """Move what is due (one journal transaction): first the messages waiting in a
        destination's line while it has room, then the newly due, each behind its
        destination's line if there is one. True if the turn's budget ran out."""
        budget = MAX_FIRES_PER_TURN
        picked: list[tuple[int, Any, Message]] = []
        added: dict[str, int] = {}  # body bytes this turn moves to each destination
        for target in list(self._lines):
            line = self._lines[target]
            while line and len(picked) < budget:
                due, mid, queue = line[0]
                msg = queue.pending.aside.get(mid)
                if msg is not None and self._no_room(target, msg, added) is not None:
                    break
                line.popleft()
                if msg is not None:  # (None: removed through the admin API: cancelled)
                    picked.append((due, queue, msg))
            if not line:
                del self._lines[target]
        room_left = budget - len(picked)
        due_now = self.calendar.due(now, room_left)
        for due, mid, queue in due_now:
            msg = queue.pending.aside.get(mid)
            if msg is None:
                continue  # removed through the admin API meanwhile: cancelled
            target = msg.headers.get(DESTINATION, "")
            if target not in self._lines and self._no_room(target, msg, added) is None:
                picked.append((due, queue, msg))
            else:
                self._lines.setdefault(target, deque()).append((due, mid, queue))
        self._watch()
        moves: list[tuple[str, str, Message]] = []
        taken: dict[int, tuple[Any, list[Message]]] = {}
        follow: list[tuple[str, int, Message]] = []
        for due, queue, msg in picked:
            queue.pending.take_aside(msg.mid)
            try:
                moves += self._moves(msg, due, now, follow)
            except (ProtocolError, ValueError) as exc:
                log.error("scheduled message %s cannot be delivered (%s): dropped",
                          msg.message_id, exc)
            taken.setdefault(id(queue), (queue, []))[1].append(msg)
        if taken:
            first = next(iter(taken.values()))[1][0]
            self.broker.commit(f"sched:{first.mid}", moves, list(taken.values()), [])
        for where, at, nxt in follow:
            self._park(nxt)
            self._filed(where, at, nxt.mid)
        return len(picked) >= budget or 0 < room_left <= len(due_now)

    def _no_room(self, target: str, msg: Message, added: dict[str, int]) -> str | None:
        """Why ``msg`` cannot move to ``target`` now (its store limits, as a persistent
        SEND meets them; ``added``: bytes this turn already moves there, counted and
        updated), or None. A one-off move stores its message in place of the scheduled
        copy, so only one that repeats meets the broker-wide store limit: holding the rest
        could leave a store full of due messages that nothing drains."""
        if not msg.persistent:
            return None  # store limits count persistent messages
        try:
            kind, name = parse_destination(target)
        except (ProtocolError, ValueError):
            return None  # _moves says why it cannot go
        broker = self.broker
        if kind == QUEUE:
            q = broker.queues.get(name)
            held = q.pending.held if q is not None else 0
        else:
            t = broker.topics.get(name)
            held = max((s.pending.held for s in t.subscribers.values()), default=0) \
                if t is not None else 0
        h = msg.headers
        repeats = h.get(LEFT, "0") not in ("0", "") or CRON in h
        reason = broker.flow.store_refusal(broker.policy(kind, name),
                                           held + added.get(target, 0), whole=repeats)
        if reason is None:
            added[target] = added.get(target, 0) + msg.size
        return reason

    def _watch(self) -> None:
        """Ask flow control to wake the scheduler once a waiting line's destination has room
        for its first message (after a dispatch pass or tick; no polling here)."""
        for target in self._lines.keys() - self._watched:
            self._watched.add(target)

            def recheck(target: str = target) -> str | None:
                line = self._lines.get(target)
                while line and line[0][2].pending.aside.get(line[0][1]) is None:
                    line.popleft()  # cancelled meanwhile
                return None if not line else self._no_room(
                    target, line[0][2].pending.aside[line[0][1]], {})

            def resume(target: str = target) -> None:
                self._watched.discard(target)
                self._room_came = True
                self._arm(at_once=True)

            self.broker.flow.wait(recheck, resume, producer=False)

    def waiting_for_room(self) -> int:
        """Due messages waiting for their destination's room (metrics, specs)."""
        return sum(len(line) for line in self._lines.values())

    def _refile(self, now: int) -> bool:
        """Far messages whose bucket is near move into it (one journal transaction)."""
        entries = self.calendar.to_refile(now, MAX_FIRES_PER_TURN)
        if not entries:
            return False
        far = self.broker.queue(NAME)
        moves: list[tuple[str, str, Message]] = []
        taken: list[Message] = []
        for mid in entries:  # (in id order, as remove_ordered wants)
            msg = far.pending.remove_ordered(mid)
            if msg is None:
                continue  # purged or moved by an admin: cancelled
            where = self.calendar.place(_due(msg), now)
            copy = msg.moved_to(f"/queue/{where}", self.broker.allocate_mid())
            copy.body = bytes(self.broker.body_of(msg))
            moves.append((QUEUE, where, copy))
            taken.append(msg)
        if taken:
            self.broker.commit(f"refile:{taken[0].mid}", moves, [(far, taken)], [])
            for _kind, where, copy in moves:
                self._park(copy)
                self._filed(where, _due(copy), copy.mid)
        return len(entries) >= MAX_FIRES_PER_TURN

    def _moves(self, msg: Message, due: int, now: int, follow: list[tuple[str, int, Message]]
               ) -> list[tuple[str, str, Message]]:
        """Where ``msg`` goes now: its destination and, while it repeats, back to be filed."""
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
            base = cron.next_after(entry, max(int(h.get(CRON_AT, "0")), now))
            at, left = base + _millis(h, DELAY), _millis(h, REPEAT)
        else:
            return moves
        where = self.calendar.place(at, now)
        nxt = msg.moved_to(f"/queue/{where}", self.broker.allocate_mid())
        nxt.body = body
        nxt.headers[AT] = str(at)
        nxt.headers[LEFT] = str(left)
        if base is not None:
            nxt.headers[CRON_AT] = str(base)
        moves.append((QUEUE, where, nxt))
        follow.append((where, at, nxt))
        return moves


def _due(msg: Message) -> int:
    try:
        return int(msg.headers[AT])
    except (KeyError, ValueError):
        return 0  # unreadable schedule: deliver it now rather than never


def _cron(headers: dict[str, str]) -> cron.Cron | None:
    text = headers.get(CRON)
    if text is None:
        return None
    try:
        return cron.parse(text)
    except ValueError as exc:
        raise ProtocolError(f"invalid {CRON} {text[:60]!r}: {exc}", fatal=False) from None
