"""Spec of staged publishing, in process (tests/inprocess.py; docs/replay-protocol.md,
section 3): a parked part is invisible, publication makes exactly the named parts visible in
order and once, and both survive a restart."""

from __future__ import annotations

from pathlib import Path

from inprocess import Connection, InProcessBroker, config_for


def stage(conn: Connection, part: str, bodies: list[bytes]) -> None:
    tx = f"stage-{part}"
    assert conn.request("BEGIN", {"transaction": tx,
                                  "sluice-stage": f"sink/b1/{part}"}).command == "RECEIPT"
    for body in bodies:
        conn.request("SEND", {"destination": "/queue/out", "transaction": tx,
                              "persistent": "true"}, body)
    answer = conn.request("COMMIT", {"transaction": tx})
    assert answer.headers["sluice-stage-result"] == "staged"


def publish(conn: Connection, parts: str) -> dict[str, str]:
    answer = conn.request("COMMIT", {"sluice-stage-commit": "sink/b1",
                                     "sluice-stage-parts": parts})
    assert answer.command == "RECEIPT", answer.headers
    return answer.headers


def test_parts_are_invisible_until_published_then_visible_in_part_order(
        tmp_path: Path) -> None:
    node = InProcessBroker(config_for(tmp_path / "data"))
    try:
        conn = node.connect()
        stage(conn, "p1", [b"c", b"d"])
        stage(conn, "p0", [b"a", b"b"])
        assert "out" not in node.broker.queues or len(node.broker.queues["out"].pending) == 0
        first = publish(conn, "p0,p1")
        assert first["sluice-stage-result"] == "published"
        assert first["sluice-stage-messages"] == "4"
        again = publish(conn, "p0,p1")
        assert again["sluice-stage-result"] == "duplicate"
        consumer = node.connect(peer="spec:2")
        consumer.request("SUBSCRIBE", {"destination": "/queue/out", "id": "s"})
        assert [m.body for m in consumer.messages(4)] == [b"a", b"b", b"c", b"d"]
    finally:
        node.close()


def test_a_parked_part_and_a_publication_survive_a_restart(tmp_path: Path) -> None:
    node = InProcessBroker(config_for(tmp_path / "data"))
    stage(node.connect(), "p0", [b"x", b"y"])
    node = node.restart()
    try:
        conn = node.connect()
        assert publish(conn, "p0")["sluice-stage-result"] == "published"
        node = node.restart()
        again = node.connect()
        assert publish(again, "p0")["sluice-stage-result"] == "duplicate"
        again.request("SUBSCRIBE", {"destination": "/queue/out", "id": "s"})
        assert [m.body for m in again.messages(2)] == [b"x", b"y"]
    finally:
        node.close()
