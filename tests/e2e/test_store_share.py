"""Spec of the store between users: a user filling the destinations she may write with
persistent messages nobody consumes meets her destinations' ``store_limit`` ([[policy]]),
not the broker-wide one, so another user's persistent SENDs to his own queue still get their
RECEIPT; hers wait (or, with ``fail_if_no_space``, get an ERROR naming the cap). The cap
counts what the journal knows per destination, so a restart keeps it where it was.

``mallory`` (stomp.py) may write only ``/queue/m.>``, ``alice`` (our client) only
``/queue/a.>``; mallory's destinations may hold 64 KiB of ready messages each.
"""

from __future__ import annotations

from typing import Any

from accounts import NEIGHBOUR_RULES, NEIGHBOURS
from stomp_helpers import (
    Collector,
    connect,
    send_with_receipt,
    subscribe_with_receipt,
    wait_receipt,
)

from sluice_testing import BrokerProcess

ACCOUNTS, RULES = NEIGHBOURS, NEIGHBOUR_RULES
CONFIG = """
[[policy]]
queue = "m.>"
store_limit = "64 KiB"

[[policy]]
queue = "m.strict.>"
fail_if_no_space = true
""" + ACCOUNTS.config(RULES, delay=0.1, max_failures=10)

BODY = b"m" * 4096
FIT = 16  # 16 x 4 KiB: the 64 KiB cap is reached, the 17th SEND finds it full


def as_mallory(broker: BrokerProcess) -> tuple[Any, Collector]:
    return connect(broker, headers={"login": "mallory", "passcode": "m-pw"})


def fill(conn: Any, listener: Collector, destination: str) -> None:
    for i in range(FIT):
        send_with_receipt(conn, listener, destination, BODY, f"fill-{i}", persistent="true",
                          n=str(i))


def alice_is_served(broker: BrokerProcess) -> None:
    """Alice stores more than mallory's whole cap in her own queue and gets every RECEIPT."""
    with ACCOUNTS.login(broker, "alice") as alice:
        for _ in range(4):
            alice.send("/queue/a.inbox", b"a" * 65536, persistent=True)


def test_a_user_at_her_store_limit_waits_and_another_user_is_served(
        broker_factory: Any) -> None:
    """Mallory's 17th SEND waits (its RECEIPT does not come) while alice's are stored; after a
    restart her queue still counts as full; once she reads it, the waiting SEND goes in (the
    one waiting at the stop was never stored: no RECEIPT promised it)."""
    broker = broker_factory(config_text=CONFIG)
    conn, listener = as_mallory(broker)
    fill(conn, listener, "/queue/m.q")
    mark = broker.mark()
    conn.send("/queue/m.q", BODY, receipt="over", headers={"persistent": "true", "n": "16"})
    broker.wait_for_log("waits for /queue/m.q (destination store limit reached", since=mark)
    alice_is_served(broker)
    assert listener.receipts.empty()  # still waiting, after alice's SENDs were stored
    assert broker.stop() == 0

    broker.restart()
    conn, listener = as_mallory(broker)
    mark = broker.mark()
    conn.send("/queue/m.q", BODY, receipt="after-restart",
              headers={"persistent": "true", "n": "16"})
    broker.wait_for_log("waits for /queue/m.q (destination store limit reached", since=mark)
    alice_is_served(broker)
    assert listener.receipts.empty()

    reader, inbox = as_mallory(broker)
    subscribe_with_receipt(reader, inbox, "/queue/m.q", "s")
    assert listener.receipts.get(timeout=30) == "after-restart"  # room again: it went in
    got = [int(inbox.next(timeout=30).headers["n"]) for _ in range(FIT + 1)]
    assert got == list(range(FIT + 1))  # the cap lost and reordered nothing
    reader.disconnect()
    conn.disconnect()


def test_fail_if_no_space_refuses_her_send_with_an_error_naming_the_cap(
        broker_factory: Any) -> None:
    """With ``fail_if_no_space``, mallory's SEND past the cap gets an ERROR that says which
    limit and how much (the connection stays); alice is served; a restart changes nothing."""
    broker = broker_factory(config_text=CONFIG)
    conn, listener = as_mallory(broker)
    fill(conn, listener, "/queue/m.strict.q")
    for attempt in ("over", "after-restart"):
        if attempt == "after-restart":
            assert broker.stop() == 0
            broker.restart()
            conn, listener = as_mallory(broker)
        conn.send("/queue/m.strict.q", BODY, receipt=attempt, headers={"persistent": "true"})
        error = listener.errors.get(timeout=30)
        assert error.headers["receipt-id"] == attempt
        assert error.headers["message"] == (
            "/queue/m.strict.q cannot take the message: destination store limit reached "
            "(65536 bytes of ready and scheduled messages, store_limit 65536 of its "
            "policy)")
        alice_is_served(broker)
        send_with_receipt(conn, listener, "/queue/m.other", b"x", f"{attempt}-elsewhere",
                          persistent="true")  # same connection, a destination with room
    conn.disconnect()


