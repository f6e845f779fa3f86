"""Spec of per-connection and broker-wide resource limits, each set low in a [limits] table."""

from __future__ import annotations

from typing import Any

import pytest

from sluice_testing import RawStomp, eventually, nothing_delivered
from sluicemq.client import Client
from sluicemq.errors import ClientError
from sluicemq.protocol.frames import Frame

LIMITS = """
[limits]
max-connections = 5
max-subscriptions = 3
max-unacked = 5
max-transactions = 2
slow-reader-seconds = 1.0
max-frame-bytes = 1048576
max-headers = 20
"""


@pytest.fixture
def limited(broker_factory: Any) -> Any:
    return broker_factory(config_text=LIMITS)


class Raw(RawStomp):
    """A bare STOMP 1.2 socket; `rcvbuf` shrinks the kernel buffer to play a stuck reader."""

    def __init__(self, b: Any, rcvbuf: int | None = None) -> None:
        super().__init__(b.host, b.port, rcvbuf=rcvbuf)

    def connect(self) -> Frame:
        self.send("CONNECT", {"accept-version": "1.2", "host": "h", "heart-beat": "0,0"})
        return self.recv()


def test_connections_beyond_the_limit_get_an_error_and_are_closed(limited: Any) -> None:
    held = [Raw(limited) for _ in range(5)]
    for r in held:
        assert r.connect().command == "CONNECTED"
    extra = Raw(limited)
    reply = extra.recv()
    assert reply.command == "ERROR"
    assert "too many connections" in reply.headers["message"]
    with pytest.raises((ConnectionError, OSError)):
        extra.recv(3)
    held.pop().sock.close()
    eventually(lambda: len(limited.api("connections")["connections"]) == 4,
               "the closed connection's slot freed")
    assert Raw(limited).connect().command == "CONNECTED"  # a freed slot is usable again


def test_subscriptions_per_connection_are_capped(limited: Any) -> None:
    with Client(limited.url, timeout=10) as c:
        for i in range(3):
            c.subscribe(f"/queue/s{i}")
        with pytest.raises(ClientError, match="too many subscriptions"):
            c.subscribe("/queue/s3")
        c.send("/queue/s0", b"the connection stays usable")


def test_unacked_messages_per_subscription_are_capped(limited: Any) -> None:
    with Client(limited.url, timeout=10) as c:
        for i in range(12):
            c.send("/queue/u", str(i).encode())
        sub = c.subscribe("/queue/u", ack="client-individual", prefetch=100)
        first = [m for m in (sub.get(5) for _ in range(5)) if m is not None]
        assert len(first) == 5
        assert nothing_delivered(c, sub)  # prefetch 100 asked, 5 allowed
        first[0].ack()
        assert sub.get(5) is not None


def test_open_transactions_per_connection_are_capped(limited: Any) -> None:
    r = Raw(limited)
    assert r.connect().command == "CONNECTED"
    for tx in ("t1", "t2", "t3"):
        r.send("BEGIN", {"transaction": tx, "receipt": tx})
    assert r.recv().headers["receipt-id"] == "t1"
    assert r.recv().headers["receipt-id"] == "t2"
    refused = r.recv()
    assert refused.command == "ERROR"
    assert "too many open transactions" in refused.headers["message"]
    r.send("ABORT", {"transaction": "t1", "receipt": "a1"})
    assert r.recv().headers["receipt-id"] == "a1"
    r.send("BEGIN", {"transaction": "t3", "receipt": "t3"})
    assert r.recv().headers["receipt-id"] == "t3"


def test_frames_over_the_size_limit_are_refused(limited: Any) -> None:
    r = Raw(limited)
    assert r.connect().command == "CONNECTED"
    r.send("SEND", {"destination": "/queue/big"}, b"x" * (1 << 20))
    reply = r.recv()
    assert reply.command == "ERROR"
    with Client(limited.url, timeout=10) as c:  # the broker is fine
        c.send("/queue/big", b"x" * 1000)


def test_too_many_headers_are_refused(limited: Any) -> None:
    r = Raw(limited)
    assert r.connect().command == "CONNECTED"
    r.send("SEND", {"destination": "/queue/h", **{f"h{i}": "v" for i in range(30)}}, b"x")
    assert r.recv().command == "ERROR"


def test_a_reader_that_stops_reading_is_dropped_and_its_messages_redelivered(
        broker_factory: Any) -> None:
    limited = broker_factory(config_text="[limits]\nslow-reader-seconds = 1.0\n")
    stuck = Raw(limited, rcvbuf=4096)
    assert stuck.connect().command == "CONNECTED"
    stuck.send("SUBSCRIBE", {"destination": "/queue/slow", "id": "1", "ack": "client",
                             "activemq.prefetchSize": "50", "receipt": "s"})
    assert stuck.recv().headers["receipt-id"] == "s"
    body = b"z" * (512 << 10)
    count = 24  # 12 MiB: more than the kernel buffers plus the 4 MiB high-water mark
    with Client(limited.url, timeout=20) as producer:
        for _ in range(count):
            producer.send("/queue/slow", body)

        def served_and_dropped() -> bool:
            producer.send("/queue/alive", b"the broker keeps serving others")  # receipted
            return "slow reader" in limited.log()

        eventually(served_and_dropped, "the stuck reader dropped")
    with Client(limited.url, timeout=20) as consumer:
        sub = consumer.subscribe("/queue/slow", prefetch=5)
        got = [m for m in (sub.get(10) for _ in range(count)) if m is not None]
    assert len(got) == count and all(m.body == body for m in got)
    assert sum(m.headers.get("redelivered") == "true" for m in got) >= 1
