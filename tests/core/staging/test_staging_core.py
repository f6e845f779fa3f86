"""Spec of staged publishing, in process (tests/inprocess.py; docs/replay-protocol.md,
section 3): a parked part is invisible, publication makes exactly the named parts visible in
order and once, and both survive a restart."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from inprocess import Connection, InProcessBroker, config_for
from sluicemq.config import Limits


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


# -- column batches: journaled as they arrive, the COMMIT adds the final record ---------------

def batch_of(rows: list[bytes]) -> bytes:
    from sluicemq.protocol.columns import ColumnWriter

    w = ColumnWriter()
    for i, body in enumerate(rows):
        w.add(0, 0, 0, 4, 0, b'{"row":"%d"}' % i, body)
    return b"".join(w.finish())


def send_batch(conn: Connection, tx: str, rows: list[bytes]) -> None:
    answer = conn.request("SEND", {"destination": "/queue/out", "transaction": tx,
                                   "sluice-format": "columns", "receipt": f"r-{tx}"},
                          batch_of(rows))
    assert answer.command == "RECEIPT", answer.headers


def test_batches_of_an_unfinished_part_are_gone_after_a_restart(tmp_path: Path) -> None:
    node = InProcessBroker(config_for(tmp_path / "data"))
    conn = node.connect()
    conn.request("BEGIN", {"transaction": "t", "sluice-stage": "sink/b1/p0"})
    send_batch(conn, "t", [b"lost-1", b"lost-2"])
    written = len(node.broker.stager.writing)
    node = node.restart()  # no COMMIT: the records have no final one
    try:
        assert written == 1
        conn = node.connect()
        answer = conn.request("COMMIT", {"sluice-stage-commit": "sink/b1",
                                         "sluice-stage-parts": "p0"})
        assert answer.command == "ERROR" and "no part p0" in answer.headers["message"]
        conn.request("BEGIN", {"transaction": "t2", "sluice-stage": "sink/b1/p0"})
        send_batch(conn, "t2", [b"kept"])
        assert conn.request("COMMIT", {"transaction": "t2"}).headers[
            "sluice-stage-messages"] == "1"
        assert publish(conn, "p0")["sluice-stage-messages"] == "1"
        conn.request("SUBSCRIBE", {"destination": "/queue/out", "id": "s"})
        assert [m.body for m in conn.messages(1)] == [b"kept"]
    finally:
        node.close()


def test_an_index_snapshot_taken_while_a_part_is_written_keeps_the_part_whole(
        tmp_path: Path) -> None:
    from sluicemq.app import STATE_PARTS
    from sluicemq.core.persistence.capture import save_snapshot

    node = InProcessBroker(config_for(tmp_path / "data"))
    conn = node.connect()
    conn.request("BEGIN", {"transaction": "t", "sluice-stage": "sink/b1/p0"})
    send_batch(conn, "t", [b"a", b"b"])
    conn.request("SEND", {"destination": "/queue/out", "transaction": "t"}, b"c")  # plain
    save_snapshot(node.broker, STATE_PARTS)  # the part's first record lies before it
    send_batch(conn, "t", [b"d"])
    assert conn.request("COMMIT", {"transaction": "t"}).headers["sluice-stage-messages"] == "4"
    node = node.restart()  # recovery: the snapshot, then the journal after it
    try:
        conn = node.connect()
        assert publish(conn, "p0")["sluice-stage-messages"] == "4"
        conn.request("SUBSCRIBE", {"destination": "/queue/out", "id": "s"})
        assert [m.body for m in conn.messages(4)] == [b"a", b"b", b"c", b"d"]
    finally:
        node.close()


def test_an_aborted_part_lets_go_of_its_records(tmp_path: Path) -> None:
    node = InProcessBroker(config_for(tmp_path / "data"))
    try:
        conn = node.connect()
        conn.request("BEGIN", {"transaction": "t", "sluice-stage": "sink/b1/p0"})
        send_batch(conn, "t", [b"x" * 1000] * 50)
        stager = node.broker.stager
        assert len(stager.writing) == 1 and stager.pins()
        assert conn.request("ABORT", {"transaction": "t", "receipt": "a"}).command == "RECEIPT"
        assert not stager.writing and not stager.pins()
    finally:
        node.close()


# -- stage_timeout: the housekeeping tick on the injected clock -------------------------------

def test_a_part_nobody_publishes_is_discarded_after_stage_timeout_and_stays_gone(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    node = InProcessBroker(config_for(tmp_path / "data",
                                      limits=replace(Limits(), stage_timeout=10.0)))
    conn = node.connect()
    stage(conn, "p0", [b"late"])
    stage(conn, "p1", [b"kept"])
    node.tick(9)  # within the timeout: nothing discarded
    assert node.broker.stager.discarded_parts == 0
    node.tick(2)
    assert node.broker.stager.discarded_parts == 2
    assert "not published within stage_timeout" in caplog.text
    answer = conn.request("COMMIT", {"sluice-stage-commit": "sink/b1",
                                     "sluice-stage-parts": "p0"})
    assert answer.command == "ERROR" and "no part p0" in answer.headers["message"]
    node = node.restart()  # the discard was journaled: recovery does not bring them back
    try:
        answer = node.connect().request("COMMIT", {"sluice-stage-commit": "sink/b1",
                                                   "sluice-stage-parts": "p1"})
        assert answer.command == "ERROR" and "no part p1" in answer.headers["message"]
    finally:
        node.close()


def test_a_part_discarded_by_stage_timeout_leaves_its_stagers_share(tmp_path: Path) -> None:
    """With ``user_store_limit`` set a parked part is charged to its stager (here, security
    off, the anonymous user) until the housekeeping tick discards it; a restart before that
    charges it again."""
    limits = replace(Limits(), stage_timeout=10.0, user_store_limit=1 << 20)
    node = InProcessBroker(config_for(tmp_path / "data", limits=limits))
    conn = node.connect()
    stage(conn, "p0", [b"x" * 1000, b"y" * 24])
    conn.request("BEGIN", {"transaction": "t", "sluice-stage": "sink/b1/p1"})
    send_batch(conn, "t", [b"z" * 100] * 3)
    conn.request("COMMIT", {"transaction": "t"})
    assert node.broker.shares is not None and node.broker.shares.used(b"") == 1324
    node = node.restart()
    try:
        shares = node.broker.shares
        assert shares is not None and shares.used(b"") == 1324
        node.tick(11)
        assert node.broker.stager.discarded_parts == 2
        assert shares.used(b"") == 0 and shares.by_user()["anonymous"]["messages"] == 0
    finally:
        node.close()
