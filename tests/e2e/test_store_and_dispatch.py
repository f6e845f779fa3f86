"""Concurrent store and dispatch through the real broker: a persistent message a ready
consumer takes goes out before it is written, and is written only if it is still
unacknowledged when due (``[journal] store_delay_ms``). The promise of a RECEIPT does not
weaken: it comes once the message is durable or acknowledged by its consumer, so a kill -9 at
any moment loses nothing receipted."""

from __future__ import annotations

import random
import re
import threading
from typing import Any

import pytest

from sluice_testing import RawStomp

BODY = b"s" * (256 << 10)
STATS = re.compile(r"(\d+) messages deferred, (\d+) acknowledged before their write "
                   r"\(never written\), (\d+) written")


def config(delay_ms: float) -> str:
    return f"[journal]\nstore_delay_ms = {delay_ms}\n"


def client(b: Any) -> RawStomp:
    c = RawStomp(b.host, b.port, timeout=30)
    c.connect()
    return c


def stats(b: Any) -> tuple[int, int, int]:
    """(deferred, never written, written) from the log line of a clean stop."""
    found = STATS.findall(b.log())
    assert found, b.log()
    deferred, skipped, written = found[-1]
    return int(deferred), int(skipped), int(written)


def subscribe(c: RawStomp, ack: str, dest: str = "/queue/s") -> None:
    c.send("SUBSCRIBE", {"destination": dest, "id": "1", "ack": ack, "receipt": "sub"})
    assert c.recv().headers.get("receipt-id") == "sub"


def drain_until_marker(b: Any, dest: str = "/queue/s") -> list[str]:
    """Every message left in ``dest``, in order: a marker sent after them ends the read."""
    consumer = client(b)
    subscribe(consumer, "auto", dest)
    producer = client(b)
    producer.send("SEND", {"destination": dest, "persistent": "true", "n": "end",
                           "receipt": "end"}, b"")
    assert producer.recv().command == "RECEIPT"
    got: list[str] = []
    while True:
        frame = consumer.recv(timeout=30)
        if frame.headers["n"] == "end":
            break
        got.append(frame.headers["n"])
    consumer.close()
    producer.close()
    return got


def test_a_message_acknowledged_before_its_write_is_receipted_and_never_written(
        broker_factory) -> None:
    b = broker_factory(config_text=config(60_000))  # due only after a minute: the ACK wins
    consumer = client(b)
    subscribe(consumer, "client-individual")
    producer = client(b)
    producer.send("SEND", {"destination": "/queue/s", "persistent": "true", "n": "1",
                           "receipt": "r1"}, BODY)
    message = consumer.recv()
    assert message.body == BODY
    # Neither durable nor acknowledged: no receipt yet - read by order, not by a quiet window.
    # Every RECEIPT waits for the deferred message too, but an ERROR is written at once: the
    # answer to a later frame coming first shows r1's receipt was not written before it.
    producer.send("ABORT", {"transaction": "none", "receipt": "probe"})
    answer = producer.recv()
    assert (answer.command, answer.headers.get("receipt-id")) == ("ERROR", "probe")
    consumer.send("ACK", {"id": message.headers["ack"]})
    assert producer.recv().headers["receipt-id"] == "r1"
    consumer.close()
    producer.close()
    b.stop()
    assert stats(b) == (1, 1, 0)
    b.restart()
    assert drain_until_marker(b) == []  # acknowledged: gone, and no record of it was needed


def test_a_message_not_acknowledged_in_time_is_written_before_its_receipt(
        broker_factory) -> None:
    b = broker_factory(config_text=config(20))
    consumer = client(b)
    subscribe(consumer, "client-individual")
    producer = client(b)
    producer.send("SEND", {"destination": "/queue/s", "persistent": "true", "n": "1",
                           "receipt": "r1"}, BODY)
    assert consumer.recv().headers["n"] == "1"  # delivered, never acknowledged
    assert producer.recv().headers["receipt-id"] == "r1"  # after its write
    b.kill()
    consumer.close()
    producer.close()
    b.restart()
    assert drain_until_marker(b) == ["1"]


def test_a_receipt_waits_only_for_the_messages_its_own_connection_deferred(
        broker_factory) -> None:
    """One user's unacknowledged message (a live stream's chunk in flight, say) must not hold
    another user's receipts: each connection's receipts wait for what it deferred itself."""
    b = broker_factory(config_text=config(60_000))  # due only after a minute: the ACK decides
    consumer = client(b)
    subscribe(consumer, "client-individual")
    streamer = client(b)
    streamer.send("SEND", {"destination": "/queue/s", "persistent": "true", "n": "1",
                           "receipt": "mine"}, BODY)
    held = consumer.recv()  # deferred, delivered, not acknowledged
    other = client(b)
    other.send("SEND", {"destination": "/queue/elsewhere", "persistent": "true", "n": "2",
                        "receipt": "theirs"}, b"small")
    assert other.recv().headers.get("receipt-id") == "theirs"  # while "mine" still waits
    other.send("SEND", {"destination": "/queue/s", "persistent": "true", "n": "3",
                        "receipt": "theirs-too"}, b"small")  # deferred too, behind n=1
    second = consumer.recv()
    assert second.headers["n"] == "3"
    consumer.send("ACK", {"id": second.headers["ack"]})
    assert other.recv().headers.get("receipt-id") == "theirs-too"  # its own one settled
    streamer.send("ABORT", {"transaction": "none", "receipt": "probe"})
    answer = streamer.recv()  # "mine" was not written before this ERROR: it still waits
    assert (answer.command, answer.headers.get("receipt-id")) == ("ERROR", "probe")
    consumer.send("ACK", {"id": held.headers["ack"]})
    assert streamer.recv().headers["receipt-id"] == "mine"
    for c in (consumer, streamer, other):
        c.close()
    b.kill()
    b.restart()
    assert drain_until_marker(b) == []  # both acknowledged: neither needed a record
    assert drain_until_marker(b, "/queue/elsewhere") == ["2"]


