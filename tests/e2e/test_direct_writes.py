"""Spec: large persistent messages written with O_DIRECT (``storage/direct.py``, ``aio.py``)
keep the journal's promises through the real broker.

* A kill -9 while direct writes are in flight (a producer keeps 8 large SENDs unreceipted, no
  consumer, the broker killed right after its ``k``-th receipt) loses no receipted message:
  after each restart every one is there, whole, in order, and nothing that was never sent.
* On a filesystem that refuses O_DIRECT (ramfs; tmpfs takes it since Linux 6.6) the journal
  says so once and writes through the page cache: the same messages come back after a kill -9,
  and ``sluice_journal_direct_bytes_total`` stays 0 where elsewhere it counts the writes. (ramfs
  reports no size either: the default store limit comes from the RAM, ``paging/flow.py``.)
"""

from __future__ import annotations

import hashlib
import random
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from sluice_testing import BrokerProcess, RawStomp, mounted

IN_FLIGHT = 8
KILL_AFTER = (3, 11, 26)  # receipts before each kill
REFUSED = "direct writes refused here"


def body(n: int) -> bytes:
    """256 KiB to 1.2 MiB (each a direct write ending mid-block), named by ``n``."""
    rng = random.Random(n)
    return rng.randbytes(rng.randrange(256 << 10, 1200 << 10))


def direct_bytes(b: BrokerProcess) -> float:
    with urllib.request.urlopen(f"{b.console_url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "sluice_journal_direct_bytes_total":
                return sample.value
    raise AssertionError("no sluice_journal_direct_bytes_total")


def produce_until_killed(b: BrokerProcess, first: int, receipts: int) -> set[int]:
    """Persistent SENDs numbered from ``first``, ``IN_FLIGHT`` unreceipted at any time; kill
    -9 right after the ``receipts``-th RECEIPT; returns the receipted numbers."""
    p = RawStomp(b.host, b.port, timeout=60)
    p.connect()
    receipted: set[int] = set()
    n = first
    for _ in range(IN_FLIGHT):
        p.send("SEND", {"destination": "/queue/direct", "persistent": "true", "n": str(n),
                        "sha": hashlib.sha256(body(n)).hexdigest(), "receipt": str(n)}, body(n))
        n += 1
    while len(receipted) < receipts:
        frame = p.recv(timeout=60)
        assert frame.command == "RECEIPT", frame
        receipted.add(int(frame.headers["receipt-id"]))
        p.send("SEND", {"destination": "/queue/direct", "persistent": "true", "n": str(n),
                        "sha": hashlib.sha256(body(n)).hexdigest(), "receipt": str(n)}, body(n))
        n += 1
    b.kill()
    p.close()
    return receipted


def stored(b: BrokerProcess) -> list[int]:
    """Every message of the queue (its depth, from the admin API), in order, each checked
    whole; client acks, none acked, so a later cycle finds them again."""
    depth = b.api("destinations/queue/direct")["depth"]
    c = RawStomp(b.host, b.port, timeout=60)
    c.connect()
    c.send("SUBSCRIBE", {"destination": "/queue/direct", "id": "d", "ack": "client",
                         "activemq.prefetchSize": "1000", "receipt": "s"})
    assert c.recv().command == "RECEIPT"
    found: list[int] = []
    for _ in range(depth):
        frame = c.recv(timeout=60)
        assert frame.command == "MESSAGE", frame
        n = int(frame.headers["n"])
        assert hashlib.sha256(frame.body).hexdigest() == frame.headers["sha"] == \
            hashlib.sha256(body(n)).hexdigest(), f"message {n} came back damaged"
        found.append(n)
    assert c.nothing_delivered()
    c.close()
    return found


def cycles(b: BrokerProcess) -> None:
    """Kill -9 mid-stream three times; after each restart the queue holds every receipted
    message, in order, whole, and only messages that were sent."""
    promised: set[int] = set()
    sent_below = 0
    for k, receipts in enumerate(KILL_AFTER):
        first = k * 10_000
        promised |= produce_until_killed(b, first, receipts)
        sent_below = first + receipts + IN_FLIGHT
        b.restart()
        found = stored(b)
        assert found == sorted(found), "reordered"
        assert len(set(found)) == len(found), "duplicated"
        assert promised <= set(found), f"receipted, lost: {sorted(promised - set(found))}"
        assert all(n < sent_below for n in found)


def test_kill_9_while_direct_writes_are_in_flight_loses_nothing_receipted(
        broker_factory) -> None:
    b = broker_factory()
    cycles(b)
    assert REFUSED not in b.log()
    p = RawStomp(b.host, b.port, timeout=60)
    p.connect()
    p.send("SEND", {"destination": "/queue/other", "persistent": "true", "receipt": "r"},
           body(1))
    assert p.recv(timeout=60).command == "RECEIPT"
    p.close()
    assert direct_bytes(b) >= len(body(1))


def test_a_filesystem_that_refuses_o_direct_is_written_through_the_page_cache(
        tmp_path: Path) -> None:
    with mounted(tmp_path / "ramfs", "ramfs") as mnt:
        b = BrokerProcess(mnt / "data")
        try:
            b.start()
            cycles(b)
            assert b.log().count(REFUSED) == len(KILL_AFTER), "once by each writing process"
            assert "reports no size" in b.log()
            assert direct_bytes(b) == 0
        finally:
            b.kill()
