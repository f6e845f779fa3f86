"""Spec of what a client remembers of acknowledgements it could not send before a failover."""

from __future__ import annotations

from sluicemq.client.failover import EarlyAcks


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
