"""Spec of the per-user share of the store (``[limits] user_store_limit``): the body bytes of
persistent messages one login has stored, in any destination, ready or delivered and not yet
acknowledged, are bounded. Past it her SEND waits like any flow-control wait (or, with
``fail_if_no_space``, gets an ERROR naming the share, the connection kept), while another
user still sends and receives. Each record names its sender, so a restart - clean (index
snapshot) or kill -9 (the journal after it) - finds her at her share again; her consumer's
acknowledgements give the room back and the waiting SEND goes in.

``mallory`` (stomp.py) may write only ``/queue/m.>``, ``alice`` (our client) only
``/queue/a.>``; each may store 64 KiB of persistent messages.
"""

from __future__ import annotations

from typing import Any

from accounts import NEIGHBOUR_RULES, NEIGHBOURS
from stomp_helpers import (
    Collector,
    connect,
    nothing_delivered,
    send_with_receipt,
    subscribe_with_receipt,
    wait_receipt,
)

from sluice_testing import BrokerProcess

CONFIG = """
[limits]
user_store_limit = "64 KiB"

[[policy]]
queue = "m.strict.>"
fail_if_no_space = true
""" + NEIGHBOURS.config(NEIGHBOUR_RULES, delay=0.1, max_failures=10)

BODY = b"m" * 4096
FIT = 16  # 16 x 4 KiB fill the 64 KiB share; the 17th would pass it
SHARE = ("user store limit reached (65536 bytes of persistent messages of user 'mallory', "
         "user_store_limit 65536)")


def as_mallory(broker: BrokerProcess) -> tuple[Any, Collector]:
    return connect(broker, headers={"login": "mallory", "passcode": "m-pw"})


def fill(conn: Any, listener: Collector) -> None:
    """Her share filled through three destinations (none of which has a cap of its own)."""
    for i in range(FIT):
        send_with_receipt(conn, listener, f"/queue/m.{i % 3}", BODY, f"fill-{i}",
                          persistent="true", n=str(i))


def alice_is_served(broker: BrokerProcess) -> None:
    """Alice stores twice mallory's whole share in her own queue, every SEND receipted, and
    reads it back (each message acknowledged before the next is sent: her share is 64 KiB
    as well)."""
    with NEIGHBOURS.login(broker, "alice") as alice:
        sub = alice.subscribe("/queue/a.inbox", ack="client-individual")
        for i in range(4):
            alice.send("/queue/a.inbox", b"a" * 32768, persistent=True, headers={"n": str(i)})
            m = sub.get(timeout=30)
            assert m is not None and m.headers["n"] == str(i)
            m.ack()


def test_a_user_at_her_share_waits_and_another_user_sends_and_receives(
        broker_factory: Any) -> None:
    """Mallory's 17th SEND waits (no RECEIPT) while alice is served; after a clean restart
    and after kill -9 she is still at her share (counted from the records); once she reads
    and acknowledges one queue, the waiting SEND goes in."""
    broker = broker_factory(config_text=CONFIG)
    conn, listener = as_mallory(broker)
    fill(conn, listener)
    mark = broker.mark()
    conn.send("/queue/m.new", BODY, receipt="over", headers={"persistent": "true"})
    broker.wait_for_log(f"waits for /queue/m.new ({SHARE})", since=mark)
    alice_is_served(broker)
    assert listener.receipts.empty()  # still waiting, after alice's SENDs were stored

    for restart in ("clean", "kill -9"):
        if restart == "clean":
            assert broker.stop() == 0
        else:
            broker.kill()
        mark = broker.mark()
        broker.restart()
        if restart == "clean":  # the index snapshot names every sender: no record is read
            broker.wait_for_log(f"user shares: {FIT} stored messages counted, 0 senders read",
                                since=mark)
        conn, listener = as_mallory(broker)
        mark = broker.mark()
        conn.send("/queue/m.new", BODY, receipt=restart, headers={"persistent": "true"})
        broker.wait_for_log(f"waits for /queue/m.new ({SHARE})", since=mark)
        alice_is_served(broker)
        assert listener.receipts.empty()

    reader, inbox = as_mallory(broker)
    subscribe_with_receipt(reader, inbox, "/queue/m.0", "s", ack="client-individual")
    first = [inbox.next(timeout=30) for _ in range(6)]  # m.0 holds every third: 0, 3, .. 15
    assert [int(m.headers["n"]) for m in first] == list(range(0, FIT, 3))
    assert listener.receipts.empty()  # delivered and not acknowledged: still hers
    for m in first:
        reader.ack(m.headers["ack"])
    assert listener.receipts.get(timeout=30) == "kill -9"  # room again: it went in
    reader.disconnect()
    conn.disconnect()


