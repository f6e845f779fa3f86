"""Spec: a deep persistent backlog costs the broker bounded memory, survives a restart, drains in
order, and gives its journal space back once consumed (store cursor, issue #4).

The million-message version of the first spec is bench/backlog.py; here 100,000 messages of
1 KiB (about 100 MiB of journal) against a broker with a 32 MiB memory limit.
"""

from __future__ import annotations

from pathlib import Path

from sluice_testing import BrokerProcess, RawStomp, eventually, rss_mib
from sluicemq.protocol.codec import encode_frame
from sluicemq.protocol.frames import Frame

CONFIG = """
[limits]
memory_limit = "32 MiB"
[journal]
segment_bytes = 8388608
"""
COUNT = 100_000
BODY = b"x" * 1024


def produce(broker: BrokerProcess, destination: str, count: int, *, persistent: bool = True,
            batch: int = 2000, first: int = 0) -> None:
    """Pipelined SENDs (numbered in an `n` header), a receipt per batch."""
    c = RawStomp(broker.host, broker.port, timeout=60)
    c.connect()
    flag = {"persistent": "true"} if persistent else {}
    for start in range(first, first + count, batch):
        stop = min(start + batch, first + count)
        frames = [encode_frame(Frame("SEND", {"destination": destination, "n": str(i), **flag},
                                     BODY), "1.2") for i in range(start, stop - 1)]
        frames.append(encode_frame(Frame("SEND", {"destination": destination, "n": str(stop - 1),
                                                  "receipt": str(stop), **flag}, BODY), "1.2"))
        c.send_bytes(b"".join(frames))
        frame = c.recv(timeout=60)
        assert frame.command == "RECEIPT" and frame.headers["receipt-id"] == str(stop), frame
    c.close()


def consume(broker: BrokerProcess, destination: str, count: int, *, ack: str = "auto",
            prefetch: int = 1000) -> list[int]:
    """Receive `count` messages; returns their `n` headers in arrival order."""
    c = RawStomp(broker.host, broker.port, timeout=60)
    c.connect()
    c.send("SUBSCRIBE", {"destination": destination, "id": "s", "ack": ack,
                         "activemq.prefetchSize": str(prefetch)})
    seen: list[int] = []
    while len(seen) < count:
        frame = c.recv(timeout=60)
        assert frame.command == "MESSAGE", frame
        assert frame.body == BODY
        seen.append(int(frame.headers["n"]))
        if ack != "auto":
            c.send("ACK", {"id": frame.headers["ack"]})
    c.send("DISCONNECT", {"receipt": "bye"})
    while c.recv(timeout=30).command != "RECEIPT":
        pass  # prefetched beyond `count`, unacknowledged: they go back to the queue
    c.close()
    return seen


def journal_segments(broker: BrokerProcess) -> int:
    return len(list(Path(broker.data_dir, "journal").glob("*.log")))


def test_a_deep_backlog_stays_within_memory_survives_restart_and_drains_in_order(
        broker_factory) -> None:
    broker = broker_factory(config_text=CONFIG)
    idle = rss_mib(broker.pid)
    produce(broker, "/queue/deep", COUNT)
    loaded = rss_mib(broker.pid)
    # ~100 MiB of messages; a VM cursor would hold well over 150 MiB of objects.
    assert loaded - idle < 32, (idle, loaded)
    assert journal_segments(broker) >= 12

    first = consume(broker, "/queue/deep", 30_000, ack="client-individual")
    assert first == list(range(30_000))
    broker.stop()
    broker.restart()
    assert "recovered 70000 messages" in broker.log()
    assert rss_mib(broker.pid) - idle < 32
    rest = consume(broker, "/queue/deep", COUNT - 30_000)
    assert rest == list(range(30_000, COUNT))

    # consumed: every segment but the active one is deleted
    eventually(lambda: journal_segments(broker) <= 2, "consumed segments deleted")


def test_a_slow_consumer_behind_a_fast_producer_stays_bounded(broker_factory) -> None:
    broker = broker_factory(config_text=CONFIG)
    idle = rss_mib(broker.pid)
    slow = RawStomp(broker.host, broker.port, timeout=60)
    slow.connect()
    slow.send("SUBSCRIBE", {"destination": "/queue/slow", "id": "s", "ack": "client-individual",
                            "activemq.prefetchSize": "10"})
    got: list[int] = []
    for round_ in range(5):  # the producer sends 10,000 while the consumer takes 10
        produce(broker, "/queue/slow", 10_000, first=round_ * 10_000)
        for _ in range(10):
            frame = slow.recv(timeout=30)
            got.append(int(frame.headers["n"]))
            slow.send("ACK", {"id": frame.headers["ack"]})
    assert rss_mib(broker.pid) - idle < 32
    assert got == list(range(50))
    slow.close()
