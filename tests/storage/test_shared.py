"""Spec of ``SharedRecords``: how many queues still hold a record several of them hold (a
topic's persistent message and its durable subscriptions), by message id."""

from __future__ import annotations

from array import array

from sluicemq.storage.shared import SharedRecords


def test_a_record_held_once_is_not_kept_and_counts_one_holder() -> None:
    shared = SharedRecords()
    shared.add(7, 1)
    shared.release(7)
    assert shared.held == {}
    assert shared.holders(7) == 1


def test_each_holder_that_lets_go_counts_down_until_one_is_left() -> None:
    shared = SharedRecords()
    shared.add(7, 3)
    assert shared.holders(7) == 3
    shared.release(7)
    assert shared.holders(7) == 2
    shared.release_run(array("q", [7]))
    assert shared.held == {}  # the last holder is not kept: a record held once counts one
    assert shared.holders(7) == 1


def test_a_drained_book_gives_its_table_back() -> None:
    shared = SharedRecords()
    for mid in range(10_000):
        shared.add(mid, 2)
    before = shared.held
    shared.release_run(range(9_000))
    assert shared.held is not before and len(shared.held) == 1_000


def test_recount_finds_the_holders_again_from_each_holder_s_ids() -> None:
    shared = SharedRecords()
    shared.add(99, 2)
    assert shared.recount([1, 2, 2, 3, 3, 3]) == 2
    assert (shared.holders(1), shared.holders(2), shared.holders(3), shared.holders(99)) == (
        1, 2, 3, 1)
