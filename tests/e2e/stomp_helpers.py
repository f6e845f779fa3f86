"""stomp.py plumbing shared by the e2e tests: a connection whose frames land in a queue."""

from __future__ import annotations

import itertools
import queue
from typing import Any

import stomp


class Collector(stomp.ConnectionListener):
    """Every MESSAGE, RECEIPT and ERROR frame, in arrival order, for blocking reads."""

    def __init__(self) -> None:
        self.messages: queue.Queue[Any] = queue.Queue()
        self.receipts: queue.Queue[str] = queue.Queue()
        self.errors: queue.Queue[Any] = queue.Queue()

    def on_message(self, frame: Any) -> None:
        self.messages.put(frame)

    def on_receipt(self, frame: Any) -> None:
        self.receipts.put(frame.headers["receipt-id"])

    def on_error(self, frame: Any) -> None:
        self.errors.put(frame)

    def next(self, timeout: float = 10.0) -> Any:
        return self.messages.get(timeout=timeout)


def connect(broker: Any, version: str = "1.2", **kwargs: Any) -> tuple[Any, Collector]:
    cls = {"1.0": stomp.Connection10, "1.1": stomp.Connection11,
           "1.2": stomp.Connection12}[version]
    extra = {} if version == "1.0" else {"heartbeats": (0, 0)}
    conn = cls([(broker.host, broker.port)], auto_content_length=True, **extra)
    listener = Collector()
    conn.set_listener("c", listener)
    conn.connect(wait=True, headers=kwargs.get("headers", {}))
    return conn, listener


def send_with_receipt(conn: Any, listener: Collector, destination: str, body: str | bytes,
                      receipt: str, **headers: str) -> None:
    conn.send(destination=destination, body=body, receipt=receipt, headers=headers)
    got = listener.receipts.get(timeout=10)
    assert got == receipt


def wait_receipt(listener: Collector, receipt: str) -> None:
    """Block until the broker answered ``receipt`` (it handled everything sent before it)."""
    got = listener.receipts.get(timeout=10)
    assert got == receipt


def subscribe_with_receipt(conn: Any, listener: Collector, destination: str, id: str,
                           **kwargs: Any) -> None:
    """SUBSCRIBE and wait until the broker has the subscription (its RECEIPT), so that what
    is sent next is routed to it - no sleep standing in for that."""
    receipt = f"sub-{id}"
    headers = {**kwargs.pop("headers", {}), "receipt": receipt}
    conn.subscribe(destination, id=id, headers=headers, **kwargs)
    wait_receipt(listener, receipt)


_round_trips = itertools.count(1)


def nothing_delivered(conn: Any, listener: Collector) -> bool:
    """True if no MESSAGE came to ``conn`` before the RECEIPT of a round trip on it (BEGIN,
    then ABORT with a receipt). The broker writes a RECEIPT after every MESSAGE that frames
    handled before it made deliverable to the connection (core/routing/receipts.py): what
    is not there by then was not delivered, without waiting out a quiet window. Frames of
    another connection count once that connection had their RECEIPT (or a MESSAGE they
    caused)."""
    tx = f"round-trip-{next(_round_trips)}"
    conn.begin(transaction=tx)
    conn.abort(transaction=tx, headers={"receipt": tx})
    wait_receipt(listener, tx)
    return listener.messages.empty()
