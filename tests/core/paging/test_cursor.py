"""Spec of the store cursor (PendingList + Pager): a bounded in-memory window over a backlog
that lives in the journal (persistent) or in temp files (non-persistent)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from journal_harness import JournalHarness
from sluicemq.core.paging.cursor import PendingList
from sluicemq.core.paging.flow import MemoryAccount
from sluicemq.core.paging.pager import Pager
from sluicemq.core.paging.spill import JOURNAL, OBJ
from sluicemq.core.routing.message import Message
from sluicemq.storage import records
from sluicemq.storage.tempstore import TempStore

DEST = "/queue/q"


class Harness(JournalHarness):
    """A real journal and store, a temp store and the pager over them."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory, segment_bytes=256 << 10)
        self.temp = TempStore(directory / "tmp", file_bytes=64 << 10)
        self.pager = Pager(self.store, self.temp, spill_bytes=64 << 10)
        self.next_mid = 1

    def message(self, body: bytes = b"x" * 100, *, persistent: bool = True,
                priority: int = 4, headers: dict[str, str] | None = None) -> Message:
        mid = self.next_mid
        self.next_mid += 1
        msg = Message(mid, DEST, dict(headers or {"n": str(mid)}), body,
                      persistent=persistent, priority=priority, timestamp=mid)
        if persistent:
            msg.ticket = self.store.append_message("q:q", mid, mid, 0, priority, msg.headers,
                                                   body)
            msg.inner = 0
            self.store.hold(msg.ticket)
        return msg

    def settle(self) -> None:
        """Deferred work done, everything durable, and the pager told so."""
        super().settle()
        self.pager.settle(self.store.durable_seq)

    def close(self) -> None:
        self.temp.close()
        self.store.close()


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path)
    yield harness
    harness.close()


def drain(pending: PendingList) -> list[Message]:
    out = []
    while (m := pending.pop()) is not None:
        out.append(m)
    return out


def fan_out(h: Harness, account: MemoryAccount, count: int, sent: list[Message]
            ) -> list[PendingList]:
    """``count`` subscriptions (window 1) on one budget, each pushed a copy of every message
    of ``sent`` in turn, as a topic publishes."""
    subs = [PendingList(h.pager, destination=DEST, window=1, account=account)
            for _ in range(count)]
    for m in sent:
        for pending in subs:
            pending.push(m.copy_for(m.destination))
    return subs


def test_a_consumer_that_keeps_up_is_served_from_memory_without_paging(h: Harness) -> None:
    pending = PendingList(h.pager, destination=DEST, window=10)
    for _ in range(5):
        msg = h.message()
        pending.push(msg)
        assert pending.pop() is msg  # the very object: nothing was paged out and read back
    assert h.pager.paged_out == h.pager.paged_in == 0


def test_beyond_the_window_messages_are_paged_out_and_come_back_in_order(h: Harness) -> None:
    pending = PendingList(h.pager, destination=DEST, window=10)
    sent = [h.message(b"body-%d" % i) for i in range(1000)]
    h.settle()
    for m in sent:
        pending.push(m)
    h.settle()
    assert len(pending) == 1000
    assert pending.paged == 990 and pending.memory < 11 * 1200
    got = drain(pending)
    assert [m.mid for m in got] == [m.mid for m in sent]
    assert [m.body for m in got] == [m.body for m in sent]
    assert all(m.headers == {"n": str(m.mid)} and m.destination == DEST for m in got)
    assert len(pending) == 0 and pending.memory == 0 and pending.stored_bytes == 0


def test_a_refill_mixing_every_kind_of_slot_keeps_the_order_and_a_bad_record_costs_itself(
        h: Harness) -> None:
    """A batch paged back in holds journal slots (read together), temp slots, objects whose
    record is not durable yet and transaction records; a journal record damaged on disk
    is found in that batch, dropped alone, and the rest come back in order."""
    pending = PendingList(h.pager, destination=DEST, window=50)
    sent = [h.message(b"body-%d" % i) for i in range(300)]
    h.settle()
    sent += [h.message(b"late-%d" % i) for i in range(3)]  # not durable when pushed: objects
    sent += [h.message(b"np-%d" % i, persistent=False) for i in range(3)]  # temp slots
    payload = records.encode_message("q:q", 900, 0, 0, 4, {"n": "900"}, b"tx")
    ticket = h.store.append_tx("t1", [(records.MSG, payload)], final=True)
    in_tx = Message(900, DEST, {"n": "900"}, b"tx", persistent=True)
    in_tx.ticket, in_tx.inner = ticket, records.tx_op_offsets("t1", [(records.MSG, payload)])[0]
    h.store.hold(ticket)
    sent.append(in_tx)
    sent += [h.message(b"more-%d" % i) for i in range(100)]
    for m in sent:
        pending.push(m)
    h.settle()
    bad = sent[120]
    loc = bad.ticket.loc
    with open(h.journal.segment_path(loc.segment), "r+b") as seg:
        seg.seek(loc.offset + loc.length)  # within the record: its body's last bytes
        seg.write(b"\xff")
    got = drain(pending)
    assert [m.mid for m in got] == [m.mid for m in sent if m is not bad]
    assert [m.body for m in got] == [m.body for m in sent if m is not bad]
    assert len(pending) == 0 and pending.stored_bytes == 0


