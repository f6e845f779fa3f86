"""Client failover: a `failover:(...)` URL survives kill -9 of the master.

Producers keep sending through the takeover; every SEND whose receipt was outstanding is sent
again under its producer number, so the broker stores each message once: nothing receipted is
lost, nothing is consumed twice. Subscriptions come back with their ids and ack modes, and a
transaction open at the failure fails with an error the caller can retry.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import pytest

from ha_helpers import Cluster
from sluicemq import Client, ClientError
from sluicemq.client.failover import FailoverEvent, TransactionRolledBack

PRODUCERS = 4
PER_PRODUCER = 400
WINDOW = 16
RANGE = 4000


@pytest.fixture
def cluster(tmp_path: Path):
    c = Cluster(tmp_path / "shared")
    yield c
    c.close()


def failover_url(*brokers) -> str:
    inner = ",".join(b.url for b in brokers)
    return f"failover:({inner})?randomize=false&initialReconnectDelay=20&maxReconnectDelay=200"


def test_producers_and_a_consumer_across_kill_9_lose_nothing_and_duplicate_nothing(
        cluster) -> None:
    master = cluster.master()
    standby = cluster.standby()
    url = failover_url(master, standby)
    receipted: list[str] = []
    lock = threading.Lock()
    halfway = threading.Semaphore(0)
    failovers: list[FailoverEvent] = []
    errors: list[BaseException] = []

    def produce(n: int) -> None:
        try:
            with Client(url, timeout=30, on_failover=failovers.append) as c:
                window = []
                for i in range(PER_PRODUCER):
                    body = f"p{n}-{i}"
                    window.append((body, c.send_async("/queue/fo", body)))
                    if len(window) >= WINDOW:
                        done, r = window.pop(0)
                        r.result()
                        with lock:
                            receipted.append(done)
                    if i == PER_PRODUCER // 4:
                        halfway.release()
                for done, r in window:
                    r.result()
                    with lock:
                        receipted.append(done)
        except BaseException as exc:
            errors.append(exc)
            halfway.release()

    consumed: Counter[str] = Counter()
    uncertain: set[str] = set()  # ACK sent, connection lost before its receipt
    stop = threading.Event()

    def consume() -> None:
        try:
            with Client(url, timeout=30) as c, \
                    c.subscribe("/queue/fo", ack="client-individual", prefetch=50) as sub:
                while not stop.is_set():
                    msg = sub.get(timeout=0.2)
                    if msg is None:
                        continue
                    try:
                        msg.ack(receipt=True)
                    except ClientError as exc:
                        if "lost before the broker confirmed" in str(exc):
                            uncertain.add(msg.text())
                        continue  # stale: the broker redelivers it
                    consumed[msg.text()] += 1
        except BaseException as exc:
            errors.append(exc)

    producers = [threading.Thread(target=produce, args=(n,)) for n in range(PRODUCERS)]
    consumer = threading.Thread(target=consume)
    for t in [*producers, consumer]:
        t.start()
    for _ in producers:
        assert halfway.acquire(timeout=60)  # every producer is a quarter through
    master.kill()
    for t in producers:
        t.join(120)
    assert not errors, errors
    assert len(receipted) == PRODUCERS * PER_PRODUCER
    assert standby.listening.is_set()
    assert failovers and all(e.to_url == standby.url for e in failovers)
    # Whatever the live consumer did not take is still queued on the new master: drain it.
    stop.set()
    consumer.join(60)
    assert not errors, errors
    with Client(standby.url) as c:
        rest = c.head("/queue/fo").count
        with c.subscribe("/queue/fo", ack="client-individual") as sub:
            for _ in range(rest):
                msg = sub.get(timeout=10)
                assert msg is not None
                consumed[msg.text()] += 1
                msg.ack(receipt=True)
        assert c.head("/queue/fo").count == 0
    lost = set(receipted) - set(consumed) - uncertain
    duplicated = {b for b, n in consumed.items() if n > 1}
    assert (len(lost), len(duplicated)) == (0, 0)
    assert set(consumed) <= set(receipted)


def test_a_subscription_is_replayed_on_the_new_master(cluster) -> None:
    master = cluster.master()
    standby = cluster.standby()
    events: list[FailoverEvent] = []
    failed_over = threading.Event()

    def told(event: FailoverEvent) -> None:
        events.append(event)
        failed_over.set()

    with Client(failover_url(master, standby), client_id="sub-client",
                on_failover=told) as c:
        sub = c.subscribe("/queue/resub", ack="client-individual", id="orders-1")
        master.kill()
        assert failed_over.wait(30)
        assert (events[0].from_url, events[0].to_url) == (master.url, standby.url)
        assert events[0].resubscribed == 1
        with Client(standby.url) as other:
            other.send("/queue/resub", "after the takeover")
        msg = sub.get(timeout=10)
        assert msg is not None and msg.text() == "after the takeover"
        assert msg.subscription == "orders-1" and msg.ack_mode == "client-individual"
        msg.ack(receipt=True)


def test_a_durable_subscription_is_replayed_by_name(cluster) -> None:
    master = cluster.master()
    standby = cluster.standby()
    failed_over = threading.Event()
    with Client(failover_url(master, standby), client_id="durable-client",
                on_failover=lambda e: failed_over.set()) as c:
        sub = c.subscribe("/topic/news", durable_name="news-feed", ack="client-individual")
        with Client(master.url) as p:
            p.send("/topic/news", "one")
        first = sub.get(timeout=10)
        assert first is not None and first.text() == "one"
        first.ack(receipt=True)
        master.kill()
        assert failed_over.wait(30)
        with Client(standby.url) as p:
            p.send("/topic/news", "two")
        second = sub.get(timeout=10)
        assert second is not None and second.text() == "two"


def test_an_open_transaction_fails_with_a_retryable_error(cluster) -> None:
    master = cluster.master()
    standby = cluster.standby()
    failed_over = threading.Event()
    with Client(failover_url(master, standby), on_failover=lambda e: failed_over.set()) as c:
        tx = c.transaction()
        tx.send("/queue/tx", "inside")
        master.kill()
        assert failed_over.wait(30)
        with pytest.raises(TransactionRolledBack) as caught:
            tx.commit()
        assert caught.value.transaction == tx.id
        with c.transaction() as retry:  # the retry the error asks for
            retry.send("/queue/tx", "inside")
        assert c.head("/queue/tx").count == 1


def test_a_range_read_cut_by_a_failover_fails_and_reads_whole_again(cluster) -> None:
    """A range read is not replayed (it would deliver its range from the start again): it
    ends with an error, and the same read on the new master returns the whole range."""
    master = cluster.master()
    standby = cluster.standby()
    with Client(master.url) as p:
        for i in range(RANGE):  # more than a range reader buffers (client/ranges.py)
            p.send_async("/queue/range", f"r{i}", receipt=i == RANGE - 1)
        p.head("/queue/range")
    failed_over = threading.Event()
    with Client(failover_url(master, standby), on_failover=lambda e: failed_over.set()) as c:
        reader = c.read_range("/queue/range")
        seen = [next(iter(reader)).text()]
        master.kill()  # the reader thread notices once this caller makes room: keep reading
        with pytest.raises(ClientError, match="range read interrupted"):
            seen.extend(m.text() for m in reader)
        assert failed_over.wait(30)
        assert len(seen) < RANGE
        assert seen == [f"r{i}" for i in range(len(seen))]  # in order up to the cut
        again = [m.text() for m in c.read_range("/queue/range")]
        assert again == [f"r{i}" for i in range(RANGE)]


def test_a_client_gives_up_after_max_reconnect_attempts(cluster) -> None:
    """With no broker left to fail over to, maxReconnectAttempts bounds the retrying: the
    pending and later calls fail with the connection's error instead of waiting forever."""
    master = cluster.master()
    url = f"failover:({master.url})?maxReconnectAttempts=3&initialReconnectDelay=10"
    with Client(url, timeout=30) as c:
        c.send("/queue/alone", "stored")
        master.kill()
        with pytest.raises(ClientError):
            c.send("/queue/alone", "nowhere to go")
        assert not c.is_open
