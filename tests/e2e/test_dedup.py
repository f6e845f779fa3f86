"""Duplicate detection for every producer (docs/replay-protocol.md, section 4) against the real
broker: a SEND numbered at or below the highest stored number of its producer id is dropped and
receipted with sluice-duplicate:true, across kill -9, segment reclaim and index snapshots."""

from __future__ import annotations

import queue
from typing import Any

import pytest
import stomp

from sluice_testing import eventually, held
from sluicemq import Client
from sluicemq.storage.segment import segment_name

SMALL_SEGMENTS = """
[journal]
segment_bytes = 65536
snapshot_records = 0
"""


def drain(c: Client, dest: str) -> list[bytes]:
    """Everything the queue holds, each message awaited (the broker says how many)."""
    return held(c, dest)


def test_a_resend_under_the_same_number_is_stored_once(broker) -> None:
    with Client(broker.url, producer_id="orders-writer") as c:
        first = c.send("/queue/d", b"order-1")
        assert first.producer_seq is not None and not first.duplicate
        again = c.send("/queue/d", b"order-1", producer_seq=first.producer_seq)
        assert again.duplicate
        assert not c.send("/queue/d", b"order-2").duplicate  # numbering carries on above
        assert drain(c, "/queue/d") == [b"order-1", b"order-2"]


def test_numbers_are_per_producer_id_and_gaps_are_fine(broker) -> None:
    with Client(broker.url) as c:
        def send(pid: str, seq: int) -> bool:
            headers = {"sluice-producer-id": pid, "sluice-producer-seq": str(seq)}
            return c.send("/queue/ids", f"{pid}{seq}", headers).duplicate

        assert [send("a", 5), send("b", 1), send("a", 9), send("a", 7), send("b", 1)] == [
            False, False, False, True, True]
        assert drain(c, "/queue/ids") == [b"a5", b"b1", b"a9"]


