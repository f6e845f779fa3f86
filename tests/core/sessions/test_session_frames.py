"""Spec of a session, in process: each client command through the real ``Session`` and broker
core, with an in-memory transport and a hand-driven loop (tests/inprocess.py) - no socket, no
subprocess, no sleep. The wire-level specs in tests/e2e cover the same commands over TCP."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from inprocess import Connection, InProcessBroker, config_for
from sluicemq.protocol.codec import encode_frame
from sluicemq.protocol.frames import Frame


@pytest.fixture
def node(tmp_path: Path) -> Iterator[InProcessBroker]:
    broker = InProcessBroker(config_for(tmp_path / "data"))
    yield broker
    broker.close()


def test_connect_negotiates_the_highest_common_version(node: InProcessBroker) -> None:
    conn = node.connect()
    assert conn.session.version == "1.2"
    assert conn.session.connected


def test_a_frame_before_connect_is_a_fatal_error(node: InProcessBroker) -> None:
    conn = node.connect()
    fresh = type(conn)(node, "spec:2")
    fresh.send_frame("SEND", {"destination": "/queue/a"}, b"x")
    [error] = fresh.take("ERROR")
    assert "expected CONNECT" in error.headers["message"]
    assert fresh.out.closed


def test_persistent_send_is_receipted_and_delivered_in_order(node: InProcessBroker) -> None:
    producer, consumer = node.connect(), node.connect(peer="spec:2")
    for i in range(5):
        answer = producer.request("SEND", {"destination": "/queue/orders",
                                           "persistent": "true"}, f"m{i}".encode())
        assert answer.command == "RECEIPT"
    assert consumer.request("SUBSCRIBE", {"destination": "/queue/orders", "id": "s1",
                                          "ack": "client-individual"}).command == "RECEIPT"
    messages = consumer.messages(5)
    assert [m.body for m in messages] == [f"m{i}".encode() for i in range(5)]
    assert all(m.headers["persistent"] == "true" for m in messages)
    for m in messages:
        assert consumer.request("ACK", {"id": m.headers["ack"]}).command == "RECEIPT"
    assert len(node.broker.queues["orders"].pending) == 0


def test_a_message_states_its_priority_expiry_and_persistence_default_or_not(
        node: InProcessBroker) -> None:
    producer, consumer = node.connect(), node.connect(peer="spec:2")
    sends = [{}, {"persistent": "true"}, {"priority": "7"},
             {"expires": "4102444800000", "persistent": "true"}]
    for i, extra in enumerate(sends):
        producer.request("SEND", {"destination": "/queue/kinds", **extra}, b"%d" % i)
    consumer.request("SUBSCRIBE", {"destination": "/queue/kinds", "id": "s1"})
    got = {m.body: {k: m.headers[k] for k in ("priority", "expires", "persistent")}
           for m in consumer.messages(len(sends))}
    assert got == {b"0": {"priority": "4", "expires": "0", "persistent": "false"},
                   b"1": {"priority": "4", "expires": "0", "persistent": "true"},
                   b"2": {"priority": "7", "expires": "0", "persistent": "false"},
                   b"3": {"priority": "4", "expires": "4102444800000", "persistent": "true"}}


def test_an_unknown_ack_id_is_an_error_that_keeps_the_connection(node: InProcessBroker) -> None:
    conn = node.connect()
    answer = conn.request("ACK", {"id": "9-99"})
    assert answer.command == "ERROR"
    assert "unknown ack id" in answer.headers["message"]
    assert not conn.out.closed
    assert conn.request("SEND", {"destination": "/queue/a"}, b"x").command == "RECEIPT"


def test_nack_redelivers_with_a_count(node: InProcessBroker) -> None:
    producer, consumer = node.connect(), node.connect(peer="spec:2")
    producer.request("SEND", {"destination": "/queue/work"}, b"job")
    consumer.request("SUBSCRIBE", {"destination": "/queue/work", "id": "s", "ack": "client"})
    [first] = consumer.messages(1)
    consumer.request("NACK", {"id": first.headers["ack"]})
    [again] = consumer.messages(1)
    assert again.body == b"job"
    assert again.headers["redelivered"] == "true"
    assert again.headers["sluice-delivery-count"] == "2"


def test_a_transaction_delivers_nothing_before_commit_and_nothing_after_abort(
        node: InProcessBroker) -> None:
    producer, consumer = node.connect(), node.connect(peer="spec:2")
    consumer.request("SUBSCRIBE", {"destination": "/queue/tx", "id": "s"})
    producer.request("BEGIN", {"transaction": "t1"})
    producer.request("SEND", {"destination": "/queue/tx", "transaction": "t1"}, b"kept")
    producer.request("BEGIN", {"transaction": "t2"})
    producer.request("SEND", {"destination": "/queue/tx", "transaction": "t2"}, b"dropped")
    node.loop.run()
    assert consumer.take("MESSAGE") == []
    assert producer.request("ABORT", {"transaction": "t2"}).command == "RECEIPT"
    assert producer.request("COMMIT", {"transaction": "t1"}).command == "RECEIPT"
    [message] = consumer.messages(1)
    assert message.body == b"kept"
    node.loop.run()
    assert consumer.take("MESSAGE") == []


def test_a_numbered_send_seen_before_is_answered_as_a_duplicate(node: InProcessBroker) -> None:
    producer = node.connect()
    headers = {"destination": "/queue/once", "persistent": "true",
               "sluice-producer-id": "p1", "sluice-producer-seq": "7"}
    first = producer.request("SEND", headers, b"x")
    second = producer.request("SEND", headers, b"x")
    assert "sluice-duplicate" not in first.headers
    assert second.headers["sluice-duplicate"] == "true"
    assert len(node.broker.queues["once"].pending) == 1


def test_topic_subscribers_each_get_a_copy(node: InProcessBroker) -> None:
    a, b, producer = node.connect(), node.connect(peer="spec:2"), node.connect(peer="spec:3")
    a.request("SUBSCRIBE", {"destination": "/topic/news", "id": "a"})
    b.request("SUBSCRIBE", {"destination": "/topic/news", "id": "b"})
    producer.request("SEND", {"destination": "/topic/news"}, b"hello")
    assert [m.body for m in a.messages(1)] == [b"hello"]
    assert [m.body for m in b.messages(1)] == [b"hello"]


def test_a_bad_selector_is_refused_before_anything_is_created(node: InProcessBroker) -> None:
    conn = node.connect()
    answer = conn.request("SUBSCRIBE", {"destination": "/queue/sel", "id": "s",
                                        "selector": "a = "})
    assert answer.command == "ERROR"
    assert "invalid selector" in answer.headers["message"]
    assert conn.session.consumers == {}


def test_a_selector_picks_what_a_consumer_gets(node: InProcessBroker) -> None:
    producer, consumer = node.connect(), node.connect(peer="spec:2")
    consumer.request("SUBSCRIBE", {"destination": "/queue/sel", "id": "s",
                                   "selector": "colour = 'red'"})
    for colour in ("blue", "red", "green", "red"):
        producer.request("SEND", {"destination": "/queue/sel", "colour": colour}, colour.encode())
    assert [m.body for m in consumer.messages(2)] == [b"red", b"red"]
    assert len(node.broker.queues["sel"].pending) == 2


def test_composite_send_reaches_every_destination_atomically(node: InProcessBroker) -> None:
    producer = node.connect()
    answer = producer.request("SEND", {"destination": "/queue/c1,/queue/c2",
                                       "persistent": "true"}, b"both")
    assert answer.command == "RECEIPT"
    assert len(node.broker.queues["c1"].pending) == 1
    assert len(node.broker.queues["c2"].pending) == 1


def test_disconnect_with_receipt_closes_after_answering(node: InProcessBroker) -> None:
    conn = node.connect()
    answer = conn.request("DISCONNECT")
    assert answer.command == "RECEIPT"
    assert conn.out.closed


def test_a_queue_reclaimed_after_a_send_is_admitted_again_under_the_destination_cap(
        tmp_path: Path) -> None:
    """A session remembers the queues it sent to (routed, authorized), never that they exist:
    once reclaimed, the next SEND re-creates one only where the cap leaves room."""
    config = config_for(tmp_path / "data")
    node = InProcessBroker(replace(config, limits=replace(config.limits, max_destinations=1)))
    destinations = node.broker.destinations
    try:
        producer, other = node.connect(), node.connect(peer="spec:2")
        assert producer.request("SEND", {"destination": "/queue/a"}, b"1").command == "RECEIPT"
        other.request("SUBSCRIBE", {"destination": "/queue/a", "id": "a"})
        assert [m.body for m in other.messages(1)] == [b"1"]
        other.request("UNSUBSCRIBE", {"id": "a"})
        assert destinations.sweep(node.clock.now, force=True) == 1  # /queue/a, idle
        other.request("SUBSCRIBE", {"destination": "/queue/b", "id": "b"})  # the one allowed
        refused = producer.request("SEND", {"destination": "/queue/a"}, b"2")
        assert refused.command == "ERROR"
        assert "max_destinations" in refused.headers["message"]
        assert "a" not in node.broker.queues
        other.request("UNSUBSCRIBE", {"id": "b"})
        assert destinations.sweep(node.clock.now, force=True) == 1  # /queue/b
        assert producer.request("SEND", {"destination": "/queue/a"}, b"3").command == "RECEIPT"
        assert [m.body for m in node.broker.queues["a"].pending] == [b"3"]
    finally:
        node.close()


def test_a_plain_send_does_not_take_later_numbered_or_transactional_sends_off_their_steps(
        node: InProcessBroker) -> None:
    producer, consumer = node.connect(), node.connect(peer="spec:2")
    numbered = {"destination": "/queue/mixed", "sluice-producer-id": "p1",
                "sluice-producer-seq": "1"}
    assert producer.request("SEND", {"destination": "/queue/mixed"}, b"plain").command == "RECEIPT"
    assert "sluice-duplicate" not in producer.request("SEND", numbered, b"n1").headers
    assert producer.request("SEND", numbered, b"n1").headers["sluice-duplicate"] == "true"
    producer.request("BEGIN", {"transaction": "t"})
    producer.request("SEND", {"destination": "/queue/mixed", "transaction": "t"}, b"tx")
    assert len(node.broker.queues["mixed"].pending) == 2  # the transactional one waits
    producer.request("COMMIT", {"transaction": "t"})
    consumer.request("SUBSCRIBE", {"destination": "/queue/mixed", "id": "s"})
    assert [m.body for m in consumer.messages(3)] == [b"plain", b"n1", b"tx"]


def test_one_subscription_over_several_topics_names_each_message_s_own_destination(
        node: InProcessBroker) -> None:
    subscriber, producer = node.connect(), node.connect(peer="spec:2")
    subscriber.request("SUBSCRIBE", {"destination": "/topic/prices.>", "id": "p:1"})
    for name in ("prices.a", "prices.b", "prices.a"):
        producer.request("SEND", {"destination": f"/topic/{name}"}, name.encode())
    messages = subscriber.messages(3)
    assert [m.headers["destination"] for m in messages] == [
        "/topic/prices.a", "/topic/prices.b", "/topic/prices.a"]
    assert {m.headers["subscription"] for m in messages} == {"p:1"}  # escaped on the wire


def test_a_receipt_id_that_needs_escaping_comes_back_as_sent(node: InProcessBroker) -> None:
    conn = node.connect()
    conn.send_frame("SEND", {"destination": "/queue/r", "receipt": "a:b\\c"}, b"x")
    node.loop.run_until(lambda: any(f.command == "RECEIPT" for f in conn.frames()))
    [receipt] = conn.take("RECEIPT")
    assert receipt.headers == {"receipt-id": "a:b\\c"}


# -- receipts follow dispatch (core/routing/receipts.py) ---------------------------------------
def _commands(conn: Connection) -> list[tuple[str, str]]:
    """What the connection was written, in order: (command, body or receipt id)."""
    return [(f.command, f.headers.get("receipt-id", bytes(f.body).decode()))
            for f in conn.frames()]


def test_a_receipt_comes_after_the_messages_earlier_frames_made_deliverable(
        node: InProcessBroker) -> None:
    conn = node.connect()
    conn.request("SUBSCRIBE", {"destination": "/queue/mine", "id": "s"})
    # one read, the loop not run in between: the SEND's dispatch pass was only scheduled
    conn.session.feed(
        encode_frame(Frame("SEND", {"destination": "/queue/mine"}, b"m"), "1.2")
        + encode_frame(Frame("BEGIN", {"transaction": "t", "receipt": "r"}), "1.2"))
    assert _commands(conn) == [("MESSAGE", "m"), ("RECEIPT", "r")]


def test_a_subscribe_is_still_receipted_before_the_backlog_it_delivers(
        node: InProcessBroker) -> None:
    producer, consumer = node.connect(), node.connect(peer="spec:2")
    producer.request("SEND", {"destination": "/queue/backlog"}, b"waiting")
    consumer.session.feed(encode_frame(Frame("SUBSCRIBE", {
        "destination": "/queue/backlog", "id": "s", "receipt": "r"}), "1.2"))
    node.loop.run()
    assert _commands(consumer) == [("RECEIPT", "r"), ("MESSAGE", "waiting")]


def test_a_receipt_on_one_connection_follows_what_a_receipted_send_on_another_routed_to_it(
        node: InProcessBroker) -> None:
    producer, consumer = node.connect(), node.connect(peer="spec:2")
    consumer.request("SUBSCRIBE", {"destination": "/queue/q", "id": "s"})
    producer.session.feed(encode_frame(Frame("SEND", {"destination": "/queue/q",
                                                      "receipt": "p"}, b"m"), "1.2"))
    assert _commands(producer) == [("RECEIPT", "p")]
    consumer.session.feed(encode_frame(Frame("BEGIN", {"transaction": "t",
                                                       "receipt": "c"}), "1.2"))
    assert _commands(consumer) == [("MESSAGE", "m"), ("RECEIPT", "c")]


def test_nothing_before_a_receipt_means_nothing_was_delivered(node: InProcessBroker) -> None:
    conn = node.connect()
    conn.request("SUBSCRIBE", {"destination": "/queue/sel", "id": "s",
                               "selector": "kind = 'x'"})
    conn.session.feed(
        encode_frame(Frame("SEND", {"destination": "/queue/sel", "kind": "y"}, b"no"), "1.2")
        + encode_frame(Frame("BEGIN", {"transaction": "t", "receipt": "r"}), "1.2"))
    assert _commands(conn) == [("RECEIPT", "r")]
    node.loop.run()  # the scheduled pass, run later, finds nothing to add
    assert _commands(conn) == [("RECEIPT", "r")]
    assert len(node.broker.queues["sel"].pending) == 1  # kept for another consumer
