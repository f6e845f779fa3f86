"""Spec of durable subscriptions' records (core/routing/durables.py), in process: a durable
subscription keeps its SUB record on disk while it exists, and ending it lets go of that record
and of every message it still held - the store counts those pins (Store.keep_sub/end_sub),
so a long-gone subscription can never keep a journal segment alive."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from inprocess import InProcessBroker, config_for

DURABLE = {"destination": "/topic/prices", "id": "d", "activemq.subscriptionName": "ticks"}


@pytest.fixture
def node(tmp_path: Path) -> Iterator[InProcessBroker]:
    broker = InProcessBroker(config_for(tmp_path / "data"))
    yield broker
    broker.close()


def pins(node: InProcessBroker) -> int:
    """Journal records some holder keeps, over every segment."""
    return sum(n for _seg, n in node.core.store.journal.live_counts())


def settle_at(node: InProcessBroker, expected: int) -> None:
    """Run the loop until the pins reach ``expected`` (releases wait for their fsync)."""
    node.loop.run_until(lambda: node.core.store.idle and pins(node) == expected)


def test_a_subscription_and_what_it_holds_are_let_go_when_it_ends(
        node: InProcessBroker) -> None:
    app = node.connect({"client-id": "app"})
    assert app.request("SUBSCRIBE", DURABLE).command == "RECEIPT"
    settle_at(node, 1)  # the SUB record
    app.request("UNSUBSCRIBE", {"id": "d"})  # the client goes; the subscription stays
    producer = node.connect(peer="spec:2")
    for i in range(3):
        producer.request("SEND", {"destination": "/topic/prices", "persistent": "true"},
                         str(i).encode())
    settle_at(node, 4)  # SUB + three messages kept for the absent subscriber
    answer = app.request("UNSUBSCRIBE", {"id": "d", "activemq.subscriptionName": "ticks"})
    assert answer.command == "RECEIPT"
    settle_at(node, 0)
    assert "d:app:ticks" not in node.broker.durables


def test_a_changed_selector_replaces_the_definition_and_its_record(
        tmp_path: Path) -> None:
    node = InProcessBroker(config_for(tmp_path / "data"))
    app = node.connect({"client-id": "app"})
    app.request("SUBSCRIBE", DURABLE)
    app.request("UNSUBSCRIBE", {"id": "d"})
    app.request("SUBSCRIBE", {**DURABLE, "selector": "venue = 'X'"})
    settle_at(node, 1)  # one SUB: the first was ended (UNSUB) by the second
    app.request("UNSUBSCRIBE", {"id": "d"})
    node = node.restart()
    try:
        sub, _queue = node.broker.durables["d:app:ticks"]
        assert sub.selector == "venue = 'X'"
        settle_at(node, 1)  # recovered: the one SUB record is kept again
    finally:
        node.close()
