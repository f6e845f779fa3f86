"""Spec of the broker core, in process (tests/inprocess.py): queues, dispatch, dead letters,
expiry and large-stream timeouts, with time moved by the spec (an injected clock) instead of
waited for, and the journal real."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from inprocess import InProcessBroker, config_for
from sluicemq.config import Policy


@pytest.fixture
def node(tmp_path: Path) -> Iterator[InProcessBroker]:
    broker = InProcessBroker(config_for(tmp_path / "data"))
    yield broker
    broker.close()


def test_prefetch_bounds_what_a_consumer_holds_unacknowledged(node: InProcessBroker) -> None:
    producer, consumer = node.connect(), node.connect(peer="spec:2")
    for i in range(5):
        producer.request("SEND", {"destination": "/queue/p"}, str(i).encode())
    consumer.request("SUBSCRIBE", {"destination": "/queue/p", "id": "s", "ack": "client",
                                   "activemq.prefetchSize": "2"})
    first = consumer.messages(2)
    node.loop.run()
    assert consumer.take("MESSAGE") == []  # the third waits for room
    consumer.request("ACK", {"id": first[-1].headers["ack"]})  # cumulative: both
    assert [m.body for m in consumer.messages(2)] == [b"2", b"3"]


def test_two_consumers_share_a_queue_round_robin(node: InProcessBroker) -> None:
    producer = node.connect()
    a, b = node.connect(peer="spec:a"), node.connect(peer="spec:b")
    for conn, sub in ((a, "a"), (b, "b")):
        conn.request("SUBSCRIBE", {"destination": "/queue/rr", "id": sub})
    for i in range(4):
        producer.request("SEND", {"destination": "/queue/rr"}, str(i).encode())
    got_a, got_b = a.messages(2), b.messages(2)
    assert sorted(m.body for m in got_a + got_b) == [b"0", b"1", b"2", b"3"]
    assert [m.body for m in got_a] == sorted(m.body for m in got_a)  # each in queue order


def test_a_message_nacked_past_max_redeliveries_goes_to_the_dlq(tmp_path: Path) -> None:
    config = config_for(tmp_path / "data", policy=replace(Policy(), max_redeliveries=1))
    node = InProcessBroker(config)
    try:
        producer, consumer = node.connect(), node.connect(peer="spec:2")
        producer.request("SEND", {"destination": "/queue/poison", "persistent": "true"}, b"bad")
        consumer.request("SUBSCRIBE", {"destination": "/queue/poison", "id": "s",
                                       "ack": "client-individual"})
        for _ in range(2):
            [m] = consumer.messages(1)
            consumer.request("NACK", {"id": m.headers["ack"]})
        dlq = node.broker.queues["DLQ.poison"]
        assert len(dlq.pending) == 1
        assert len(node.broker.queues["poison"].pending) == 0
        watcher = node.connect(peer="spec:3")
        watcher.request("SUBSCRIBE", {"destination": "/queue/DLQ.poison", "id": "d"})
        [dead] = watcher.messages(1)
        assert dead.body == b"bad"
        assert dead.headers["sluice-dlq-origin"] == "/queue/poison"
        assert dead.headers["sluice-dlq-reason"] == "redelivered"
    finally:
        node.close()


def test_an_expired_message_is_never_delivered(node: InProcessBroker) -> None:
    producer, consumer = node.connect(), node.connect(peer="spec:2")
    soon = int(node.clock.now * 1000) + 1000
    producer.request("SEND", {"destination": "/queue/exp", "expires": str(soon)}, b"stale")
    producer.request("SEND", {"destination": "/queue/exp"}, b"fresh")
    node.tick(2.0)  # the injected clock passes the expiry; nothing waits
    consumer.request("SUBSCRIBE", {"destination": "/queue/exp", "id": "s"})
    assert [m.body for m in consumer.messages(1)] == [b"fresh"]
    node.loop.run()
    assert consumer.take("MESSAGE") == []


def test_a_silent_stream_is_abandoned_after_its_timeout(tmp_path: Path) -> None:
    config = config_for(tmp_path / "data", policy=replace(Policy(), stream_timeout=5.0))
    node = InProcessBroker(config)
    try:
        producer = node.connect()
        chunk = {"destination": "/queue/files", "persistent": "true",
                 "sluice-stream-id": "s1", "sluice-stream-seq": "0",
                 "sluice-stream-offset": "0", "sluice-stream-name": "big.bin"}
        assert producer.request("SEND", chunk, b"x" * 100).command == "RECEIPT"
        streams = node.broker.large_streams
        node.tick(4.0)
        assert [st.state for st in streams.open.values()] != ["abandoned"]
        node.tick(2.0)  # past stream_timeout without a chunk
        [st] = streams.open.values()
        assert st.state == "abandoned"
        answer = producer.request("SEND", {**chunk, "sluice-stream-seq": "1",
                                           "sluice-stream-offset": "100"}, b"y")
        assert answer.command == "ERROR"
        assert "abandoned" in answer.headers["message"]
    finally:
        node.close()


def test_a_consumer_wait_is_answered_at_its_timeout_by_the_clock(node: InProcessBroker) -> None:
    producer = node.connect()
    producer.send_frame("SEND", {"destination": "/queue/w", "receipt": "q",
                                 "sluice-stream-query": "s9",
                                 "sluice-stream-wait-consumer": "3"})
    node.loop.run()
    assert producer.take("RECEIPT") == []  # no consumer yet: it waits
    node.tick(4.0)
    [answer] = producer.take("RECEIPT")
    assert answer.headers["sluice-stream-consumers"] == "0"
