"""Specs of the producer table (sans-IO): what is a duplicate, when an id is forgotten, and that
replay in log order reaches the verdicts the running broker reached."""

from __future__ import annotations

import pytest

from sluicemq.core.dedup.producers import ProducerTable, producer_of
from sluicemq.errors import ProtocolError

WINDOW_S = 60.0
W = 60_000  # the same window in ms


def test_a_number_not_above_the_highest_accepted_is_a_duplicate() -> None:
    t = ProducerTable(WINDOW_S)
    assert not t.is_duplicate("p", 5, 1000)
    t.accept("p", 5, 1000)
    assert t.is_duplicate("p", 5, 1001)
    assert t.is_duplicate("p", 3, 1001)
    assert not t.is_duplicate("p", 6, 1001)
    assert not t.is_duplicate("other", 1, 1001)
    assert t.duplicates == 2


def test_gaps_are_allowed_and_only_the_highest_counts() -> None:
    t = ProducerTable(WINDOW_S)
    t.accept("p", 10, 0)
    assert not t.is_duplicate("p", 100, 1)
    t.accept("p", 100, 1)
    assert t.is_duplicate("p", 50, 2)


def test_an_id_silent_for_the_window_is_forgotten() -> None:
    t = ProducerTable(WINDOW_S)
    t.accept("p", 1000, 0)
    assert t.is_duplicate("p", 1, W)  # exactly the window: still remembered
    assert not t.is_duplicate("p", 1, W + 1)
    t.accept("p", 1, W + 1)  # a new epoch: the reused id starts again
    assert t.entries["p"][0] == 1
    assert t.expire(2 * W + 1) == 0
    assert t.expire(2 * W + 2) == 1
    assert len(t) == 0


def test_replay_in_log_order_reaches_the_same_table() -> None:
    running = ProducerTable(WINDOW_S)
    log: list[tuple[str, int, int]] = []
    for pid, seq, ts in [("a", 1, 0), ("a", 2, 10), ("b", 7, 20), ("a", 1000, W - 5),
                         ("a", 1, 3 * W)]:  # "a" was forgotten, then reused from 1
        if not running.is_duplicate(pid, seq, ts):
            running.accept(pid, seq, ts)
            log.append((pid, seq, ts))
    replayed = ProducerTable(WINDOW_S)
    for pid, seq, ts in log:
        replayed.observe(pid, seq, ts)
    assert replayed.dump() == running.dump()
    assert replayed.entries["a"][0] == 1


def test_replay_ignores_an_old_epochs_copy_read_after_newer_records() -> None:
    """Compaction copies and dead-lettered messages are written later than newer sends."""
    t = ProducerTable(WINDOW_S)
    t.observe("p", 1, 3 * W)  # the reused id, new epoch
    t.observe("p", 1000, 0)  # a copy of a message of the forgotten epoch
    assert t.entries["p"][:2] == [1, 3 * W]
    t.observe("p", 1, 3 * W - 10)  # a copy from the same epoch changes nothing either
    assert t.entries["p"][:2] == [1, 3 * W]


def test_a_failed_journal_batch_forgets_the_ids_it_carried() -> None:
    t = ProducerTable(WINDOW_S)
    t.accept("stored", 1, 0, journal_seq=5)
    t.accept("lost", 1, 0, journal_seq=9)
    t.failed(8, 12)
    assert not t.is_duplicate("lost", 1, 1)  # its retry is taken: a duplicate beats a loss
    assert t.is_duplicate("stored", 1, 1)


def test_dump_and_load_round_trip() -> None:
    t = ProducerTable(WINDOW_S)
    t.accept("a", 3, 100)
    t.accept("b", 9, 200)
    copy = ProducerTable(WINDOW_S)
    copy.load(t.dump())
    assert copy.dump() == t.dump()
    assert copy.is_duplicate("b", 9, 300)


def test_headers_are_parsed_strictly() -> None:
    assert producer_of({}) is None
    assert producer_of({"sluice-producer-id": "app-1", "sluice-producer-seq": "42"}) == ("app-1",
                                                                                         42)
    for bad in ({"sluice-producer-id": "a"}, {"sluice-producer-seq": "1"},
                {"sluice-producer-id": "a", "sluice-producer-seq": "-1"},
                {"sluice-producer-id": "a", "sluice-producer-seq": "x"},
                {"sluice-producer-id": "a", "sluice-producer-seq": str(1 << 63)},
                {"sluice-producer-id": "a", "sluice-producer-seq": "9" * 5000},
                {"sluice-producer-id": "", "sluice-producer-seq": "1"},
                {"sluice-producer-id": "x" * 201, "sluice-producer-seq": "1"}):
        with pytest.raises(ProtocolError) as err:
            producer_of(bad)
        assert not err.value.fatal
