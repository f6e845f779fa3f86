"""Spec: what waits in the scheduler for a destination counts against its ``store_limit`` from
the SEND on, so a user cannot park more than her cap there.

``mallory`` (stomp.py) may write only ``/queue/m.>``, whose destinations may hold 8 KiB of
ready and scheduled messages each; ``alice`` (our client) writes ``/queue/a.>`` without a cap;
``olga`` administers (the admin API's cancel). Mallory's messages are due in an hour, so
none moves while the spec runs: what she stores is what waits in ``sluice.scheduled``.
"""

from __future__ import annotations

import base64
import json
import urllib.request
from typing import Any

from accounts import NEIGHBOUR_RULES, Accounts
from stomp_helpers import Collector, connect, send_with_receipt, subscribe_with_receipt

from sluice_testing import BrokerProcess

ACCOUNTS = Accounts({"mallory": ("m-pw", ["m"]), "alice": ("a-pw", ["a"]),
                     "olga": ("olga-pw", ["admins"])})
CONFIG = """
[[policy]]
queue = "m.>"
store_limit = "8 KiB"

[[policy]]
queue = "m.strict.>"
fail_if_no_space = true
""" + ACCOUNTS.config(NEIGHBOUR_RULES + """
[[security.acl]]
destination = ">"
admin = ["admins"]
""", delay=0.1, max_failures=10)

BODY = b"m" * 1024
FIT = 8  # 8 x 1 KiB: the 8 KiB cap is reached
HOUR = {"persistent": "true", "AMQ_SCHEDULED_DELAY": "3600000"}
FULL = ("destination store limit reached (8192 bytes of ready and scheduled messages, "
        "store_limit 8192 of its policy)")


def as_mallory(broker: BrokerProcess) -> tuple[Any, Collector]:
    return connect(broker, headers={"login": "mallory", "passcode": "m-pw"})


def park(conn: Any, listener: Collector, destination: str, count: int) -> None:
    """``count`` scheduled SENDs due in an hour, each RECEIPTed."""
    for i in range(count):
        send_with_receipt(conn, listener, destination, BODY, f"park-{i}", n=str(i), **HOUR)


def olga(broker: BrokerProcess, path: str, method: str = "GET") -> Any:
    token = base64.b64encode(b"olga:olga-pw").decode()
    request = urllib.request.Request(f"{broker.console_url}/api/{path}", method=method,
                                     headers={"Authorization": f"Basic {token}"})
    with urllib.request.urlopen(request, timeout=15) as answer:
        return json.load(answer)


def alice_is_served(broker: BrokerProcess) -> None:
    """Alice parks and stores more than mallory's whole cap and gets every RECEIPT."""
    with ACCOUNTS.login(broker, "alice") as alice:
        for _ in range(4):
            alice.send("/queue/a.inbox", b"a" * 4096, persistent=True,
                       headers={"AMQ_SCHEDULED_DELAY": "3600000"})
            alice.send("/queue/a.inbox", b"a" * 4096, persistent=True)


def test_her_scheduled_messages_fill_her_cap_and_the_next_send_gets_the_error(
        broker_factory: Any) -> None:
    """With ``fail_if_no_space``: 8 x 1 KiB scheduled for /queue/m.strict.q are RECEIPTed;
    the 9th, scheduled or plain, gets the ERROR naming the cap (on main it was RECEIPTed:
    she could park up to the broker-wide store limit); alice is served. Once olga cancels
    one, a plain SEND goes in; a restart counts the same (7 scheduled + 1 ready)."""
    broker = broker_factory(config_text=CONFIG)
    conn, listener = as_mallory(broker)
    park(conn, listener, "/queue/m.strict.q", FIT)
    for attempt, headers in (("scheduled", HOUR), ("plain", {"persistent": "true"})):
        conn.send("/queue/m.strict.q", BODY, receipt=attempt, headers=headers)
        error = listener.errors.get(timeout=30)
        assert error.headers["receipt-id"] == attempt
        assert error.headers["message"] == f"/queue/m.strict.q cannot take the message: {FULL}"
    alice_is_served(broker)

    waiting = olga(broker, "destinations/queue/sluice.scheduled/messages")["messages"]
    mine = [m for m in waiting
            if m["headers"]["sluice-scheduled-destination"] == "/queue/m.strict.q"]
    assert len(mine) == FIT
    assert olga(broker, f"destinations/queue/sluice.scheduled/messages/{mine[0]['mid']}",
                "DELETE") == {"removed": 1}
    send_with_receipt(conn, listener, "/queue/m.strict.q", BODY, "after-cancel",
                      persistent="true", n="ready")
    conn.send("/queue/m.strict.q", BODY, receipt="full-again", headers=HOUR)
    assert listener.errors.get(timeout=30).headers["receipt-id"] == "full-again"
    detail = olga(broker, "destinations/queue/m.strict.q")
    assert (detail["ready_bytes"], detail["scheduled_bytes"]) == (1024, 7 * 1024)
    conn.disconnect()

    assert broker.stop() == 0
    broker.restart()
    conn, listener = as_mallory(broker)
    conn.send("/queue/m.strict.q", BODY, receipt="after-restart", headers=HOUR)
    error = listener.errors.get(timeout=30)
    assert error.headers["receipt-id"] == "after-restart"
    assert error.headers["message"] == f"/queue/m.strict.q cannot take the message: {FULL}"
    detail = olga(broker, "destinations/queue/m.strict.q")
    assert (detail["ready_bytes"], detail["scheduled_bytes"]) == (1024, 7 * 1024)
    alice_is_served(broker)
    conn.disconnect()


def test_her_send_past_the_cap_waits_until_a_scheduled_message_is_cancelled(
        broker_factory: Any) -> None:
    """Without ``fail_if_no_space`` the 9th SEND waits (no RECEIPT, no ERROR) while alice is
    served; olga's cancel of one of the 8 scheduled makes room and it goes in, RECEIPTed,
    and a reader gets it."""
    broker = broker_factory(config_text=CONFIG)
    conn, listener = as_mallory(broker)
    park(conn, listener, "/queue/m.q", FIT)
    mark = broker.mark()
    conn.send("/queue/m.q", BODY, receipt="over", headers={"persistent": "true", "n": "over"})
    broker.wait_for_log(f"waits for /queue/m.q ({FULL}", since=mark)
    alice_is_served(broker)
    assert listener.receipts.empty() and listener.errors.empty()

    [first, *_] = olga(broker, "destinations/queue/sluice.scheduled/messages")["messages"]
    assert olga(broker, f"destinations/queue/sluice.scheduled/messages/{first['mid']}",
                "DELETE") == {"removed": 1}
    assert listener.receipts.get(timeout=30) == "over"
    reader, inbox = as_mallory(broker)
    subscribe_with_receipt(reader, inbox, "/queue/m.q", "s")
    assert inbox.next(timeout=30).headers["n"] == "over"
    reader.disconnect()
    conn.disconnect()
