"""Spec of the room a COMMIT asks for: a transaction's ACKs count as applied.

A transaction that consumes and produces (ACKs and SENDs in one BEGIN...COMMIT) applies its
ACKs only at COMMIT, so on a destination at its ``store_limit`` no room came before the
COMMIT that would make it. COMMIT therefore asks producer flow control for the room it
needs net of what its own ACKs free: in the same destination for that destination's
``store_limit`` (a COMMIT that stores there no more body bytes than its ACKs take out passes
it; one that stores more is looked at with those bytes gone), and anywhere for the
broker-wide ``[limits] store_limit`` (persistent bytes). The caps still hold for everything
else: a plain SEND, and a COMMIT into another full destination, wait or get their ERROR.
"""

from __future__ import annotations

from typing import Any

import pytest
from stomp_helpers import (
    Collector,
    connect,
    send_with_receipt,
    subscribe_with_receipt,
    wait_receipt,
)

from sluice_testing import RawStomp
from sluicemq import Client, ClientError

CONFIG = """
[[policy]]
queue = "loop.>"
store_limit = "64 KiB"

[[policy]]
queue = "loop.strict.>"
fail_if_no_space = true
"""
BODY = b"m" * 4096
FIT = 16  # 16 x 4 KiB of ready messages: the 64 KiB cap is reached


def error_message(listener: Collector) -> str:
    return str(listener.errors.get(timeout=10).headers["message"])


def fill(conn: Any, listener: Collector, destination: str, bodies: list[bytes]) -> None:
    for i, body in enumerate(bodies):
        send_with_receipt(conn, listener, destination, body, f"fill-{i}", persistent="true",
                          n=str(i))


def test_a_consume_transform_produce_loop_on_its_full_capped_queue_commits(
        broker_factory: Any) -> None:
    """stomp.py, prefetch 1, the queue filled to its cap while the consumer was subscribed:
    each round ACKs one message and SENDs its transformed copy to the same queue in one
    transaction, and each COMMIT gets its RECEIPT with no other consumer making room
    (before: the first COMMIT waited for ever). Nothing lost, the queue's order kept: the
    originals in order, then the copies in the order they were committed."""
    broker = broker_factory(config_text=CONFIG)
    worker, inbox = connect(broker)
    subscribe_with_receipt(worker, inbox, "/queue/loop.q", "w", ack="client-individual",
                           headers={"activemq.prefetchSize": "1"})
    producer, listener = connect(broker)
    fill(producer, listener, "/queue/loop.q", [BODY] * (FIT + 1))  # one is in the prefetch

    seen = []
    for i in range(FIT + 1 + 8):
        msg = inbox.next(timeout=10)
        n = msg.headers["n"]
        seen.append(n)
        tx = f"tx{i}"
        worker.begin(transaction=tx)
        worker.ack(msg.headers["ack"], transaction=tx)
        worker.send("/queue/loop.q", msg.body.upper(), transaction=tx,
                    headers={"persistent": "true", "n": f"t{n}"})
        worker.commit(transaction=tx, headers={"receipt": tx})
        wait_receipt(inbox, tx)
    assert seen == [str(i) for i in range(FIT + 1)] + [f"t{i}" for i in range(8)]
    assert "waits for /queue/loop.q" not in broker.log()
    worker.disconnect()

    with Client(broker.url) as reader, reader.subscribe("/queue/loop.q") as sub:
        rest = [sub.get(timeout=10) for _ in range(FIT + 1)]
        assert [m.headers["n"] for m in rest if m] == (
            [f"t{i}" for i in range(8, FIT + 1)] + [f"tt{i}" for i in range(8)])


