"""Spec of core.persistence.storelater: concurrent store and dispatch, in process, on an
injected clock and timer list (no loop, no sleeping).

A deferred message is either acknowledged (and never written) or written when it is due; a
receipt asked for while messages are deferred waits until every one of them has settled (of
its own connection, when it names one);
deferred messages are written oldest first and before any other record of their queue. The
removal of a stored message an ack:auto consumer took is journaled only once its bytes left the
broker's user space (or its connection is gone), and until then it is still its queue's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sluicemq.core.persistence.storelater import AUTO_SECONDS, StoreLater
from sluicemq.core.routing.message import Message
from sluicemq.storage.segment import Location
from sluicemq.storage.store import TicketLike


class Loop:
    """call_soon / call_later / clock, run by hand."""

    def __init__(self) -> None:
        self.now = 100.0
        self.soon: list[Callable[[], None]] = []
        self.timers: list[tuple[float, Callable[[], None]]] = []

    def call_soon(self, fn: Callable[[], None]) -> object:
        self.soon.append(fn)
        return fn

    def call_later(self, delay: float, fn: Callable[[], None]) -> object:
        self.timers.append((self.now + delay, fn))
        return fn

    def run_soon(self) -> None:
        while self.soon:
            self.soon.pop(0)()

    def advance(self, seconds: float) -> None:
        self.now += seconds
        due = [t for t in self.timers if t[0] <= self.now]
        self.timers = [t for t in self.timers if t[0] > self.now]
        for _, fn in sorted(due, key=lambda t: t[0]):
            fn()
        self.run_soon()


class Ticket:
    def __init__(self, seq: int) -> None:
        self.seq = seq
        self.loc: Location | None = None  # never written: a journal's ticket would say where


class Store:
    """What StoreLater asks of the store: appends, holds, removals - recorded."""

    def __init__(self) -> None:
        self.written: list[tuple[str, int, bool]] = []

    def append_message(self, key: str, mid: int, *rest: Any) -> Ticket:
        self.written.append((key, mid, False))
        return Ticket(len(self.written))

    def hold(self, ticket: TicketLike, count: int = 1) -> None:
        pass

    def remove(self, key: str, mid: int, ticket: TicketLike) -> None:
        self.written[ticket.seq - 1] = (key, mid, True)  # its removal follows its record


def make(delay: float = 0.005, max_bytes: int = 1 << 20
         ) -> tuple[StoreLater, Loop, list[tuple[str, int, bool]]]:
    loop = Loop()
    store = Store()
    later = StoreLater(store, 1 << 16, loop.call_soon, loop.call_later,
                       lambda: loop.now, delay=delay, max_bytes=max_bytes)
    return later, loop, store.written


def msg(mid: int, size: int = 100) -> Message:
    return Message(mid, "/queue/q", {}, b"x" * size, persistent=True)


def test_a_message_acknowledged_before_it_is_due_is_never_written() -> None:
    later, loop, written = make()
    m = msg(1)
    later.add("q:q", m)
    later.sent(m, consumer=None, unsent=None)
    assert later.removed(m)  # the consumer's ACK
    loop.advance(1.0)
    assert written == [] and not later.entries
    assert (later.deferred, later.skipped, later.stored) == (1, 1, 0)


def test_an_unacknowledged_message_is_written_when_it_is_due_and_not_before() -> None:
    later, loop, written = make(delay=0.005)
    m = msg(1)
    later.add("q:q", m)
    later.sent(m, consumer=None, unsent=None)
    loop.advance(0.004)
    assert written == []
    loop.advance(0.002)
    assert written == [("q:q", 1, False)]
    assert not later.removed(m)  # its ACK now goes the ordinary way (it has a record)


def test_a_receipt_waits_for_every_message_deferred_before_it() -> None:
    later, _, _ = make()
    a, b = msg(1), msg(2)
    later.add("q:q", a)
    later.add("q:q", b)
    told: list[object] = []
    assert later.wait(told.append)
    later.add("q:q", msg(3))  # deferred after the receipt was asked for: not waited on
    later.removed(b)
    assert told == []
    later.removed(a)
    assert told == [None]


def test_a_connection_s_receipt_waits_only_for_what_that_connection_deferred() -> None:
    later, loop, written = make(delay=0.005)
    theirs, mine, mine_later = msg(1), msg(2), msg(3)
    later.add("q:q", theirs, sender="B")
    later.add("q:q", mine, sender="A")
    told: list[object] = []
    assert not later.wait(told.append, sender="C")  # nothing of C's deferred: at once
    assert later.wait(told.append, sender="A")
    later.add("q:q", mine_later, sender="A")  # after the receipt was asked for: not waited on
    later.removed(mine)  # acknowledged while B's older one is still out
    assert told == [None]
    told.clear()
    assert later.wait(told.append, sender="A")
    loop.advance(0.01)  # due: written oldest first, B's before A's, then the receipt
    assert [mid for _, mid, _ in written] == [1, 3] and told == [None]


def test_a_receipt_with_nothing_deferred_does_not_wait() -> None:
    later, _, _ = make()
    assert not later.wait(lambda exc: None)


def test_a_receipt_is_released_once_its_messages_are_written_instead() -> None:
    later, loop, written = make(delay=0.005)
    later.add("q:q", msg(1))
    told: list[object] = []
    later.wait(told.append)
    loop.advance(0.01)
    assert written == [("q:q", 1, False)] and told == [None]


def test_deferred_messages_are_written_oldest_first_before_another_record_of_their_queue(
        ) -> None:
    later, _, written = make()
    for mid in (1, 2, 3):
        later.add("q:a", msg(mid))
    later.add("q:b", msg(4))
    later.removed(later.entries[next(iter(later.entries))].msg)  # mid 1 was acked
    later.store_all("q:other")  # a record of a queue with nothing deferred: nothing to do
    assert written == []
    later.store_all("q:a")
    assert [mid for _, mid, _ in written] == [2, 3, 4]
    assert not later.entries


def test_more_deferred_bytes_than_the_cap_are_written_at_once_oldest_first() -> None:
    later, _, written = make(max_bytes=250)
    for mid in (1, 2, 3):
        later.add("q:q", msg(mid, size=100))
    assert [mid for _, mid, _ in written] == [1]
    assert later.bytes == 200


def test_an_ack_auto_delivery_settles_once_the_peer_acknowledged_its_bytes() -> None:
    later, loop, written = make(delay=0.005)
    acked = [0]
    m = msg(1)
    later.add("q:q", m)
    later.sent(m, None, (lambda: acked[0], 5000))  # ends at byte 5000
    assert later.removed(m)  # dispatch removed it from the queue: not yet settled
    loop.run_soon()
    assert m in [e.msg for e in later.entries.values()]
    acked[0] = 4999
    loop.advance(0.01)  # past the store delay: an auto delivery is given longer
    assert written == []
    acked[0] = 5000
    loop.advance(0.001)
    assert written == [] and not later.entries and later.skipped == 1


def test_an_ack_auto_delivery_whose_bytes_stay_unread_is_written_with_its_removal() -> None:
    later, loop, written = make(delay=0.005)
    m = msg(1)
    later.add("q:q", m)
    later.sent(m, None, (lambda: 0, 5000))
    later.removed(m)
    loop.advance(AUTO_SECONDS + 0.01)
    assert written == [("q:q", 1, True)]  # stored, and its removal journaled behind it


def test_a_large_body_for_a_client_ack_consumer_is_due_a_delay_after_its_bytes_arrived(
        ) -> None:
    later, loop, written = make(delay=0.005)  # spill_bytes 64 KiB: this body is large
    acked = [0]
    m = msg(1, size=1 << 20)
    later.add("q:q", m)
    later.sent(m, None, (lambda: acked[0], 5 << 20), auto=False)
    loop.advance(0.01)  # past the store delay, but still on its way behind earlier bytes
    assert written == []
    acked[0] = 5 << 20  # the consumer's TCP has it all: its ACK is now due within the delay
    loop.advance(0.001)
    loop.advance(0.003)
    assert written == []
    loop.advance(0.002)
    assert written == [("q:q", 1, False)]


def test_a_large_body_acked_soon_after_it_arrived_is_never_written() -> None:
    later, loop, written = make(delay=0.005)
    acked = [0]
    m = msg(1, size=1 << 20)
    later.add("q:q", m)
    later.sent(m, None, (lambda: acked[0], 1 << 20), auto=False)
    told: list[object] = []
    later.wait(told.append)  # the producer's receipt
    loop.advance(0.008)
    acked[0] = 1 << 20
    loop.advance(0.002)
    assert later.removed(m)  # the consumer's ACK
    assert told == [None]
    loop.advance(1.0)
    assert written == [] and later.skipped == 1


def test_a_large_body_whose_bytes_never_arrive_is_written_after_the_auto_limit() -> None:
    later, loop, written = make(delay=0.005)
    m = msg(1, size=1 << 20)
    later.add("q:q", m)
    later.sent(m, None, (lambda: 0, 1 << 20), auto=False)
    loop.advance(AUTO_SECONDS - 0.01)
    assert written == []
    loop.advance(0.02)
    assert written == [("q:q", 1, False)]


def test_a_small_body_for_a_client_ack_consumer_is_due_a_delay_after_publication() -> None:
    later, loop, written = make(delay=0.005)
    m = msg(1, size=100)
    later.add("q:q", m)
    later.sent(m, None, (lambda: 0, 100), auto=False)  # bytes not out: no matter below 64 KiB
    loop.advance(0.006)
    assert written == [("q:q", 1, False)]


def test_where_the_peer_cannot_say_what_it_has_a_large_body_is_due_a_delay_after_the_send(
        ) -> None:
    later, loop, written = make(delay=0.005)
    m = msg(1, size=1 << 20)
    later.add("q:q", m)
    later.sent(m, None, (lambda: -1, 1 << 20), auto=False)  # e.g. TLS, a closed connection
    loop.advance(0.001)
    assert written == []
    loop.advance(0.005)
    assert written == [("q:q", 1, False)]


# -- stored messages an ack:auto consumer took: their removal waits for their bytes ----------
class Removals(Store):
    """A store that records the ids of the messages whose removal was journaled."""

    def __init__(self) -> None:
        super().__init__()
        self.removed: list[int] = []

    def remove(self, key: str, mid: int, ticket: TicketLike) -> None:
        self.removed.append(mid)


def make_held() -> tuple[StoreLater, Loop, list[int]]:
    loop = Loop()
    store = Removals()
    later = StoreLater(store, 1 << 16, loop.call_soon, loop.call_later, lambda: loop.now,
                       delay=0.005)
    return later, loop, store.removed


def stored(mid: int) -> Message:
    m = msg(mid)
    m.ticket = Ticket(mid)  # journaled before it was handed over
    return m


def test_a_stored_message_auto_acked_is_removed_only_once_its_bytes_left_user_space() -> None:
    later, loop, removed = make_held()
    out = [100]  # bytes of the connection handed to the kernel so far
    run = [stored(1), stored(2)]
    later.remove_when_written("q:q", run, (lambda: out[0], 300))  # their frames end at 300
    loop.run_soon()
    loop.advance(0.05)
    assert removed == [] and later.unwritten == 2
    assert later.unwritten_of() == {"q:q": run}  # still the queue's, for snapshots
    out[0] = 300
    loop.advance(0.05)
    assert removed == [1, 2] and later.unwritten == 0 and later.unwritten_of() == {}


def test_removals_are_looked_at_right_after_the_delivery_turn_not_a_timer_later() -> None:
    later, loop, removed = make_held()
    later.remove_when_written("q:q", [stored(1)], (lambda: 500, 300))  # the flush wrote it
    loop.run_soon()
    assert removed == [1]


def test_each_connection_s_removals_wait_for_its_own_bytes() -> None:
    later, loop, removed = make_held()
    a, b = [0], [0]
    later.remove_when_written("q:a", [stored(1)], (lambda: a[0], 100))
    later.remove_when_written("q:b", [stored(2)], (lambda: b[0], 100))
    b[0] = 100
    loop.run_soon()
    assert removed == [2] and list(later.unwritten_of()) == ["q:a"]
    a[0] = 100
    loop.advance(0.05)
    assert removed == [2, 1]


def test_a_closed_connection_releases_its_removals() -> None:
    """-1: the connection is gone; in memory the messages were consumed when handed over."""
    later, loop, removed = make_held()
    later.remove_when_written("q:q", [stored(1)], (lambda: -1, 300))
    loop.run_soon()
    assert removed == [1]


def test_where_the_transport_cannot_say_the_removal_is_journaled_at_once() -> None:
    later, _, removed = make_held()
    later.remove_when_written("q:q", [stored(1), stored(2)], None)
    assert removed == [1, 2] and later.unwritten == 0


def test_release_written_journals_what_is_out_and_keeps_the_rest() -> None:
    """What an index snapshot calls first: it then keeps only the unwritten ones."""
    later, _, removed = make_held()
    later.remove_when_written("q:q", [stored(1)], (lambda: 300, 200))
    later.remove_when_written("q:q", [stored(2)], (lambda: 300, 400))
    later.release_written()
    assert removed == [1] and [m.mid for m in later.unwritten_of()["q:q"]] == [2]


def test_a_clean_stop_journals_every_held_back_removal() -> None:
    """In memory they were consumed when handed over: none may come back after the restart,
    behind messages consumed after it."""
    later, _, removed = make_held()
    later.remove_when_written("q:q", [stored(1), stored(2)], (lambda: 0, 400))
    later.release_all()
    assert removed == [1, 2] and later.unwritten == 0 and later.unwritten_of() == {}


class Shares:
    """The per-user share's book as the store keeps it (``UserShares``): mid -> bytes."""

    def __init__(self) -> None:
        self.held: dict[int, int] = {}

    def charge(self, owner: bytes, mid: int, size: int, holds: int) -> None:
        assert mid not in self.held, "charged twice"
        self.held[mid] = size

    def release(self, mid: int) -> None:
        self.held.pop(mid, None)

    def release_run(self, mids: Any) -> None:
        for mid in mids:
            self.release(mid)


