"""Spec: producer flow control over real sockets. A producer sending to a full destination is
slowed (its receipts stop until there is room) or refused with an ERROR (fail_if_no_space);
producers and consumers of other destinations are not held up; a full disk loses nothing that
was receipted."""

from __future__ import annotations

import os
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sluice_testing import BrokerProcess, RawStomp, eventually, tmpfs

CONFIG = """
[limits]
max_message_bytes = "64 KiB"
[[policy]]
queue = "vm.>"
cursor = "vm"
memory_limit = "64 KiB"
[[policy]]
queue = "strict.>"
cursor = "vm"
memory_limit = "64 KiB"
fail_if_no_space = true
"""
BODY = b"y" * 1024


def client(broker: BrokerProcess) -> RawStomp:
    c = RawStomp(broker.host, broker.port, timeout=30)
    c.connect()
    return c


def send(c: RawStomp, destination: str, n: int, *, body: bytes = BODY,
         persistent: bool = True) -> None:
    headers = {"destination": destination, "receipt": str(n), "n": str(n)}
    if persistent:
        headers["persistent"] = "true"
    c.send("SEND", headers, body)


def receipt_within(c: RawStomp, seconds: float) -> str | None:
    try:
        frame = c.recv(timeout=seconds)
    except TimeoutError:
        return None
    assert frame.command == "RECEIPT", frame
    return frame.headers["receipt-id"]


def test_a_full_destination_slows_its_producer_and_releases_it_when_drained(
        broker_factory) -> None:
    broker = broker_factory(config_text=CONFIG)
    producer, other = client(broker), client(broker)
    sent = 0
    while True:  # ~2 KiB of RAM per message: about 32 fit under the 64 KiB limit
        send(producer, "/queue/vm.orders", sent)
        sent += 1
        if receipt_within(producer, 2.0) is None:
            break
        assert sent < 200, "flow control never engaged"
    blocked_at = sent
    assert 20 <= blocked_at <= 60

    # Another destination on another connection is not held up.
    for i in range(50):
        send(other, "/queue/elsewhere", i)
        assert receipt_within(other, 5.0) == str(i)

    consumer = client(broker)
    consumer.send("SUBSCRIBE", {"destination": "/queue/vm.orders", "id": "s"})
    assert receipt_within(producer, 10.0) == str(blocked_at - 1)  # the waiting SEND went in
    for i in range(blocked_at, blocked_at + 100):  # and the producer runs freely again
        send(producer, "/queue/vm.orders", i)
        assert receipt_within(producer, 10.0) == str(i)
    got = [int(consumer.recv(timeout=10).headers["n"]) for _ in range(blocked_at + 100)]
    assert got == list(range(blocked_at + 100))  # nothing lost, nothing reordered


def test_frames_behind_a_waiting_send_wait_with_it_in_order(broker_factory) -> None:
    broker = broker_factory(config_text=CONFIG)
    producer = client(broker)
    frames = b"".join(
        b"SEND\ndestination:/queue/vm.pipe\npersistent:true\nn:%d\nreceipt:%d\n\n%s\x00"
        % (i, i, BODY) for i in range(80))
    producer.send_bytes(frames)  # all pipelined: the broker stops reading part-way
    receipts = []
    while (r := receipt_within(producer, 2.0)) is not None:
        receipts.append(int(r))
    assert receipts == list(range(len(receipts))) and len(receipts) < 80
    consumer = client(broker)
    consumer.send("SUBSCRIBE", {"destination": "/queue/vm.pipe", "id": "s"})
    while len(receipts) < 80:
        r = receipt_within(producer, 10.0)
        assert r is not None
        receipts.append(int(r))
    assert receipts == list(range(80))
    assert [int(consumer.recv().headers["n"]) for _ in range(80)] == list(range(80))


def test_fail_if_no_space_answers_with_an_error_and_keeps_the_connection(
        broker_factory) -> None:
    broker = broker_factory(config_text=CONFIG)
    producer = client(broker)
    errors = []
    for i in range(60):
        send(producer, "/queue/strict.q", i)
        frame = producer.recv(timeout=5)
        if frame.command == "ERROR":
            errors.append((i, frame))
    assert errors, "the destination never filled up"
    first, frame = errors[0]
    assert frame.headers["receipt-id"] == str(first)
    assert "memory limit" in frame.headers["message"]
    send(producer, "/queue/anything.else", 1000)  # same connection, other destination: fine
    assert receipt_within(producer, 5.0) == "1000"