def test_a_commit_storing_more_than_its_acks_free_meets_the_cap_net_of_them(
        broker_factory: Any) -> None:
    """The queue holds 68 KiB ready (past its 64 KiB cap), a 1 KiB message in the
    consumer's prefetch: a COMMIT ACKing it and storing 4 KiB gets the ERROR with the queue
    counted at 67 KiB (its ACK's bytes gone, still full); one storing the same 1 KiB
    commits. A COMMIT into another full capped queue gets that queue's ERROR whatever its
    ACKs free elsewhere, and a plain SEND still finds the first queue full."""
    broker = broker_factory(config_text=CONFIG)
    worker, inbox = connect(broker)
    subscribe_with_receipt(worker, inbox, "/queue/loop.strict.q", "w",
                           ack="client-individual", headers={"activemq.prefetchSize": "1"})
    producer, listener = connect(broker)
    fill(producer, listener, "/queue/loop.strict.q",
         [b"s" * 1024] + [BODY] * (FIT - 1) + [b"b" * 8192])
    fill(producer, listener, "/queue/loop.strict.other", [BODY] * FIT)
    small = inbox.next(timeout=10)
    assert small.headers["n"] == "0"

    producer.send("/queue/loop.strict.q", BODY, headers={"persistent": "true"})
    assert error_message(listener) == (
        "/queue/loop.strict.q cannot take the message: destination store limit reached "
        "(69632 bytes of ready and scheduled messages, store_limit 65536 of its policy)")

    worker.begin(transaction="more")
    worker.ack(small.headers["ack"], transaction="more")
    worker.send("/queue/loop.strict.q", BODY, transaction="more",
                headers={"persistent": "true", "n": "more"})
    worker.commit(transaction="more", headers={"receipt": "more"})
    assert error_message(inbox) == (
        "COMMIT of more: /queue/loop.strict.q cannot take its messages: destination store "
        "limit reached (68608 bytes of ready and scheduled messages, store_limit 65536 of "
        "its policy)")
    worker.abort(transaction="more")

    worker.begin(transaction="elsewhere")
    worker.ack(small.headers["ack"], transaction="elsewhere")
    worker.send("/queue/loop.strict.other", b"s" * 1024, transaction="elsewhere",
                headers={"persistent": "true", "n": "elsewhere"})
    worker.commit(transaction="elsewhere", headers={"receipt": "elsewhere"})
    assert error_message(inbox) == (
        "COMMIT of elsewhere: /queue/loop.strict.other cannot take its messages: destination "
        "store limit reached (65536 bytes of ready and scheduled messages, store_limit 65536 "
        "of its policy)")
    worker.abort(transaction="elsewhere")

    worker.begin(transaction="same")
    worker.ack(small.headers["ack"], transaction="same")
    worker.send("/queue/loop.strict.q", b"S" * 1024, transaction="same",
                headers={"persistent": "true", "n": "same"})
    worker.commit(transaction="same", headers={"receipt": "same"})
    wait_receipt(inbox, "same")
    assert inbox.errors.empty()
    got = []
    for _ in range(FIT):
        got.append(inbox.next(timeout=10))
        worker.ack(got[-1].headers["ack"])
    assert [m.headers["n"] for m in got] == [str(i) for i in range(1, FIT + 1)]
    last = inbox.next(timeout=10)
    assert (last.headers["n"], last.body) == ("same", "S" * 1024)
    worker.disconnect()


STORE_CONFIG = """
[limits]
store_limit = "1 MiB"

[defaults]
fail_if_no_space = true

[journal]
segment_bytes = 262144
preallocate = false
"""


def test_a_loop_commits_while_the_broker_wide_store_is_full(broker_factory: Any) -> None:
    """Our client, prefetch 1, the broker's whole store full of one queue's persistent
    messages (a plain SEND gets ``store limit reached``): each transaction ACKs one message
    of it and stores its copy in another queue, and every COMMIT goes in - its ACK frees as
    many persistent bytes as it stores. Both queues read back whole and in order."""
    broker = broker_factory(config_text=STORE_CONFIG)
    producer = RawStomp(broker.host, broker.port)
    producer.connect()
    with Client(broker.url, timeout=10) as worker:
        sub = worker.subscribe("/queue/in", ack="client-individual", prefetch=1)
        sent = 0
        while True:
            producer.send("SEND", {"destination": "/queue/in", "receipt": str(sent),
                                   "persistent": "true", "n": str(sent)}, BODY)
            answer = producer.recv()
            if answer.command == "ERROR":
                break
            assert answer.headers["receipt-id"] == str(sent)
            sent += 1
            assert sent < 1000, "the store never filled"
        assert answer.headers["message"] == (
            "/queue/in cannot take the message: store limit reached (1048576 bytes of "
            "journal)")

        for i in range(40):
            msg = sub.get(timeout=10)
            assert msg is not None and msg.headers["n"] == str(i)
            with worker.transaction() as tx:
                tx.ack(msg)
                tx.send("/queue/out", msg.body, {"n": str(i)})
        for i in range(40, sent):
            msg = sub.get(timeout=10)
            assert msg is not None and msg.headers["n"] == str(i)
            msg.ack()
        with worker.subscribe("/queue/out") as out:
            assert [m.headers["n"] for m in (out.get(timeout=10) for _ in range(40)) if m] == [
                str(i) for i in range(40)]
    producer.close()



def fill_topic(broker: Any) -> int:
    """Persistent 4 KiB messages to ``/topic/fan`` until the store is full (the ERROR);
    returns how many went in."""
    producer = RawStomp(broker.host, broker.port)
    producer.connect()
    sent = 0
    while True:
        producer.send("SEND", {"destination": "/topic/fan", "receipt": str(sent),
                               "persistent": "true", "n": str(sent)}, BODY)
        answer = producer.recv()
        if answer.command == "ERROR":
            break
        sent += 1
        assert sent < 1000, "the store never filled"
    assert "store limit reached (1048576 bytes of journal)" in answer.headers["message"]
    producer.close()
    return sent