class ChargingStore(Store):
    """A store that charges the share as it appends a message (``Store.append_message``)."""

    def __init__(self, shares: Shares) -> None:
        super().__init__()
        self.shares = shares

    def append_message(self, key: str, mid: int, *rest: Any) -> Ticket:
        self.shares.charge(b"", mid, len(rest[4]), 1)
        return super().append_message(key, mid, *rest)


def test_a_deferred_message_takes_its_room_from_the_send() -> None:
    """Counted in ``bytes`` (the store's use) and reserved in its sender's share at once;
    an ACK before the write gives both back, and a write hands the share's charge to the
    store's append (charged once, never twice)."""
    loop, shares = Loop(), Shares()
    later = StoreLater(ChargingStore(shares), 1 << 16, loop.call_soon, loop.call_later,
                       lambda: loop.now, delay=0.005)
    later.shares = shares
    acked, kept = msg(1, 300), msg(2, 500)
    for m in (acked, kept):
        later.add("q:q", m)
        later.sent(m, consumer=None, unsent=None)
    assert later.bytes == 800 and shares.held == {1: 300, 2: 500}
    assert later.removed(acked)
    assert later.bytes == 500 and shares.held == {2: 500}
    loop.advance(0.01)
    assert later.bytes == 0 and shares.held == {2: 500}  # now the record's charge