def test_fail_if_no_space_refuses_her_send_with_an_error_naming_the_share(
        broker_factory: Any) -> None:
    """With ``fail_if_no_space`` her SEND past the share gets the ERROR (the connection
    stays: a non-persistent SEND, which the store does not hold, is still taken)."""
    broker = broker_factory(config_text=CONFIG)
    conn, listener = as_mallory(broker)
    fill(conn, listener)
    conn.send("/queue/m.strict.q", BODY, receipt="over", headers={"persistent": "true"})
    error = listener.errors.get(timeout=30)
    assert error.headers["receipt-id"] == "over"
    assert error.headers["message"] == f"/queue/m.strict.q cannot take the message: {SHARE}"
    alice_is_served(broker)
    send_with_receipt(conn, listener, "/queue/m.strict.q", b"x", "not-stored")
    conn.disconnect()


def test_a_transaction_past_her_share_waits_at_commit(broker_factory: Any) -> None:
    """A transaction's SENDs go to its spool; its COMMIT, which stores them, meets the share:
    it waits while alice is served, and goes in once mallory's reader acknowledged."""
    broker = broker_factory(config_text=CONFIG)
    conn, listener = as_mallory(broker)
    fill(conn, listener)
    conn.begin(transaction="tx1")
    conn.send("/queue/m.tx", BODY, transaction="tx1", headers={"persistent": "true"})
    mark = broker.mark()
    conn.commit(transaction="tx1", headers={"receipt": "commit"})
    broker.wait_for_log("waits for /queue/m.tx (user store limit reached", since=mark)
    alice_is_served(broker)
    assert listener.receipts.empty()

    reader, inbox = as_mallory(broker)
    subscribe_with_receipt(reader, inbox, "/queue/m.1", "s", ack="client-individual")
    for _ in range(5):  # 1, 4, .. 13
        reader.ack(inbox.next(timeout=30).headers["ack"])
    wait_receipt(listener, "commit")
    reader.disconnect()
    conn.disconnect()


def test_a_commit_that_acks_her_own_messages_makes_its_own_room(broker_factory: Any) -> None:
    """Consume-transform-produce at her share: a COMMIT that ACKs one of her stored 4 KiB
    messages and SENDs 4 KiB goes in (its own ACK frees what it stores); one that ACKs one
    and SENDs two waits."""
    broker = broker_factory(config_text=CONFIG)
    conn, listener = as_mallory(broker)
    fill(conn, listener)
    subscribe_with_receipt(conn, listener, "/queue/m.0", "s", ack="client-individual",
                           headers={"activemq.prefetchSize": "2"})
    first, second = listener.next(timeout=30), listener.next(timeout=30)
    conn.begin(transaction="tx1")
    conn.ack(first.headers["ack"], transaction="tx1")
    conn.send("/queue/m.out", BODY, transaction="tx1", headers={"persistent": "true"})
    conn.commit(transaction="tx1", headers={"receipt": "commit-1"})
    wait_receipt(listener, "commit-1")

    conn.begin(transaction="tx2")
    conn.ack(second.headers["ack"], transaction="tx2")
    for _ in range(2):
        conn.send("/queue/m.out", BODY, transaction="tx2", headers={"persistent": "true"})
    mark = broker.mark()
    conn.commit(transaction="tx2", headers={"receipt": "commit-2"})
    broker.wait_for_log("waits for /queue/m.out (user store limit reached", since=mark)
    alice_is_served(broker)
    assert listener.receipts.empty()
    conn.disconnect()


TOPIC_CONFIG = CONFIG + """
[[security.acl]]
destination = "/topic/m.>"
read = ["m"]
write = ["m"]
"""


