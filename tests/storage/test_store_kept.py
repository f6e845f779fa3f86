"""Spec of the store's kept records: records that stand for state (a staged part, a memo
table, a durable subscription, a stream's tail) rather than a message a queue holds.

`keep` appends a record and pins it; `settle` appends a record that makes kept ones
redundant (a publication, a discard) and unpins them once it is durable; `keep(...,
replaces=...)` does both for a newer copy; `let_go` unpins records nothing replaces. Their
owners (core/staging, core/persistence/anchor, core/routing durables and streams) never
count pins themselves.
"""

from __future__ import annotations

from pathlib import Path

from journal_harness import JournalHarness
from sluicemq.storage import records
from sluicemq.storage.staging_records import STAGE, STAGE_DISCARD, STAGE_PUBLISH

SEGMENT = 64 * 1024


def live(h: JournalHarness) -> int:
    return sum(n for _seg, n in h.journal.live_counts())


def test_a_kept_record_stays_pinned_until_a_settling_record_is_durable(tmp_path: Path) -> None:
    h = JournalHarness(tmp_path, SEGMENT, loop_durability=True)
    parts = [h.store.keep(STAGE, b"part %d" % i) for i in range(3)]
    h.settle()
    assert live(h) == 3
    h.store.settle(STAGE_PUBLISH, b"publication", parts)
    assert live(h) == 3  # appended, not yet durable: a crash now must still find the parts
    h.settle()
    assert live(h) == 0


def test_a_newer_copy_replaces_the_old_one_once_durable(tmp_path: Path) -> None:
    h = JournalHarness(tmp_path, SEGMENT, loop_durability=True)
    old = h.store.keep(STAGE, b"table v1")
    h.settle()
    new = h.store.keep(STAGE, b"table v2", replaces=[old])
    assert live(h) == 2
    h.settle()
    assert live(h) == 1
    assert new.loc is not None and h.store.read(new.loc) == b"table v2"


def test_let_go_unpins_now_when_everything_is_durable_and_else_once_it_is(
        tmp_path: Path) -> None:
    h = JournalHarness(tmp_path, SEGMENT, loop_durability=True)
    a, b = h.store.keep(STAGE, b"a"), h.store.keep(STAGE, b"b")
    h.settle()
    h.store.let_go([a])
    assert live(h) == 1  # nothing was waiting for the disk: released at once
    h.store.settle(STAGE_DISCARD, b"discard", [])
    h.store.let_go([b])
    assert live(h) == 1  # the discard record is on its way: released behind it
    h.settle()
    assert live(h) == 0
    h.store.let_go([])  # nothing to do, nothing written
    assert h.store.appended_seq == h.store.durable_seq


def test_hold_rows_counts_adopted_rows_per_segment(tmp_path: Path) -> None:
    h = JournalHarness(tmp_path, SEGMENT, loop_durability=True)
    rec = h.store.append_record(STAGE, b"rows")
    h.settle()
    assert rec.loc is not None
    h.store.hold_rows({rec.loc.segment: 5}, (rec.loc.segment, rec.loc.offset))
    assert dict(h.journal.live_counts())[rec.loc.segment] == 5


def test_a_durable_subscription_is_kept_until_its_end_is_durable(tmp_path: Path) -> None:
    """SUB stands for a subscription; UNSUB ends it and lets go of what it still held."""
    h = JournalHarness(tmp_path, SEGMENT, loop_durability=True)
    sub = records.DurableSub("d:app:s", "prices", "app", "s", None)
    ticket = h.store.keep_sub(sub)
    held = h.store.append_record(records.MSG, records.encode_message(
        "t:prices", 1, 0, 0, 4, {}, b"tick"))
    h.store.hold(held)
    h.settle()
    assert live(h) == 2
    assert ticket.loc is not None and records.decode_sub(h.store.read(ticket.loc)) == sub
    end = h.store.end_sub("d:app:s", [held, ticket])
    assert live(h) == 2  # a crash before the UNSUB is durable finds the subscription whole
    h.settle()
    assert live(h) == 0
    assert end.loc is not None and records.decode_unsub(h.store.read(end.loc)) == "d:app:s"


def test_a_record_appended_as_a_message_can_be_kept_too(tmp_path: Path) -> None:
    """A stream's newest chunk: its queue holds it, and the stream keeps it (where a producer
    resumes) until a newer chunk replaces it or the stream ends."""
    h = JournalHarness(tmp_path, SEGMENT, loop_durability=True)
    chunks = []
    for i in range(2):
        chunks.append(h.store.append_record(records.MSG, records.encode_message(
            "q:files", i + 1, 0, 0, 4, {}, b"chunk")))
        h.store.hold(chunks[-1])  # the queue's hold
        h.store.keep_appended(chunks[-1], chunks[:-1])
    assert live(h) == 4  # pins: two queue holds, two stream keeps until the newer is durable
    h.settle()
    assert live(h) == 3
    for t in chunks:
        h.store.remove("q:files", chunks.index(t) + 1, t)  # consumed: the queues let go
    h.settle()
    assert live(h) == 1  # the stream still knows where it stands
    h.store.let_go(chunks[-1:])
    assert live(h) == 0