def test_records_not_yet_durable_wait_as_objects_then_become_compact_slots(h: Harness) -> None:
    pending = PendingList(h.pager, destination=DEST, window=1)
    first, second = h.message(), h.message()
    pending.push(first)
    pending.push(second)  # beyond the window, but its record may not be on disk yet
    tail = pending._lanes[4].tail
    assert tail.src_at(tail.end - 1) == OBJ
    h.settle()
    assert tail.src_at(tail.end - 1) == JOURNAL and not tail.objs
    assert [m.mid for m in drain(pending)] == [first.mid, second.mid]


def test_priorities_are_kept_across_paging_and_push_front_wins(h: Harness) -> None:
    pending = PendingList(h.pager, destination=DEST, window=2)
    low = [h.message(priority=1) for _ in range(5)]
    high = [h.message(priority=9) for _ in range(5)]
    h.settle()
    for m in low + high:
        pending.push(m)
    h.settle()
    first = pending.pop()
    assert first is not None and first.priority == 9
    first.deliveries = 1
    pending.push_front(first)  # redelivery goes before everything of its priority
    got = drain(pending)
    assert [m.mid for m in got] == [m.mid for m in high] + [m.mid for m in low]


def test_non_persistent_overflow_goes_to_temp_files_and_is_freed(h: Harness) -> None:
    account = MemoryAccount(limit=4 * 1024)  # beyond the memory budget, not a message window
    pending = PendingList(h.pager, destination=DEST, window=5, account=account)
    sent = [h.message(b"%d" % i * 50, persistent=False) for i in range(2000)]
    for m in sent:
        pending.push(m)
    assert h.temp.bytes_used > 64 << 10 and h.temp.files > 1
    got = drain(pending)
    assert [m.body for m in got] == [m.body for m in sent]
    assert all(not m.persistent for m in got)
    assert h.temp.files <= 1 and h.temp.bytes_used <= 64 << 10


def test_copies_of_one_publication_share_one_temp_record(h: Harness) -> None:
    """A topic message reaching many subscriptions that all page out is written to the temp
    files once; each subscription reads it back and releases its share, and the file is
    freed once the last one has."""
    sent = [h.message(b"%d" % i * 400, persistent=False) for i in range(400)]
    subs = fan_out(h, MemoryAccount(limit=1024), 50, sent)
    once = sum(len(records.encode_message(DEST, m.mid, m.timestamp, 0, 4, m.headers, m.body))
               for m in sent)
    assert h.temp.bytes_used == once  # not 50 times
    assert h.temp.files > 1
    for pending in subs:
        got = drain(pending)
        assert [m.body for m in got] == [m.body for m in sent]
    assert h.temp.files <= 1 and h.temp.bytes_used <= 64 << 10


def test_subscriptions_reading_back_one_shared_record_in_turn_share_its_body(
        h: Harness) -> None:
    """A dispatch pass reads a shared temp record back for each subscription in turn: read
    once, the body is one object for all of them (transports holding frames for subscribers
    that stopped reading held a copy each), and each gets headers of its own."""
    account = MemoryAccount(limit=1024)
    account.used = 1024  # the budget is spent: every copy pages out
    sent = [h.message(b"%d" % i * 400, persistent=False) for i in range(2)]
    subs = fan_out(h, account, 3, sent)
    for m in sent:
        got = [g for pending in subs if (g := pending.pop()) is not None]  # one each, in turn
        assert len(got) == 3 and got[0].body == m.body
        assert got[0].body is got[1].body is got[2].body
        assert got[0].headers == m.headers and got[0].headers is not got[1].headers