def test_a_transaction_past_her_store_limit_waits_at_commit(broker_factory: Any) -> None:
    """A transaction's SENDs only go to its spool; its COMMIT is what stores them, so the COMMIT
    meets the cap: with her queue full, mallory's COMMIT waits (its RECEIPT does not come, her
    later frames wait behind it) while alice is served; once she reads, it goes in, in order."""
    broker = broker_factory(config_text=CONFIG)
    conn, listener = as_mallory(broker)
    fill(conn, listener, "/queue/m.q")
    conn.begin(transaction="tx1")
    for i in range(FIT, FIT + 8):
        conn.send("/queue/m.q", BODY, transaction="tx1", headers={"persistent": "true",
                                                                   "n": str(i)})
    mark = broker.mark()
    conn.commit(transaction="tx1", headers={"receipt": "commit"})
    broker.wait_for_log("waits for /queue/m.q (destination store limit reached", since=mark)
    alice_is_served(broker)
    assert listener.receipts.empty()

    reader, inbox = as_mallory(broker)
    subscribe_with_receipt(reader, inbox, "/queue/m.q", "s")
    assert listener.receipts.get(timeout=30) == "commit"
    got = [int(inbox.next(timeout=30).headers["n"]) for _ in range(FIT + 8)]
    assert got == list(range(FIT + 8))


def test_fail_if_no_space_refuses_her_commit_and_keeps_the_transaction(
        broker_factory: Any) -> None:
    """With ``fail_if_no_space`` the COMMIT past the cap gets the ERROR naming the cap and
    stores nothing; the transaction stays open, so she may ABORT it or COMMIT it once there is
    room."""
    broker = broker_factory(config_text=CONFIG)
    conn, listener = as_mallory(broker)
    fill(conn, listener, "/queue/m.strict.q")
    conn.begin(transaction="tx1")
    conn.send("/queue/m.strict.q", BODY, transaction="tx1",
              headers={"persistent": "true", "n": str(FIT)})
    conn.commit(transaction="tx1", headers={"receipt": "commit"})
    error = listener.errors.get(timeout=30)
    assert error.headers["receipt-id"] == "commit"
    assert error.headers["message"] == (
        "COMMIT of tx1: /queue/m.strict.q cannot take its messages: destination store limit "
        "reached (65536 bytes of ready and scheduled messages, store_limit 65536 of its "
        "policy)")
    alice_is_served(broker)

    reader, inbox = as_mallory(broker)
    subscribe_with_receipt(reader, inbox, "/queue/m.strict.q", "s", ack="client-individual")
    first = [inbox.next(timeout=30) for _ in range(FIT)]
    assert [int(m.headers["n"]) for m in first] == list(range(FIT))  # nothing of tx1 stored
    for m in first:
        reader.ack(m.headers["ack"])
    send_with_receipt(conn, listener, "/queue/m.other", b"x", "sync", persistent="true")
    conn.commit(transaction="tx1", headers={"receipt": "again"})
    wait_receipt(listener, "again")
    assert int(inbox.next(timeout=30).headers["n"]) == FIT


def test_staged_publishing_meets_her_store_limit_at_the_part_and_at_publication(
        broker_factory: Any) -> None:
    """A staged part is journaled as it is sent and its publication makes it ready at once:
    with ``fail_if_no_space``, a part staged while her queue had room but published once it is
    full gets the ERROR naming the cap and publishes nothing; a SEND into a new part for the
    full queue is refused the same way; once she read the queue the publication goes through."""
    broker = broker_factory(config_text=CONFIG)
    conn, listener = as_mallory(broker)
    conn.begin(transaction="p0", headers={"sluice-stage": "sink/b1/p0"})
    for i in range(FIT, FIT + 8):
        conn.send("/queue/m.strict.q", BODY, transaction="p0", headers={"n": str(i)})
    conn.commit(transaction="p0", headers={"receipt": "staged"})
    wait_receipt(listener, "staged")
    fill(conn, listener, "/queue/m.strict.q")
    cap = ("destination store limit reached (65536 bytes of ready and scheduled messages, "
           "store_limit 65536 of its policy)")

    conn.commit(transaction="pub", headers={"receipt": "publish", "sluice-stage-commit": "sink/b1",
                                            "sluice-stage-parts": "p0"})
    error = listener.errors.get(timeout=30)
    assert error.headers["receipt-id"] == "publish"
    assert error.headers["message"] == (
        f"publication of sink/b1: /queue/m.strict.q cannot take its messages: {cap}")
    conn.begin(transaction="p1", headers={"sluice-stage": "sink/b2/p1"})
    conn.send("/queue/m.strict.q", BODY, transaction="p1", headers={"receipt": "into-p1"})
    error = listener.errors.get(timeout=30)
    assert error.headers["receipt-id"] == "into-p1"
    assert error.headers["message"] == f"/queue/m.strict.q cannot take the message: {cap}"
    alice_is_served(broker)

    reader, inbox = as_mallory(broker)
    subscribe_with_receipt(reader, inbox, "/queue/m.strict.q", "s")
    assert [int(inbox.next(timeout=30).headers["n"]) for _ in range(FIT)] == list(range(FIT))
    conn.commit(transaction="pub", headers={"receipt": "again", "sluice-stage-commit": "sink/b1",
                                            "sluice-stage-parts": "p0"})
    wait_receipt(listener, "again")
    got = [int(inbox.next(timeout=30).headers["n"]) for _ in range(8)]
    assert got == list(range(FIT, FIT + 8))