def test_a_message_over_the_size_limit_is_refused(broker_factory) -> None:
    broker = broker_factory(config_text=CONFIG)
    producer = client(broker)
    send(producer, "/queue/big", 1, body=b"z" * (65 << 10))
    frame = producer.recv(timeout=5)
    assert frame.command == "ERROR" and "exceeds the limit" in frame.headers["message"]
    send(producer, "/queue/big", 2, body=b"z" * (64 << 10))
    assert receipt_within(producer, 5.0) == "2"


def test_a_slow_topic_subscriber_does_not_slow_the_fast_one(broker_factory) -> None:
    broker = broker_factory(config_text='[limits]\nmemory_limit = "4 MiB"\n')
    slow, fast, producer = client(broker), client(broker), client(broker)
    slow.send("SUBSCRIBE", {"destination": "/topic/ticks", "id": "s", "ack": "client",
                            "activemq.prefetchSize": "1", "receipt": "s"})
    fast.send("SUBSCRIBE", {"destination": "/topic/ticks", "id": "f", "receipt": "f"})
    assert slow.recv().command == fast.recv().command == "RECEIPT"
    count = 20_000  # 20 MiB non-persistent: five times the memory limit
    started = time.monotonic()
    for start in range(0, count, 1000):
        producer.send_bytes(b"".join(
            b"SEND\ndestination:/topic/ticks\nn:%d\n%s\n%s\x00"
            % (i, b"receipt:%d\n" % i if i == start + 999 else b"", BODY)
            for i in range(start, start + 1000)))
        assert receipt_within(producer, 30.0) == str(start + 999)
        for i in range(start, start + 1000):
            assert int(fast.recv().headers["n"]) == i
    assert time.monotonic() - started < 30
    first = slow.recv()
    assert first.headers["n"] == "0"  # the slow one still gets everything, from temp files
    assert list(Path(broker.data_dir).glob("journal/*.log"))  # (nothing was journaled for it)


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs for a whole broker's data dir, so ENOSPC is real (needs root)."""
    with tmpfs(tmp_path / "tiny", "16m") as mnt:
        yield mnt


def test_a_full_disk_refuses_sends_loses_nothing_receipted_and_recovers(
        tiny_disk: Path, tmp_path: Path) -> None:
    config = tmp_path / "tiny.toml"
    config.write_text('[limits]\nstore_limit = "1 GiB"\n'  # let the disk, not the limit, fill
                      "[journal]\nsegment_bytes = 1048576\npreallocate = false\n")
    broker = BrokerProcess(tiny_disk / "data", ["--config", str(config)])
    broker.start()
    try:
        free = os.statvfs(tiny_disk)
        filler = tiny_disk / "filler"  # someone else fills the disk: about 3 MiB stay free
        filler.write_bytes(bytes(max(free.f_bavail * free.f_frsize - (3 << 20), 0)))
        producer = client(broker)
        receipted: list[int] = []
        refused = None
        for i in range(20_000):
            send(producer, "/queue/disk", i, body=b"d" * 4096)
            frame = producer.recv(timeout=30)
            if frame.command == "ERROR":
                refused = frame
                break
            receipted.append(i)
        assert refused is not None, "the disk never filled"
        assert "No space left on device" in refused.headers["message"]
        assert len(receipted) > 100

        filler.unlink()  # space returns
        consumer = client(broker)
        consumer.send("SUBSCRIBE", {"destination": "/queue/disk", "id": "s"})
        got = []
        while True:
            try:
                frame = consumer.recv(timeout=3)
            except TimeoutError:
                break
            got.append(int(frame.headers["n"]))
        assert set(receipted) <= set(got)  # every receipted message was delivered
        send(producer, "/queue/disk", 99_999, body=b"d" * 4096)
        assert receipt_within(producer, 10.0) == "99999"  # the journal works again
        assert int(consumer.recv(timeout=10).headers["n"]) == 99_999
        consumer.send("DISCONNECT", {"receipt": "bye"})
        assert consumer.recv(timeout=10).command == "RECEIPT"
        broker.stop()
        broker.start()  # the journal it left is intact and fully consumed
        assert "recovered 0 messages" in broker.log().split("sluice: stopped")[-1]
    finally:
        broker.kill()


