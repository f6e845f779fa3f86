"""Spec of journal compaction: a few long-lived messages do not pin many segments; they are
copied forward, survive restarts in order, and recovery stays proportional to what is
unconsumed rather than to the journal's history."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from sluice_testing import eventually
from sluicemq.protocol.codec import FrameParser, encode_frame
from sluicemq.protocol.frames import Frame

CONFIG = """
[journal]
segment_bytes = 262144
preallocate = false
store_delay_ms = 0  # write every message: the churn must fill segments with history
"""
BODY = b"c" * 1024


class RawStomp:
    """Just enough STOMP 1.2 over a socket for these specs."""

    def __init__(self, broker: Any) -> None:
        self.sock = socket.create_connection((broker.host, broker.port), timeout=30)
        self.parser = FrameParser(version="1.2")
        self.frames: list[Frame] = []

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, command: str, headers: dict[str, str]) -> None:
        self.sock.sendall(encode_frame(Frame(command, headers), "1.2"))

    def connect(self, **headers: str) -> None:
        self.send("CONNECT", {"accept-version": "1.2", "host": "localhost",
                              **{k.replace("_", "-"): v for k, v in headers.items()}})
        assert self.recv().command == "CONNECTED"

    def recv(self, timeout: float = 30) -> Frame:
        self.sock.settimeout(timeout)
        while not self.frames:
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("closed")
            self.frames.extend(self.parser.feed(data))
        return self.frames.pop(0)

    def close(self) -> None:
        self.sock.close()


def client(broker: Any, **headers: str) -> RawStomp:
    c = RawStomp(broker)
    c.connect(**headers)
    return c


def segments(broker: Any) -> int:
    return len(list(Path(broker.data_dir, "journal").glob("*.log")))


def send_batch(c: RawStomp, destination: str, first: int, count: int,
               extra: bytes = b"") -> None:
    c.send_bytes(b"".join(
        b"SEND\ndestination:%s\npersistent:true\nn:%d\n%s%s\n%s\x00"
        % (destination.encode(), i, extra, b"receipt:%d\n" % i if i == first + count - 1
           else b"", BODY) for i in range(first, first + count)))
    frame = c.recv(timeout=30)
    assert frame.command == "RECEIPT" and frame.headers["receipt-id"] == str(first + count - 1)


def test_long_lived_messages_are_compacted_forward_and_segments_reclaimed(
        broker_factory) -> None:
    broker = broker_factory(config_text=CONFIG)
    producer = client(broker)
    send_batch(producer, "/queue/keep", 0, 3)  # three messages nobody consumes for a while
    send_batch(producer, "/queue/keep", 3, 2, b"priority:9\n")
    consumer = client(broker)
    consumer.send("SUBSCRIBE", {"destination": "/queue/churn", "id": "s"})
    for round_ in range(20):  # ~5 MiB through the journal: 20 segments of history
        send_batch(producer, "/queue/churn", round_ * 250, 250)
        for _ in range(250):
            assert consumer.recv(timeout=30).command == "MESSAGE"
    eventually(lambda: segments(broker) <= 5, "compaction down to 5 segments")
    broker.wait_for_log("compacting journal segment")

    broker.stop()
    broker.restart()
    log = broker.log().split("sluice: stopped")[-1]
    assert "recovered 5 messages" in log
    reader = client(broker)
    reader.send("SUBSCRIBE", {"destination": "/queue/keep", "id": "k"})
    got = [int(reader.recv(timeout=10).headers["n"]) for _ in range(5)]
    assert got == [3, 4, 0, 1, 2]  # priority first, then send order, as before compaction


def test_compacted_durable_subscription_messages_stay_per_subscriber(broker_factory) -> None:
    broker = broker_factory(config_text=CONFIG)
    for name in ("a", "b"):
        c = client(broker, client_id=f"client-{name}")
        c.send("SUBSCRIBE", {"destination": "/topic/news", "id": "d", "ack": "client-individual",
                             "activemq.subscriptionName": name, "receipt": "r"})
        assert c.recv().command == "RECEIPT"
        c.send("DISCONNECT", {"receipt": "bye"})
        assert c.recv().command == "RECEIPT"
        c.close()
    producer = client(broker)
    send_batch(producer, "/topic/news", 0, 2)  # both subscriptions hold these
    a = client(broker, client_id="client-a")
    a.send("SUBSCRIBE", {"destination": "/topic/news", "id": "d", "ack": "client-individual",
                         "activemq.subscriptionName": "a"})
    first = a.recv()
    a.send("ACK", {"id": first.headers["ack"], "receipt": "acked"})  # a consumed message 0
    while a.recv().command != "RECEIPT":
        pass
    a.send("DISCONNECT", {"receipt": "bye"})
    while a.recv().command != "RECEIPT":
        pass
    consumer = client(broker)
    consumer.send("SUBSCRIBE", {"destination": "/queue/churn", "id": "s"})
    for round_ in range(20):
        send_batch(producer, "/queue/churn", round_ * 250, 250)
        for _ in range(250):
            consumer.recv(timeout=30)
    eventually(lambda: segments(broker) <= 5, "compaction down to 5 segments")
    broker.stop()
    broker.restart()
    for name, expected in (("a", [1]), ("b", [0, 1])):
        c = client(broker, client_id=f"client-{name}")
        c.send("SUBSCRIBE", {"destination": "/topic/news", "id": "d",
                             "activemq.subscriptionName": name})
        got = [int(c.recv(timeout=10).headers["n"]) for _ in expected]
        assert got == expected
        with pytest.raises(TimeoutError):  # and nothing it had consumed comes back
            c.recv(timeout=1.0)
        c.close()
