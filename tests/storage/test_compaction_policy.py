"""Spec of when and how the compactor copies records forward, against a real journal.

It copies only while the journal is larger than twice its live record bytes plus a segment
(a backlog that fills many segments is never copied round and round), it copies a record's
own bytes under the holder's key, and it appends a bounded amount per loop turn.
"""

from __future__ import annotations

from pathlib import Path

from journal_harness import JournalHarness
from sluicemq.storage import compaction, records
from sluicemq.storage.compaction import Compactor, Holder
from sluicemq.storage.store import TicketLike

SEGMENT = 64 << 10


class Harness(JournalHarness):
    """One queue of held messages and a compactor over them, on a real journal; paced
    copies run as deferred work, in ``settle``."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory, segment_bytes=SEGMENT)
        self.held: dict[int, TicketLike] = {}  # mid -> the record holding it
        self.compactor = Compactor(self.store, self.holders, self.relocate, self.calls.append)

    def holders(self, segment: int) -> list[Holder]:
        return [Holder("q:q", mid, t.loc, 0) for mid, t in self.held.items()
                if t.loc is not None and t.loc.segment == segment]

    def relocate(self, plan: list[tuple[Holder, TicketLike]]) -> list[bool]:
        moved = []
        for h, t in plan:
            found = h.mid in self.held and self.held[h.mid].loc == h.loc
            if found:
                self.held[h.mid] = t
            moved.append(found)
        return moved

    def send(self, mids: range, size: int = 1000, headers: dict[str, str] | None = None
             ) -> None:
        for mid in mids:
            t = self.store.append_message("q:q", mid, 0, 0, 4, headers or {}, b"x" * size)
            self.store.hold(t)
            self.held[mid] = t

    def consume(self, mids: range) -> None:
        for mid in mids:
            self.store.remove("q:q", mid, self.held.pop(mid))

    def ticks(self, n: int) -> None:
        for _ in range(n):
            self.compactor.tick()
            self.settle()

    def disk(self) -> int:
        return len(self.journal.live_segments()) * SEGMENT


def test_a_backlog_filling_many_segments_is_not_copied_round_and_round(tmp_path: Path) -> None:
    """Nothing is dead, so copying the oldest segment to the head would free nothing."""
    h = Harness(tmp_path)
    h.send(range(1, 601))  # ~600 KB unconsumed: ~10 segments, all live
    h.settle()
    h.ticks(30)
    assert h.compactor.compacted_segments == 0
    assert h.compactor.live_bytes() >= 500_000  # measured, not assumed full


def test_a_few_long_lived_messages_do_not_keep_the_dead_segments_behind_them(
        tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.send(range(1, 4), headers={"h": "v" * 2000})  # three kept, with their headers
    h.send(range(4, 604))  # then ~600 KB that is consumed
    h.consume(range(4, 604))
    h.settle()
    assert len(h.journal.live_segments()) >= 9
    h.ticks(5)
    assert h.compactor.compacted_segments >= 1
    assert len(h.journal.live_segments()) <= 2, h.journal.live_counts()
    for mid in (1, 2, 3):  # the copies are the messages, headers and body as sent
        loc = h.held[mid].loc
        assert loc is not None
        stored = records.decode_message(h.store.read(loc))
        assert (stored.key, stored.mid, stored.headers, stored.body) == (
            "q:q", mid, {"h": "v" * 2000}, b"x" * 1000)


def test_scattered_live_messages_keep_the_journal_within_twice_their_bytes(
        tmp_path: Path) -> None:
    """Steady churn with one message in ten left unconsumed: journal <= 2 x live + 2 segments."""
    h = Harness(tmp_path)
    for round_ in range(20):
        first = round_ * 100 + 1
        h.send(range(first, first + 100))
        h.consume(range(first + 1, first + 100, 10))
        h.consume(range(first + 2, first + 100, 10))
        for k in range(3, 10):
            h.consume(range(first + k, first + 100, 10))
        h.settle()
        h.ticks(2)
    live = sum(len(records.encode_message("q:q", 1, 0, 0, 4, {}, b"x" * 1000)) + 32
               for _ in h.held)
    assert len(h.held) == 200
    assert h.disk() <= 2 * live + 2 * SEGMENT, (h.disk(), live)


def test_copies_are_appended_a_bounded_amount_per_loop_turn(tmp_path: Path,
                                                            monkeypatch) -> None:
    monkeypatch.setattr(compaction, "TURN_RECORDS", 10)
    h = Harness(tmp_path)
    h.send(range(1, 41), size=100)  # 40 small messages kept in the first segment
    h.send(range(41, 641))
    h.consume(range(41, 641))
    h.settle()
    appended = h.store.appended_seq
    h.compactor.tick()  # starts the plan: one turn's worth now, the rest queued
    assert h.store.appended_seq - appended == 10
    assert h.compactor.busy
    h.settle()
    h.ticks(2)
    assert not h.compactor.busy
    assert h.compactor.copied == 40


def test_the_journal_estimates_live_bytes_per_hold_whatever_the_fan_out(tmp_path: Path) -> None:
    """A record held by three subscriptions counts once, however many of them still hold it."""
    h = Harness(tmp_path)
    t = h.store.append_message("t:news", 1, 0, 0, 4, {}, b"x" * 3000)
    h.store.hold(t, 3)
    h.send(range(2, 12), size=1000)  # ten messages of a third of the size, held once each
    h.settle()
    [(_seg, live, estimate)] = h.journal.live_bytes()
    assert live == 13
    appended = 3000 + 10 * 1000  # bodies, plus every record's head, key and header JSON
    assert appended <= estimate <= appended + 13 * 80
    assert t.loc is not None
    h.journal.release(t.loc)
    [(_seg, live, smaller)] = h.journal.live_bytes()
    assert live == 12 and smaller < estimate
