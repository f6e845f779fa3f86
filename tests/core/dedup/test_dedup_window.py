"""Spec of the dedup window, in process (tests/inprocess.py) on the injected clock: a producer
id silent for longer than ``[limits] dedup_window`` is forgotten - its numbers start again -
and a restart reaches the verdict the running broker reached, at the same moment."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from inprocess import Connection, InProcessBroker, config_for
from sluicemq.config import Limits

WINDOW = 4.0


def send(conn: Connection, body: bytes, seq: int, producer: str = "short") -> bool:
    """A numbered persistent SEND; True when the broker answered it as a duplicate."""
    answer = conn.request("SEND", {"destination": "/queue/w", "persistent": "true",
                                   "sluice-producer-id": producer,
                                   "sluice-producer-seq": str(seq)}, body)
    assert answer.command == "RECEIPT", answer.headers
    return answer.headers.get("sluice-duplicate") == "true"


def windowed(tmp_path: Path) -> InProcessBroker:
    return InProcessBroker(config_for(tmp_path / "data",
                                      limits=replace(Limits(), dedup_window=WINDOW)))


def stored(node: InProcessBroker) -> list[bytes]:
    conn = node.connect(peer="spec:reader")
    conn.request("SUBSCRIBE", {"destination": "/queue/w", "id": "s"})
    count = len(node.broker.queues["w"].pending)
    return [m.body for m in conn.messages(count)]


def test_a_producer_id_is_forgotten_after_the_window_and_a_restart_agrees(
        tmp_path: Path) -> None:
    node = windowed(tmp_path)
    conn = node.connect()
    assert not send(conn, b"a", 5)
    assert send(conn, b"a", 5)
    node.tick(WINDOW - 1)
    assert send(conn, b"a", 5)  # silence shorter than the window: still known
    node.tick(WINDOW + 1)  # the window passes, and the housekeeping tick forgets the id
    assert not send(conn, b"again", 1)  # a new epoch
    node = node.restart()  # no time passed: replay reaches the same verdict
    try:
        again = node.connect()
        assert send(again, b"again", 1)
        assert not send(again, b"b", 2)
        assert stored(node) == [b"a", b"again", b"b"]
    finally:
        node.close()


def test_a_restart_after_the_window_forgets_the_id_at_once(tmp_path: Path) -> None:
    node = windowed(tmp_path)
    conn = node.connect()
    assert not send(conn, b"a", 5)
    node.close()
    node.clock.now += WINDOW + 1  # the broker was down for longer than the window
    node = InProcessBroker(node.config, node.clock)
    try:
        assert not send(node.connect(), b"new epoch", 1)
    finally:
        node.close()


def test_a_restart_within_the_window_still_knows_the_id(tmp_path: Path) -> None:
    node = windowed(tmp_path)
    assert not send(node.connect(), b"a", 5)
    node.close()
    node.clock.now += WINDOW - 1
    node = InProcessBroker(node.config, node.clock)
    try:
        assert send(node.connect(), b"a", 5)
        node.tick(2)  # and the window counts from the last accepted SEND, not the restart
        assert not send(node.connect(peer="spec:2"), b"new epoch", 1)
    finally:
        node.close()