def test_a_commit_acking_one_copy_of_a_topic_record_two_subscriptions_hold_frees_nothing(
        broker_factory: Any) -> None:
    """A topic record held by two of her durable subscriptions is charged once and freed
    when the last lets go: a COMMIT that ACKs it on one of them only and SENDs 4 KiB at her
    share gets the ERROR (was: it went in, and repeating it stored past the share without
    bound); with the other subscription's ACK of it in the same transaction it commits."""
    broker = broker_factory(config_text=TOPIC_CONFIG)
    conn, listener = connect(broker, headers={"login": "mallory", "passcode": "m-pw",
                                              "client-id": "m-client"})
    for name in ("keep", "work"):
        subscribe_with_receipt(conn, listener, "/topic/m.t", name, ack="client-individual",
                               headers={"activemq.subscriptionName": name,
                                        "activemq.prefetchSize": "1"})
    for i in range(FIT):
        send_with_receipt(conn, listener, "/topic/m.t", BODY, f"fill-{i}",
                          persistent="true", n=str(i))
    got = {m.headers["subscription"]: m for m in (listener.next(timeout=30),
                                                  listener.next(timeout=30))}
    assert got["keep"].headers["n"] == got["work"].headers["n"] == "0"

    conn.begin(transaction="tx1")
    conn.ack(got["work"].headers["ack"], transaction="tx1")
    conn.send("/queue/m.strict.out", BODY, transaction="tx1", headers={"persistent": "true"})
    conn.commit(transaction="tx1", headers={"receipt": "one-copy"})
    error = listener.errors.get(timeout=30)
    assert error.headers["receipt-id"] == "one-copy"
    assert SHARE in error.headers["message"]
    assert listener.receipts.empty()

    conn.ack(got["keep"].headers["ack"], transaction="tx1")
    conn.commit(transaction="tx1", headers={"receipt": "both-copies"})
    wait_receipt(listener, "both-copies")
    conn.disconnect()


def test_a_transaction_of_several_messages_gets_no_pass_past_an_empty_share(
        broker_factory: Any) -> None:
    """One message larger than her whole share is taken while she has nothing stored, in a
    transaction as in a SEND; several that together pass it are not (was: a COMMIT at an
    empty share stored up to max_transaction_bytes, 256 MiB by default)."""
    broker = broker_factory(config_text=CONFIG)
    conn, listener = as_mallory(broker)
    conn.begin(transaction="tx1")
    for _ in range(FIT + 1):
        conn.send("/queue/m.strict.q", BODY, transaction="tx1", headers={"persistent": "true"})
    conn.commit(transaction="tx1", headers={"receipt": "several"})
    error = listener.errors.get(timeout=30)
    assert error.headers["receipt-id"] == "several"
    assert "user store limit reached (0 bytes" in error.headers["message"]
    conn.abort(transaction="tx1")

    conn.begin(transaction="tx2")
    conn.send("/queue/m.strict.q", BODY * (FIT + 1), transaction="tx2",
              headers={"persistent": "true"})
    conn.commit(transaction="tx2", headers={"receipt": "one"})
    wait_receipt(listener, "one")
    assert listener.errors.empty()
    conn.disconnect()


BURST_CONFIG = CONFIG + """
[journal]
store_delay_ms = 60000
"""


def test_a_burst_to_her_own_consumer_that_never_acks_stays_within_her_share(
        broker_factory: Any) -> None:
    """Her consumer (client acks, prefetch 100) is ready, so each persistent message goes
    out at once and its write is deferred (``store_delay_ms``, here a minute: concurrent
    store and dispatch); her share counts it from the SEND. Of a burst of 20 x 4 KiB without
    receipts, 16 fill her share and the 17th gets the ERROR naming it (was: all 20 went in,
    charged only at their writes - a prefetch past her share). Nothing past them delivered."""
    broker = broker_factory(config_text=BURST_CONFIG)
    conn, listener = as_mallory(broker)
    subscribe_with_receipt(conn, listener, "/queue/m.strict.q", "s", ack="client-individual",
                           headers={"activemq.prefetchSize": "100"})
    for i in range(FIT + 4):
        conn.send("/queue/m.strict.q", BODY, headers={"persistent": "true", "n": str(i)})
    error = listener.errors.get(timeout=30)
    assert error.headers["message"] == f"/queue/m.strict.q cannot take the message: {SHARE}"
    got = [listener.next(timeout=10) for _ in range(FIT)]
    assert [m.headers["n"] for m in got] == [str(i) for i in range(FIT)]
    for m in got:
        conn.ack(m.headers["ack"])
    assert nothing_delivered(conn, listener)
    conn.disconnect()
