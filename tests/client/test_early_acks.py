"""Spec of what a client remembers across a failover: acknowledgements it could not send, and
deliveries nobody acknowledged (which come back marked redelivered)."""

from __future__ import annotations

from sluicemq.client.failover import EarlyAcks, Unacked


def test_a_redelivery_of_an_early_ack_is_recognised_once() -> None:
    acks = EarlyAcks()
    acks.note("sub-1", "ID:sluice-7")
    assert not acks.take("sub-2", "ID:sluice-7")  # another subscription's delivery
    assert acks.take("sub-1", "ID:sluice-7")
    assert not acks.take("sub-1", "ID:sluice-7")  # a second redelivery is handed out
    assert not acks.take("sub-1", None)


def test_the_memory_is_bounded_oldest_first() -> None:
    acks = EarlyAcks(limit=2)
    for mid in (1, 2, 3):
        acks.note("s", f"ID:sluice-{mid}")
    assert not acks.take("s", "ID:sluice-1")
    assert acks.take("s", "ID:sluice-2") and acks.take("s", "ID:sluice-3")


def test_unacknowledged_deliveries_are_marked_once_after_a_failover() -> None:
    unacked = Unacked()
    for mid in ("1", "2", "3"):
        unacked.delivered("s", mid)
    unacked.settled("s", "2", cumulative=False)
    unacked.failed_over()
    assert [unacked.was_delivered("s", m) for m in ("1", "2", "3")] == [True, False, True]
    assert not unacked.was_delivered("s", "1")  # once: a later redelivery is the broker's


def test_client_mode_settles_cumulatively_and_unsubscribing_forgets() -> None:
    unacked = Unacked()
    for mid in ("1", "2", "3"):
        unacked.delivered("a", mid)
        unacked.delivered("b", mid)
    unacked.settled("a", "2", cumulative=True)
    unacked.forget("b")
    unacked.failed_over()
    assert [unacked.was_delivered("a", m) for m in ("1", "2", "3")] == [False, False, True]
    assert not unacked.was_delivered("b", "3")


def test_the_unacked_memory_is_bounded() -> None:
    unacked = Unacked(limit=2)
    for mid in ("1", "2", "3"):
        unacked.delivered("s", mid)
    unacked.failed_over()
    assert [unacked.was_delivered("s", m) for m in ("1", "2", "3")] == [False, True, True]