class Receipts(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.frames: queue.Queue[Any] = queue.Queue()

    def on_receipt(self, frame: Any) -> None:
        self.frames.put(frame)

    def on_error(self, frame: Any) -> None:
        self.frames.put(frame)


def test_stomp_py_producers_get_the_duplicate_flag_on_the_receipt(broker) -> None:
    conn = stomp.Connection12([(broker.host, broker.port)], auto_content_length=True,
                              heartbeats=(0, 0))
    listener = Receipts()
    conn.set_listener("r", listener)
    conn.connect(wait=True)
    headers = {"persistent": "true", "sluice-producer-id": "py-1", "sluice-producer-seq": "1"}
    for receipt in ("r1", "r2"):
        conn.send("/queue/py", "hello", headers=headers, receipt=receipt)
    first, second = listener.frames.get(timeout=5), listener.frames.get(timeout=5)
    assert first.headers["receipt-id"] == "r1" and "sluice-duplicate" not in first.headers
    assert second.headers["receipt-id"] == "r2"
    assert second.headers["sluice-duplicate"] == "true"
    conn.disconnect()
    with Client(broker.url) as c:
        assert drain(c, "/queue/py") == [b"hello"]


def test_the_table_survives_kill_9(broker) -> None:
    with Client(broker.url, producer_id="p", producer_seq=1) as c:
        for i in range(10):  # the first one writes the table's anchor; the rest are replayed
            c.send("/queue/k", f"m{i}")
    broker.kill()
    broker.restart()
    with Client(broker.url, producer_id="p") as c:
        assert c.send("/queue/k", b"m9", producer_seq=10).duplicate
        assert c.send("/queue/k", b"m3", producer_seq=4).duplicate
        assert not c.send("/queue/k", b"m10", producer_seq=11).duplicate
        assert len(drain(c, "/queue/k")) == 11


def test_the_table_survives_segment_reclaim_and_clean_restarts(broker_factory) -> None:
    b = broker_factory(config_text=SMALL_SEGMENTS)
    body = "x" * 4000
    with Client(b.url, producer_id="churn", producer_seq=1) as c:
        for _ in range(80):  # ~5 segments, all consumed: the records naming the producer go
            c.send("/queue/churn", body)
        assert len(drain(c, "/queue/churn")) == 80
        # ticks move the table's anchor off the oldest segment, which is then reclaimed
        eventually(lambda: not (b.data_dir / "journal" / segment_name(1)).exists(),
                   "the first segment reclaimed")
    b.kill()
    b.restart()
    with Client(b.url, producer_id="churn") as c:
        assert c.send("/queue/churn", body, producer_seq=80).duplicate
        assert c.send("/queue/churn", body, producer_seq=1).duplicate
    b.stop()
    b.restart()
    assert "index snapshot used" in b.log()
    with Client(b.url, producer_id="churn") as c:
        assert c.send("/queue/churn", body, producer_seq=80).duplicate
        assert drain(c, "/queue/churn") == []


def test_duplicates_inside_a_transaction_are_dropped_at_commit(broker, raw) -> None:
    with Client(broker.url) as c:
        c.send("/queue/tx", b"stored-1", {"sluice-producer-id": "t", "sluice-producer-seq": "1"})
    r = raw()
    r.connect()
    r.send("BEGIN", {"transaction": "tx"})
    for seq in ("1", "2", "2", "3"):
        r.send("SEND", {"transaction": "tx", "destination": "/queue/tx", "persistent": "true",
                        "sluice-producer-id": "t", "sluice-producer-seq": seq}, seq.encode())
    r.send("COMMIT", {"transaction": "tx", "receipt": "c"})
    receipt = r.recv()
    assert receipt.command == "RECEIPT" and receipt.headers["sluice-duplicates"] == "2"
    broker.kill()
    broker.restart()
    with Client(broker.url) as c:
        dup = c.send("/queue/tx", b"3", {"sluice-producer-id": "t", "sluice-producer-seq": "3"})
        assert dup.duplicate
        assert drain(c, "/queue/tx") == [b"stored-1", b"2", b"3"]


def test_numbered_transactional_sends_with_our_client(broker) -> None:
    with Client(broker.url, producer_id="txp", producer_seq=100) as c:
        with c.transaction() as tx:
            tx.send("/queue/ntx", b"a")
            tx.send("/queue/ntx", b"b")
        assert c.send("/queue/ntx", b"b", producer_seq=101).duplicate
        assert drain(c, "/queue/ntx") == [b"a", b"b"]


def test_bad_producer_headers_get_an_error_and_the_connection_keeps_serving(broker,
                                                                           raw) -> None:
    r = raw()
    r.connect()
    for headers in ({"sluice-producer-id": "a"}, {"sluice-producer-seq": "1"},
                    {"sluice-producer-id": "a", "sluice-producer-seq": "-3"},
                    {"sluice-producer-id": "a", "sluice-producer-seq": "ten"},
                    {"sluice-producer-id": "a", "sluice-producer-seq": "9" * 5000},
                    {"sluice-producer-id": "a" * 300, "sluice-producer-seq": "1"}):
        r.send("SEND", {"destination": "/queue/bad", "receipt": "x", **headers}, b"?")
        f = r.recv()
        assert f.command == "ERROR" and f.headers["receipt-id"] == "x", f
        assert "sluice-producer" in f.headers["message"]
    r.send("BEGIN", {"transaction": "t"})
    r.send("SEND", {"destination": "/queue/bad", "transaction": "t", "receipt": "y",
                    "sluice-producer-id": "a"}, b"?")
    assert r.recv().command == "ERROR"  # checked at SEND, not only at COMMIT
    r.send("SEND", {"destination": "/queue/bad", "receipt": "ok"}, b"fine")
    assert r.recv().command == "RECEIPT"
    with Client(broker.url) as c:
        assert drain(c, "/queue/bad") == [b"fine"]


def test_a_client_without_producer_id_refuses_a_producer_seq(broker) -> None:
    with Client(broker.url) as c, pytest.raises(ValueError):
        c.send("/queue/x", b"", producer_seq=3)
    with pytest.raises(ValueError):
        Client(broker.url, producer_id="line\nbreak")




def test_a_send_without_receipt_in_time_tells_its_number_for_the_resend(broker) -> None:
    import os
    import signal

    from sluicemq import ClientError

    with Client(broker.url, producer_id="slow", producer_seq=40, timeout=2.0) as c:
        c.send("/queue/slow", b"first")
        os.kill(broker.pid, signal.SIGSTOP)  # the broker stalls: the RECEIPT does not come
        try:
            with pytest.raises(ClientError, match="no receipt") as err:
                c.send("/queue/slow", b"second")
        finally:
            os.kill(broker.pid, signal.SIGCONT)
        assert err.value.producer_seq == 41
        assert c.send("/queue/slow", b"second", producer_seq=41).duplicate  # it got there
        assert drain(c, "/queue/slow") == [b"first", b"second"]
