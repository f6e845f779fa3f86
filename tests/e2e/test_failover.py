"""Client failover: a `failover:(...)` URL survives kill -9 of the master.

Producers keep sending through the takeover; every SEND whose receipt was outstanding is sent
again under its producer number, so the broker stores each message once: nothing receipted is
lost, nothing is consumed twice. Subscriptions come back with their ids and ack modes, messages
delivered but not acknowledged come back marked redelivered, and a transaction open at the
failure fails with an error the caller can retry.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import threading
from pathlib import Path

import pytest

from ha_helpers import Ledger, failover_url, free_port
from sluice_testing import make_ca, make_cert
from sluicemq import Client, ClientError
from sluicemq.client.failover import AckInDoubt, FailoverEvent, TransactionRolledBack
from sluicemq.tls import client_context

PRODUCERS = 8
CONSUMERS = 2
PER_PRODUCER = 250
WINDOW = 16
RANGE = 4000


def test_eight_producers_and_two_consumers_across_kill_9_lose_nothing_and_duplicate_nothing(
        cluster) -> None:
    """8 producers pipeline persistent sends and 2 consumers ack client-individual (each ACK
    receipted), all through failover URLs; the master is killed -9 mid-run. Every receipted
    message is confirmed consumed exactly once across the run (the ACKs a failover left in
    doubt are at most one per consumer, and each was stored or came back)."""
    master = cluster.master()
    standby = cluster.standby()
    url = failover_url(master, standby)
    ledger = Ledger()
    started = threading.Semaphore(0)
    failovers: list[FailoverEvent] = []
    errors: list[BaseException] = []

    def produce(n: int) -> None:
        try:
            with Client(url, timeout=60, on_failover=failovers.append) as c:
                window = []
                for i in range(PER_PRODUCER):
                    body = f"p{n}-{i}"
                    window.append((body, c.send_async("/queue/fo", body)))
                    if len(window) >= WINDOW:
                        done, r = window.pop(0)
                        r.result()
                        ledger.receipt(done)
                    if i == PER_PRODUCER // 4:
                        started.release()
                for done, r in window:
                    r.result()
                    ledger.receipt(done)
        except BaseException as exc:
            errors.append(exc)
            started.release()

    stop = threading.Event()

    def consume() -> None:
        try:
            with Client(url, timeout=60, on_failover=failovers.append) as c, \
                    c.subscribe("/queue/fo", ack="client-individual", prefetch=50) as sub:
                announced = False
                while not stop.is_set():
                    msg = sub.get(timeout=0.2)
                    if msg is None:
                        continue
                    ledger.ack(msg)
                    if not announced:
                        announced = True
                        started.release()
        except BaseException as exc:
            errors.append(exc)
            started.release()

    producers = [threading.Thread(target=produce, args=(n,)) for n in range(PRODUCERS)]
    consumers = [threading.Thread(target=consume) for _ in range(CONSUMERS)]
    for t in [*producers, *consumers]:
        t.start()
    for _ in range(PRODUCERS + CONSUMERS):  # every producer a quarter through, consumers busy
        assert started.acquire(timeout=60)
    master.kill()
    for t in producers:
        t.join(120)
    assert not errors, errors
    assert len(ledger.receipted) == PRODUCERS * PER_PRODUCER
    assert standby.listening.is_set()
    assert {e.to_url for e in failovers} == {standby.url}
    assert len(failovers) == PRODUCERS + CONSUMERS  # every client moved, once
    stop.set()
    for t in consumers:
        t.join(60)
    assert not errors, errors
    ledger.drain(standby.url, "/queue/fo")  # what the live consumers did not take
    assert (len(ledger.lost()), len(ledger.duplicated())) == (0, 0)
    assert set(ledger.consumed) <= set(ledger.receipted)
    assert len(ledger.in_doubt - set(ledger.consumed)) <= CONSUMERS


def test_delivered_but_unacknowledged_messages_come_back_redelivered(cluster) -> None:
    master = cluster.master()
    standby = cluster.standby()
    failed_over = threading.Event()
    with Client(master.url) as p:
        for i in range(5):
            p.send("/queue/redeliver", f"m{i}")
    with Client(failover_url(master, standby), on_failover=lambda e: failed_over.set()) as c:
        sub = c.subscribe("/queue/redeliver", ack="client-individual", prefetch=10)
        first = [sub.get(timeout=10) for _ in range(5)]
        assert all(m is not None and not m.redelivered for m in first)
        for msg in first[:2]:
            msg.ack(receipt=True)  # m0, m1 are done; m2..m4 stay unacknowledged
        master.kill()
        assert failed_over.wait(30)
        c.send("/queue/redeliver", "fresh")
        again = [sub.get(timeout=10) for _ in range(4)]
        assert [m.text() for m in again] == ["m2", "m3", "m4", "fresh"]
        assert [m.redelivered for m in again] == [True, True, True, False]
        assert [m.message_id for m in again[:3]] == [m.message_id for m in first[2:]]
        for msg in again:
            msg.ack(receipt=True)
        assert c.head("/queue/redeliver").count == 0


def test_an_ack_cut_by_the_failure_is_in_doubt_and_never_handed_out_again(cluster) -> None:
    """The master is paused, so the ACK written to it is never processed; the master is then
    killed. The caller hears `AckInDoubt`; the new master redelivers the message, and the
    client acknowledges that copy itself instead of handing it out a second time."""
    master = cluster.master()
    standby = cluster.standby()
    failed_over = threading.Event()
    with Client(master.url) as p:
        p.send("/queue/doubt", "once")
    with Client(failover_url(master, standby), on_failover=lambda e: failed_over.set()) as c:
        sub = c.subscribe("/queue/doubt", ack="client-individual")
        msg = sub.get(timeout=10)
        assert msg is not None and msg.text() == "once"
        os.kill(master.pid, signal.SIGSTOP)
        outcome: list[BaseException | None] = []
        acking = threading.Thread(target=lambda: outcome.append(_ack(msg)))
        acking.start()
        while not c._track.ack_receipts and acking.is_alive():  # the ACK is on the wire
            acking.join(0.01)
        master.kill()
        acking.join(60)
        assert isinstance(outcome[0], AckInDoubt)
        assert failed_over.wait(30)
        c.send("/queue/doubt", "after")
        nxt = sub.get(timeout=10)
        assert nxt is not None and nxt.text() == "after"  # "once" came back and was taken
        nxt.ack(receipt=True)
        assert c.head("/queue/doubt").count == 0


def _ack(msg) -> BaseException | None:
    try:
        msg.ack(receipt=True)
    except ClientError as exc:
        return exc
    return None


def test_a_subscription_is_replayed_on_the_new_master(cluster, caplog) -> None:
    """The callback and the log both say that the connection failed over, and to where."""
    master = cluster.master()
    standby = cluster.standby()
    events: list[FailoverEvent] = []
    failed_over = threading.Event()

    def told(event: FailoverEvent) -> None:
        events.append(event)
        failed_over.set()

    caplog.set_level(logging.WARNING, logger="sluicemq.client")
    with Client(failover_url(master, standby), client_id="sub-client",
                on_failover=told) as c:
        sub = c.subscribe("/queue/resub", ack="client-individual", id="orders-1")
        master.kill()
        assert failed_over.wait(30)
        assert (events[0].from_url, events[0].to_url) == (master.url, standby.url)
        assert events[0].resubscribed == 1
        assert f"failed over from {master.url} to {standby.url}" in caplog.text
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
    pad = "x" * (12 << 10)  # 48 MB in all: more than the reader and the sockets buffer
    with Client(master.url) as p:
        for i in range(RANGE):
            p.send_async("/queue/range", f"r{i} {pad}", receipt=i == RANGE - 1)
        p.head("/queue/range")
    failed_over = threading.Event()
    with Client(failover_url(master, standby), on_failover=lambda e: failed_over.set()) as c:
        reader = c.read_range("/queue/range")
        seen = [next(iter(reader)).text().split()[0]]
        master.kill()  # the reader thread notices once this caller makes room: keep reading
        with pytest.raises(ClientError, match="range read interrupted"):
            seen.extend(m.text().split()[0] for m in reader)
        assert failed_over.wait(30)
        assert len(seen) < RANGE
        assert seen == [f"r{i}" for i in range(len(seen))]  # in order up to the cut
        again = [m.text().split()[0] for m in c.read_range("/queue/range")]
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


def test_a_reader_that_stops_ends_the_client_at_once_naming_why(cluster) -> None:
    """Anything the client's reader cannot handle - here the on_failover callback raises -
    ends the client: a call waiting on it, and every later one, gets a ClientError naming the
    cause at once, not "no receipt" after its own timeout (nobody reads receipts any more)."""
    master = cluster.master()
    standby = cluster.standby()

    def broken(event: FailoverEvent) -> None:
        raise RuntimeError("a bug in the callback")

    with Client(failover_url(master, standby), timeout=30, on_failover=broken) as c:
        c.send("/queue/stops", "before")
        master.kill()
        with pytest.raises(ClientError, match="reader stopped: RuntimeError") as raised:
            c.send("/queue/stops", "after")
        assert isinstance(raised.value.__cause__, RuntimeError) and not c.is_open
        with pytest.raises(ClientError, match="a bug in the callback"):
            c.send("/queue/stops", "later")


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")
def test_a_stomps_failover_url_moves_to_the_standby_over_tls(cluster, tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    pki.mkdir()
    make_ca(pki, "ca")
    make_cert(pki, "server", "localhost", "ca", server=True)
    tls = ["--tls-cert", str(pki / "server.crt"), "--tls-key", str(pki / "server.key")]
    ports = free_port(), free_port()
    master = cluster.master("--tls-port", str(ports[0]), *tls)
    standby = cluster.standby("--tls-port", str(ports[1]), *tls)
    urls = [f"stomps://127.0.0.1:{p}" for p in ports]
    events: list[FailoverEvent] = []
    failed_over = threading.Event()

    def told(event: FailoverEvent) -> None:
        events.append(event)
        failed_over.set()

    with Client(f"failover:({urls[0]},{urls[1]})?randomize=false&initialReconnectDelay=20",
                ssl_context=client_context(pki / "ca.crt"), on_failover=told) as c:
        c.send("/queue/tls", "before")
        master.kill()
        assert failed_over.wait(30)
        assert (events[0].from_url, events[0].to_url) == tuple(urls)
        c.send("/queue/tls", "after")
        with c.subscribe("/queue/tls") as sub:
            assert [sub.get(timeout=10).text() for _ in range(2)] == ["before", "after"]
    assert standby.listening.is_set()