def subscribed_twice(broker: Any) -> tuple[Any, Collector]:
    conn, inbox = connect(broker, headers={"client-id": "twice"})
    for name in ("keep", "work"):
        subscribe_with_receipt(conn, inbox, "/topic/fan", name, ack="client-individual",
                               headers={"activemq.subscriptionName": name,
                                        "activemq.prefetchSize": "1"})
    return conn, inbox


def next_pair(inbox: Collector, n: int) -> dict[str, Any]:
    """Message ``n`` as each subscription got it, by subscription."""
    got = {m.headers["subscription"]: m for m in (inbox.next(timeout=10),
                                                  inbox.next(timeout=10))}
    assert got["keep"].headers["n"] == got["work"].headers["n"] == str(n)
    return got


@pytest.mark.parametrize("restart", ["none", "clean", "kill -9"])
def test_an_ack_of_one_copy_of_a_topic_record_two_subscriptions_hold_frees_no_store(
        broker_factory: Any, restart: str) -> None:
    """stomp.py, two durable subscriptions of one topic (prefetch 1), the broker's whole
    store full of the topic's persistent messages - one record each, held by both: a COMMIT
    that ACKs one subscription's copy and stores 4 KiB elsewhere gets ``store limit
    reached`` (was: it went in, and repeating it grew the store past its limit without
    bound); with the other subscription's ACK of the same record in the transaction, the
    record is freed and the COMMIT goes in. After a restart, clean or kill -9, the holders
    are counted again from the subscriptions. Both read the rest in order."""
    broker = broker_factory(config_text=STORE_CONFIG)
    conn, inbox = subscribed_twice(broker)
    sent = fill_topic(broker)
    if restart != "none":
        conn.disconnect()
        if restart == "clean":
            broker.stop()
        else:
            broker.kill()
        broker.restart()
        conn, inbox = subscribed_twice(broker)
    got = next_pair(inbox, 0)

    conn.begin(transaction="tx")
    conn.ack(got["work"].headers["ack"], transaction="tx")
    conn.send("/queue/out", BODY, transaction="tx", headers={"persistent": "true"})
    conn.commit(transaction="tx", headers={"receipt": "one-copy"})
    assert error_message(inbox) == (
        "COMMIT of tx: /queue/out cannot take its messages: store limit reached (1048576 "
        "bytes of journal)")
    assert inbox.receipts.empty()

    conn.ack(got["keep"].headers["ack"], transaction="tx")
    conn.commit(transaction="tx", headers={"receipt": "both-copies"})
    wait_receipt(inbox, "both-copies")
    for i in range(1, sent):
        for m in next_pair(inbox, i).values():
            conn.ack(m.headers["ack"])
    conn.disconnect()


def test_a_staged_publication_s_topic_record_is_freed_only_by_both_subscriptions_acks(
        broker_factory: Any) -> None:
    """The same for a message a staged publication (``sluice-stage``) put on the topic: held
    by both durable subscriptions, its record is freed only by both ACKs - one subscription's
    ACK in a COMMIT storing 4 KiB at a full store gets ``store limit reached`` (was: counted
    as freeing it, as before c71dcd3 for a SEND's)."""
    broker = broker_factory(config_text=STORE_CONFIG)
    with Client(broker.url, client_id="staged", timeout=10) as c:
        subs = {name: c.subscribe("/topic/fan", durable_name=name, ack="client-individual",
                                  prefetch=1) for name in ("keep", "work")}
        with c.stage("sink", "b1", "p0") as part:
            part.send("/topic/fan", BODY, {"persistent": "true", "n": "staged"})
        c.publish_stage("sink", "b1", ["p0"])
        got = {name: sub.get(timeout=10) for name, sub in subs.items()}
        assert all(m is not None and m.headers["n"] == "staged" for m in got.values())
        filler = RawStomp(broker.host, broker.port)
        filler.connect()
        for i in range(1000):
            filler.send("SEND", {"destination": "/queue/fill", "receipt": str(i),
                                 "persistent": "true"}, BODY)
            if filler.recv().command == "ERROR":
                break
        else:
            raise AssertionError("the store never filled")
        filler.close()

        with pytest.raises(ClientError, match="store limit reached"), c.transaction() as tx:
            tx.ack(got["work"])
            tx.send("/queue/out", BODY, {"persistent": "true"})
        with c.transaction() as tx:
            tx.ack(got["work"])
            tx.ack(got["keep"])
            tx.send("/queue/out", BODY, {"persistent": "true"})
