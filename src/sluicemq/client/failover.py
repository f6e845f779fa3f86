"""What a client keeps to survive a failover: the public events and errors, and the bounded
memories of messages acknowledged or delivered across it.

After the connection to the master is lost, a client with a ``failover:`` URL connects to the
next broker, replays its subscriptions (same ids, ack modes, durable names) and re-sends, in
their original order and under their original producer numbers, every SEND whose RECEIPT it
never got. The broker's duplicate detection drops those it had stored already, so nothing is
lost and nothing is stored twice. Transactions open at the failure are lost (the broker rolled
them back) and say so with `TransactionRolledBack`. The bookkeeping lives in
client/tracker.py, the schedule in client/reconnect.py; both are sans-IO.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from sluicemq.errors import ClientError

W = TypeVar("W")


class TransactionRolledBack(ClientError):
    """The connection failed over while this transaction was open (or its COMMIT was in
    flight): the broker rolled it back (or, for a COMMIT in flight, may have committed it).
    Retry the whole transaction; numbered sends inside it are dropped at COMMIT if stored."""

    def __init__(self, transaction: str, detail: str = "") -> None:
        super().__init__(f"transaction {transaction} was open when the connection failed over "
                         f"and was rolled back{detail}; retry it")
        self.transaction = transaction


class AckInDoubt(ClientError):
    """An ACK the broker cannot confirm because the connection failed over: it was in flight
    when the connection was lost, or the message came before the failover. Either the old
    master stored it, or the new one redelivers the message - and then this client
    acknowledges the copy itself instead of handing it out again. Treat the message as
    processed; do not retry the ACK."""

    def __init__(self, message_id: str, to_url: str = "") -> None:
        super().__init__(f"the ACK of message {message_id} could not be confirmed: the "
                         f"connection failed over{f' to {to_url}' if to_url else ''}; "
                         "a redelivered copy is acknowledged by the client")
        self.message_id = message_id


@dataclass(slots=True)
class PendingSend(Generic[W]):
    """A receipted SEND not yet confirmed: everything needed to send it again identically."""

    destination: str
    body: bytes | str
    headers: dict[str, str]  # as sent, producer id and number included
    persistent: bool
    waiter: W | None = None  # the caller's receipt waiter, resolved by whichever copy answers


@dataclass(frozen=True, slots=True)
class FailoverEvent:
    """Told to ``on_failover`` (and logged) once a new connection is up and replayed."""

    from_url: str
    to_url: str
    downtime: float  # seconds from the loss to the replayed connection
    attempts: int  # connection attempts it took
    resent: int  # unconfirmed SENDs sent again
    resubscribed: int
    rolled_back: tuple[str, ...] = field(default_factory=tuple)  # open transactions lost


FailoverCallback = Callable[[FailoverEvent], None]


class Settleable(Protocol):
    """A receipt waiter: concurrent.futures.Future and asyncio.Future both are."""

    def done(self) -> bool: ...
    def set_result(self, result: Any, /) -> None: ...
    def set_exception(self, exception: BaseException, /) -> None: ...


def resolve(waiter: Settleable | None, outcome: object) -> None:
    """Settle a receipt waiter with headers or an error, unless it is settled already."""
    if waiter is None or waiter.done():
        return
    if isinstance(outcome, BaseException):
        waiter.set_exception(outcome)
    else:
        waiter.set_result(outcome)


def range_read_lost(url: str) -> ClientError:
    return ClientError(f"range read interrupted: the connection to {url} failed over; "
                       "read the range again")


def reader_stopped(exc: Exception) -> ClientError:
    """What ends a client whose reader met something it cannot handle (a bug, or the
    ``on_failover`` callback raising): every waiter and every later call gets this at once,
    instead of its own timeout - nobody reads their receipts any more."""
    error = ClientError(f"the client's reader stopped: {exc!r}")
    error.__cause__ = exc
    return error


class EarlyAcks:
    """Messages the caller acknowledged after (or while) the connection that delivered them
    was lost.

    Such an ACK cannot be sent (the new broker would read the old ack id as one of its own
    deliveries), yet the caller has processed the message: when the new broker redelivers it
    (same subscription, same message-id), the client acknowledges it at once instead of
    handing it out again, so a failover duplicates nothing the caller already acknowledged.
    Bounded: the oldest are forgotten past ``limit`` (a broker that had the ACK before it
    died never redelivers those).
    """

    def __init__(self, limit: int = 65_536) -> None:
        self.limit = limit
        self._keys: dict[tuple[str, str], None] = {}

    def note(self, subscription: str, message_id: str) -> None:
        self._keys[(subscription, message_id)] = None
        if len(self._keys) > self.limit:
            del self._keys[next(iter(self._keys))]

    def take(self, subscription: str, message_id: str | None) -> bool:
        """Is this delivery one the caller already acknowledged? (Forgets it.)"""
        if message_id is None or not self._keys:
            return False
        return self._keys.pop((subscription, message_id), 0) is None


class Unacked:
    """Messages delivered to this client and not yet acknowledged, per subscription, so that
    after a failover their redelivery says ``redelivered:true`` (the new master cannot know
    the old one handed them out). Bounded like `EarlyAcks`; ``client`` mode acknowledges
    cumulatively, as the broker does."""

    def __init__(self, limit: int = 65_536) -> None:
        self.limit = limit
        self._subs: dict[str, dict[str, None]] = {}
        self._size = 0
        self._marked: set[tuple[str, str]] = set()  # delivered before the last failover

    def delivered(self, subscription: str, message_id: str) -> None:
        ids = self._subs.setdefault(subscription, {})
        if message_id in ids:
            return
        ids[message_id] = None
        self._size += 1
        if self._size > self.limit:  # forget the oldest of the largest subscription
            largest = max(self._subs.values(), key=len)
            del largest[next(iter(largest))]
            self._size -= 1

    def settled(self, subscription: str, message_id: str, cumulative: bool) -> None:
        """An ACK or NACK went out for this message (and, cumulative, for all before it)."""
        ids = self._subs.get(subscription)
        if not ids or message_id not in ids:
            return
        if not cumulative:
            del ids[message_id]
            self._size -= 1
            return
        while ids:
            first = next(iter(ids))
            del ids[first]
            self._size -= 1
            if first == message_id:
                break

    def failed_over(self) -> None:
        """Everything still unacknowledged comes back redelivered on the next connection."""
        self._marked = {(sub, mid) for sub, ids in self._subs.items() for mid in ids}
        self._subs.clear()
        self._size = 0

    def forget(self, subscription: str) -> None:
        ids = self._subs.pop(subscription, None)
        if ids:
            self._size -= len(ids)

    def was_delivered(self, subscription: str, message_id: str) -> bool:
        """Did an earlier connection deliver this one? (Asked once per redelivery.)"""
        if not self._marked:
            return False
        try:
            self._marked.remove((subscription, message_id))
        except KeyError:
            return False
        return True