def test_a_different_message_with_the_same_body_gets_its_own_temp_record(h: Harness) -> None:
    account = MemoryAccount(limit=1024)
    pending = PendingList(h.pager, destination=DEST, window=1, account=account)
    body = b"same" * 100
    sent = [h.message(body, persistent=False) for _ in range(20)]
    for m in sent:
        pending.push(m)
    assert [(m.mid, m.headers) for m in drain(pending)] == [(m.mid, m.headers) for m in sent]


def test_non_persistent_messages_stay_in_memory_while_the_budget_allows(h: Harness) -> None:
    account = MemoryAccount(limit=8 << 20)
    pending = PendingList(h.pager, destination=DEST, window=5, account=account)
    sent = [h.message(persistent=False) for _ in range(500)]  # far beyond the window
    for m in sent:
        pending.push(m)
    assert h.temp.bytes_used == 0 and pending.paged == 0
    assert drain(pending) == sent


def test_the_broker_wide_budget_pages_out_even_below_the_window(h: Harness) -> None:
    account = MemoryAccount(limit=20 * 1024)  # high water: 14 KiB, about 10 small messages
    a = PendingList(h.pager, destination=DEST, window=1000, account=account)
    b = PendingList(h.pager, destination=DEST, window=1000, account=account)
    msgs = [h.message() for _ in range(40)]
    h.settle()
    for i, m in enumerate(msgs):
        (a if i % 2 else b).push(m)
    assert account.used <= account.high_water + 1200
    assert a.paged + b.paged >= 25
    drain(a)
    drain(b)
    assert account.used == 0


def test_browsing_reads_paged_messages_without_taking_them(h: Harness) -> None:
    pending = PendingList(h.pager, destination=DEST, window=3)
    sent = [h.message(b"m%d" % i) for i in range(20)]
    h.settle()
    for m in sent:
        pending.push(m)
    h.settle()
    assert [m.body for m in pending] == [m.body for m in sent]
    assert len(pending) == 20
    assert [m.mid for m in drain(pending)] == [m.mid for m in sent]


def test_remove_by_id_finds_paged_messages(h: Harness) -> None:
    pending = PendingList(h.pager, destination=DEST, window=3)
    sent = [h.message() for _ in range(10)]
    h.settle()
    for m in sent:
        pending.push(m)
    h.settle()
    taken = pending.remove(sent[7].mid)
    assert taken is not None and taken.headers == sent[7].headers
    assert pending.remove(12345) is None
    assert [m.mid for m in drain(pending)] == [m.mid for i, m in enumerate(sent) if i != 7]


def test_ordered_removal_takes_any_message_from_memory_or_pages_in_any_order(h: Harness) -> None:
    """A queue nobody consumes from (the scheduler's): its lanes stay in id order, so a
    removal bisects; persistent and non-persistent, in memory and paged out, all come back
    whole, and what is left drains in order."""
    pending = PendingList(h.pager, destination=DEST, window=4)
    sent = [h.message(persistent=i % 3 != 0, priority=4 + i % 2) for i in range(40)]
    h.settle()
    for m in sent:
        pending.push(m)
    h.settle()
    order = [sent[k] for k in (17, 2, 39, 0, 25, 8, 31)]
    for m in order:
        taken = pending.remove_ordered(m.mid)
        assert taken is not None and (taken.mid, taken.headers) == (m.mid, m.headers)
        assert taken.loaded_body == m.loaded_body
    assert pending.remove_ordered(order[0].mid) is None
    assert pending.remove_ordered(12345) is None
    left = [m for m in sent if m not in order]
    assert sorted(m.mid for m in drain(pending)) == sorted(m.mid for m in left)


def test_a_message_set_aside_is_never_popped_but_counted_listed_and_removable(
        h: Harness) -> None:
    """The scheduler's last half second: a message taken out of the lanes and set aside
    still costs the memory budget, is browsed, found by id, purged and cleared - and taken
    back out by id only once."""
    account = MemoryAccount(1 << 30)
    pending = PendingList(h.pager, destination=DEST, window=2, account=account)
    sent = [h.message() for _ in range(4)]
    for m in sent:
        pending.push(m)
    before = account.used
    aside = [pending.pop(), pending.pop()]
    for m in aside:
        assert m is not None
        pending.set_aside(m)
    assert account.used == before and len(pending) == 4
    assert [m.mid for m in pending] == [m.mid for m in sent]  # browsing: the aside first
    assert [m.mid for m in drain(pending)] == [m.mid for m in sent[2:]]  # never popped
    assert {m.mid for m in pending.in_memory()} == {m.mid for m in sent[:2]}  # compaction
    assert pending.remove(sent[0].mid) is sent[0]  # the admin API's delete
    assert pending.take_aside(sent[0].mid) is None  # gone: the scheduler finds it cancelled
    assert pending.clear(aside=False) == [] and len(pending) == 1
    assert pending.drain_stubs() == [sent[1]]  # purge
    assert len(pending) == 0 and account.used == 0


