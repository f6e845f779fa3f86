"""Topics: fan-out to live subscribers, and durable subscriptions that survive absence."""

from __future__ import annotations

from stomp_helpers import (
    connect,
    nothing_delivered,
    send_with_receipt,
    subscribe_with_receipt,
    wait_receipt,
)

from sluicemq import Client


def test_every_subscriber_gets_every_message(broker) -> None:
    subs = [connect(broker) for _ in range(3)]
    for i, (c, lc) in enumerate(subs):
        subscribe_with_receipt(c, lc, "/topic/news", str(i))
    p, _ = connect(broker)
    for i in range(5):
        p.send("/topic/news", f"n{i}")
    for _, lst in subs:
        assert [lst.next().body for _ in range(5)] == [f"n{i}" for i in range(5)]


def test_non_durable_subscriber_misses_messages_sent_while_away(broker) -> None:
    p, lp = connect(broker)
    send_with_receipt(p, lp, "/topic/gone", "before", "r", persistent="true")
    c, lc = connect(broker)
    c.subscribe("/topic/gone", id="1")
    assert nothing_delivered(c, lc)


def test_topic_selector(broker) -> None:
    c, lc = connect(broker)
    subscribe_with_receipt(c, lc, "/topic/sel", "1", headers={"selector": "kind = 'x'"})
    p, _ = connect(broker)
    p.send("/topic/sel", "no", headers={"kind": "y"})
    p.send("/topic/sel", "yes", headers={"kind": "x"})
    assert lc.next().body == "yes"
    assert nothing_delivered(c, lc)


def _durable(broker, client_id: str = "app-1"):
    return connect(broker, headers={"client-id": client_id})


def test_durable_subscription_keeps_messages_while_offline(broker) -> None:
    c, lc = _durable(broker)
    subscribe_with_receipt(c, lc, "/topic/orders", "d",
                           headers={"activemq.subscriptionName": "audit"})
    c.disconnect()
    p, lp = connect(broker)
    for i in range(3):
        send_with_receipt(p, lp, "/topic/orders", f"o{i}", f"r{i}", persistent="true")
    c2, lc2 = _durable(broker)
    c2.subscribe("/topic/orders", id="d", headers={"activemq.subscriptionName": "audit"})
    assert [lc2.next().body for _ in range(3)] == ["o0", "o1", "o2"]


def test_durable_subscription_survives_broker_kill(broker) -> None:
    c, lc = _durable(broker, "svc")
    subscribe_with_receipt(c, lc, "/topic/ledger", "d", ack="client-individual",
                           headers={"activemq.subscriptionName": "books"})
    c.disconnect()
    p, lp = connect(broker)
    for i in range(5):
        send_with_receipt(p, lp, "/topic/ledger", f"e{i}", f"r{i}", persistent="true")
    broker.kill()
    broker.restart()
    c2, lc2 = _durable(broker, "svc")
    c2.subscribe("/topic/ledger", id="d", ack="client-individual",
                 headers={"activemq.subscriptionName": "books"})
    frames = [lc2.next() for _ in range(5)]
    assert [f.body for f in frames] == [f"e{i}" for i in range(5)]
    for i, f in enumerate(frames[:3]):
        c2.ack(f.headers["ack"], receipt=f"ack-{i}")
        wait_receipt(lc2, f"ack-{i}")  # the ACK is durable
    c2.disconnect()
    broker.kill()
    broker.restart()
    with Client(broker.url) as q:  # all it holds: the two unacknowledged, nothing else
        assert q.head("/topic/ledger", subscription="books", client_id="svc").count == 2
    c3, lc3 = _durable(broker, "svc")
    c3.subscribe("/topic/ledger", id="d", headers={"activemq.subscriptionName": "books"})
    assert [lc3.next().body for _ in range(2)] == ["e3", "e4"]


def test_unsubscribe_with_name_removes_durable_subscription(broker) -> None:
    c, lc = _durable(broker, "tmp")
    subscribe_with_receipt(c, lc, "/topic/t", "d", headers={"activemq.subscriptionName": "x"})
    c.unsubscribe("d", headers={"activemq.subscriptionName": "x"})
    p, lp = connect(broker)
    send_with_receipt(p, lp, "/topic/t", "lost", "r", persistent="true")
    c.subscribe("/topic/t", id="d2", headers={"activemq.subscriptionName": "x"})
    assert nothing_delivered(c, lc)


def test_client_id_in_use_is_refused(broker, raw) -> None:
    a = raw()
    a.connect(client_id="only-one")
    b = raw()
    b.send("CONNECT", {"accept-version": "1.2", "client-id": "only-one"})
    frame = b.recv()
    assert frame.command == "ERROR"
    assert "client-id" in frame.headers["message"]