def test_messages_whose_write_is_deferred_take_room_in_the_store_from_their_send(
        broker_factory: Any) -> None:
    """A consumer (client acks, prefetch 1000) that never acknowledges, writes deferred 5 s,
    a 1 MiB store of 256 KiB segments: a burst of 600 x 4 KiB persistent SENDs without
    receipts meets ``store limit reached`` once the journal and the deferred bodies reach
    1 MiB, fewer than 256 messages in (was: all 600 went out, 2.3 MiB, none counted until
    its write). The RECEIPT of a SEND after them comes once the deferred ones are written;
    what went in is delivered in order."""
    b = broker_factory(config_text=config(5000) + "segment_bytes = 262144\npreallocate = "
                       "false\n\n[limits]\nstore_limit = \"1 MiB\"\n\n[defaults]\n"
                       "fail_if_no_space = true\n")
    consumer = client(b)
    consumer.send("SUBSCRIBE", {"destination": "/queue/s", "id": "1", "ack": "client",
                                "activemq.prefetchSize": "1000", "receipt": "sub"})
    assert consumer.recv().headers.get("receipt-id") == "sub"
    producer = client(b)
    for i in range(600):
        producer.send("SEND", {"destination": "/queue/s", "persistent": "true",
                               "n": str(i)}, b"d" * 4096)
    producer.send("SEND", {"destination": "/queue/other", "receipt": "after"}, b"")
    refused = 0
    while (frame := producer.recv()).command == "ERROR":
        assert frame.headers["message"] == (
            "/queue/s cannot take the message: store limit reached (1048576 bytes of journal)")
        refused += 1
    assert frame.headers["receipt-id"] == "after"
    taken = 600 - refused
    assert 0 < taken < 256
    got = [consumer.recv(timeout=30) for _ in range(taken)]
    assert [m.headers["n"] for m in got] == [str(i) for i in range(taken)]
    consumer.send("ACK", {"ack": got[-1].headers["ack"], "receipt": "acked"})
    assert consumer.recv(timeout=30).headers.get("receipt-id") == "acked"
    consumer.close()
    producer.close()


def test_an_ack_auto_consumer_that_reads_takes_messages_that_are_never_written(
        broker_factory) -> None:
    b = broker_factory(config_text=config(60_000))
    consumer = client(b)
    subscribe(consumer, "auto")
    producer = client(b)
    for n in range(20):
        producer.send("SEND", {"destination": "/queue/s", "persistent": "true", "n": str(n),
                               "receipt": str(n)}, BODY)
        assert consumer.recv().headers["n"] == str(n)
        assert producer.recv().headers["receipt-id"] == str(n)  # once its bytes were read
    consumer.close()
    producer.close()
    b.stop()
    assert stats(b) == (20, 20, 0)


class Stream:
    """A producer (8 receipted SENDs in flight) and a live consumer on one queue, each in a
    thread, until the broker dies under them."""

    def __init__(self, b: Any, ack: str, first: int) -> None:
        self.ack = ack
        self.receipted: set[str] = set()
        self.consumed: set[str] = set()  # read (ack:auto) or acknowledged (client acks)
        self.consumer = client(b)
        subscribe(self.consumer, ack)
        self.producer = client(b)
        self.first = first
        self.threads = [threading.Thread(target=self._produce, daemon=True),
                        threading.Thread(target=self._consume, daemon=True)]
        for t in self.threads:
            t.start()

    def _produce(self) -> None:
        n = self.first
        outstanding = 0
        try:
            while True:
                while outstanding < 8:
                    self.producer.send("SEND", {"destination": "/queue/s", "persistent": "true",
                                                "n": str(n), "receipt": str(n)}, BODY)
                    n += 1
                    outstanding += 1
                frame = self.producer.recv()
                if frame.command == "RECEIPT":
                    self.receipted.add(frame.headers["receipt-id"])
                    outstanding -= 1
        except (OSError, ConnectionError, TimeoutError):
            return

    def _consume(self) -> None:
        try:
            while True:
                frame = self.consumer.recv()
                if self.ack != "auto":
                    self.consumer.send("ACK", {"id": frame.headers["ack"]})
                self.consumed.add(frame.headers["n"])
        except (OSError, ConnectionError, TimeoutError):
            return

    def join(self) -> None:
        for t in self.threads:
            t.join(60)
            assert not t.is_alive()
        self.consumer.close()
        self.producer.close()


@pytest.mark.parametrize("ack", ["auto", "client-individual"])
def test_kill_9_at_random_moments_of_a_stream_with_a_live_consumer_loses_nothing_receipted(
        broker_factory, ack: str) -> None:
    b = broker_factory(config_text=config(5))
    rng = random.Random(f"store-and-dispatch-{ack}")
    first = 0
    for _cycle in range(3):
        stream = Stream(b, ack, first)
        want = rng.randrange(5, 60)
        while len(stream.receipted) < want:  # bounded: each recv in the stream has a timeout
            assert any(t.is_alive() for t in stream.threads), b.log()
            stream.threads[0].join(0.01)
        b.kill()
        stream.join()
        b.restart()
        left = set(drain_until_marker(b))
        lost = stream.receipted - stream.consumed - left
        assert not lost, f"receipted, never consumed and gone after kill -9: {sorted(lost)}"
        first += 100_000