def test_drain_stubs_empties_without_reading_and_keeps_what_removal_needs(h: Harness) -> None:
    pending = PendingList(h.pager, destination=DEST, window=2)
    sent = [h.message() for _ in range(10)]
    h.settle()
    for m in sent:
        pending.push(m)
    h.settle()
    reads = h.pager.paged_in
    stubs = pending.drain_stubs()
    assert h.pager.paged_in == reads
    assert [m.mid for m in stubs] == [m.mid for m in sent]
    assert [m.ticket.loc for m in stubs] == [m.ticket.loc for m in sent]
    assert len(pending) == 0 and pending.pop() is None


def test_discard_gives_back_memory_and_temp_files_at_once_and_stubs_journaled_ones(
        h: Harness) -> None:
    """A subscription that ended: its non-persistent backlog (in memory, in temp files, still
    an object) is dropped in bulk - nothing read back - and only journaled messages come out,
    for their removal to be recorded."""
    account = MemoryAccount(limit=4 * 1024)
    pending = PendingList(h.pager, destination=DEST, window=5, account=account)
    for i in range(2000):
        pending.push(h.message(b"%d" % i * 50, persistent=False))
    kept = [h.message() for _ in range(3)]  # journaled, not yet durable: objects in the tail
    for m in kept:
        pending.push(m)
    assert account.used > 0 and h.temp.files > 1
    reads = h.pager.paged_in
    out = pending.discard()
    assert [m.mid for m in out] == [m.mid for m in kept]
    assert h.pager.paged_in == reads
    assert account.used == 0 and pending.memory == 0 and pending.stored_bytes == 0
    assert h.temp.files <= 1  # every record released: only the file being written is left
    assert len(pending) == 0 and pending.pop() is None
    h.settle()  # objects that left the cursor are not turned into slots later
    assert pending.pop() is None


def test_messages_inside_transaction_records_page_back_in(h: Harness) -> None:
    payloads = [records.encode_message("q:q", mid, 0, 0, 4, {"n": str(mid)}, b"tx%d" % mid)
                for mid in (101, 102, 103)]
    ops = [(records.MSG, p) for p in payloads]
    ticket = h.store.append_tx("t1", ops, final=True)
    h.settle()
    pending = PendingList(h.pager, destination=DEST, window=0)
    for mid, inner in zip((101, 102, 103), records.tx_op_offsets("t1", ops), strict=True):
        msg = Message(mid, DEST, {"n": str(mid)}, b"tx%d" % mid, persistent=True)
        msg.ticket, msg.inner = ticket, inner
        h.store.hold(ticket)
        pending.push(msg)
    assert pending.paged == 3
    got = drain(pending)
    assert [(m.mid, m.body, m.inner > 0) for m in got] == [
        (101, b"tx101", True), (102, b"tx102", True), (103, b"tx103", True)]


def test_a_vm_cursor_never_pages(h: Harness) -> None:
    pending = PendingList(None, destination=DEST, window=1)
    sent = [h.message() for _ in range(50)]
    for m in sent:
        pending.push(m)
    assert pending.paged == 0 and pending.bytes == 50 * 100
    assert drain(pending) == sent


@pytest.mark.parametrize("window", [2, 10])
def test_held_counts_every_body_in_memory_paged_out_or_kept_only_by_the_journal(
        h: Harness, window: int) -> None:
    """A policy's store_limit reads ``held``: a large body the journal alone keeps (its
    message object in memory without it) counts as much as one in memory or paged out, and
    stops counting however the message leaves: popped, or taken in a run off the head (all of
    it in memory, window 10)."""
    pending = PendingList(h.pager, destination=DEST, window=window)
    large = h.message(b"L" * 1000)
    large.body = None  # as the broker drops a body of spill_bytes or more once journaled
    small = [h.message(b"s" * 100) for _ in range(3)]
    h.settle()
    for m in [large, *small]:
        pending.push(m)
    h.settle()
    paged = 4 - window if window < 4 else 0
    assert (pending.bytes, pending.large, pending.stored_bytes) == (
        300 - 100 * paged, 1000, 100 * paged)
    assert pending.held == 1300
    got = drain(pending) if paged else pending.take(4)
    assert [m.mid for m in got] == [m.mid for m in [large, *small]]
    assert pending.held == 0 and pending.large == 0 and pending.bytes == 0