SPARES_ON_A_SMALL_DISK = """
[limits]
store_limit = "1 GiB"
[journal]
segment_bytes = 262144
recycle_bytes = 8388608
recycle_min_free = 4194304
store_delay_ms = 0
"""


def journal_metric(broker: BrokerProcess, name: str) -> float:
    with urllib.request.urlopen(f"{broker.console_url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"no sample {name}")


def free_bytes(path: Path) -> int:
    fs = os.statvfs(path)
    return fs.f_bavail * fs.f_frsize


def test_spare_segment_files_give_their_room_back_below_the_free_floor(
        tiny_disk: Path, tmp_path: Path) -> None:
    """A drained stream leaves spare journal files; when something else fills the disk below
    ``recycle_min_free`` the broker deletes them within a tick, so that writer gets the room
    and the next persistent producer is neither blocked nor refused."""
    config = tmp_path / "spares.toml"
    config.write_text(SPARES_ON_A_SMALL_DISK)
    broker = BrokerProcess(tiny_disk / "data", ["--config", str(config)])
    broker.start()
    try:
        producer, consumer = client(broker), client(broker)
        for i in range(60):  # a 3 MiB stream, then drained: ~11 segments reclaimed
            send(producer, "/queue/chunks", i, body=bytes([i]) * 51200)
            assert receipt_within(producer, 30) == str(i)
        consumer.send("SUBSCRIBE", {"destination": "/queue/chunks", "id": "c"})
        for i in range(60):
            assert int(consumer.recv(timeout=30).headers["n"]) == i
        eventually(lambda: journal_metric(broker, "sluice_journal_spare_bytes") >= 2 << 20,
                   "the drained stream's segment files kept as spares")
        spare = journal_metric(broker, "sluice_journal_spare_bytes")
        assert journal_metric(broker, "sluice_journal_spares_released_total") == 0

        others = tiny_disk / "others"  # another writer takes the disk down to 1.5 MiB free
        others.write_bytes(bytes(free_bytes(tiny_disk) - (3 << 19)))
        eventually(lambda: free_bytes(tiny_disk) >= 4 << 20, "spares given back to the floor")
        assert journal_metric(broker, "sluice_journal_spare_bytes") <= spare - (5 << 19)
        assert journal_metric(broker, "sluice_journal_spares_released_total") >= 10
        with others.open("ab") as more:  # the room is the other writer's now
            more.write(bytes(2 << 20))
        eventually(lambda: journal_metric(broker, "sluice_journal_spare_bytes") == 0,
                   "below the floor again: the rest given back too")

        for i in range(100, 110):  # and the journal still takes persistent messages at once
            send(producer, "/queue/chunks", i, body=b"p" * 51200)
            assert receipt_within(producer, 10) == str(i)
            assert int(consumer.recv(timeout=30).headers["n"]) == i
    finally:
        broker.kill()


def test_max_consumers_refuses_one_subscription_too_many(broker_factory) -> None:
    broker = broker_factory(config_text='[[policy]]\nqueue = "solo"\nmax_consumers = 1\n')
    first, second = client(broker), client(broker)
    first.send("SUBSCRIBE", {"destination": "/queue/solo", "id": "a", "receipt": "a"})
    assert first.recv().command == "RECEIPT"
    second.send("SUBSCRIBE", {"destination": "/queue/solo", "id": "b", "receipt": "b"})
    frame = second.recv()
    assert frame.command == "ERROR" and "maximum of 1 consumers" in frame.headers["message"]
    first.send("UNSUBSCRIBE", {"id": "a", "receipt": "u"})
    assert first.recv().command == "RECEIPT"
    second.send("SUBSCRIBE", {"destination": "/queue/solo", "id": "b", "receipt": "b2"})
    assert second.recv().headers.get("receipt-id") == "b2"
