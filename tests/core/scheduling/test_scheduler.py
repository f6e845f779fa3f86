"""Spec of the scheduler, in process (tests/inprocess.py): the real broker core on a hand-moved
clock, so a schedule minutes long runs in milliseconds and every time is checked to the tick.

- A message in its last half second (read out of its bucket, waiting to be due) is still its
  bucket queue's: counted against the memory limit, listed and cancellable through the admin
  API, kept by an index snapshot.
- A cron round interrupted by a restart between two repetitions goes on where it was: the
  remaining repetitions at their times, then the next round, each copy once.
"""

from __future__ import annotations

from pathlib import Path

from inprocess import Connection, InProcessBroker, config_for
from sluicemq.admin import operations, snapshot
from sluicemq.app import STATE_PARTS
from sluicemq.core.persistence.capture import capture, save_snapshot, verify
from sluicemq.core.scheduling.calendar import AHEAD_MS, bucket_name

START = 1_800_000_000.0  # the in-process clock's start: a whole minute
EARLY = 0.01  # seconds: "not yet" is checked this long before a due time, "done" this long after


def scheduled_send(conn: Connection, destination: str, body: bytes, **headers: str) -> None:
    answer = conn.request("SEND", {"destination": destination, "persistent": "true",
                                   **headers}, body)
    assert answer.command == "RECEIPT", answer.headers


def arrived(conn: Connection) -> int:
    return sum(f.command == "MESSAGE" for f in conn.frames())


def advance_to(node: InProcessBroker, at: float) -> None:
    node.loop.advance(at - node.clock.now)


def test_in_its_last_half_second_a_message_is_still_its_buckets_counted_and_cancellable(
        tmp_path: Path) -> None:
    node = InProcessBroker(config_for(tmp_path / "data"))
    try:
        conn = node.connect()
        conn.request("SUBSCRIBE", {"destination": "/queue/jobs", "id": "s"})
        scheduled_send(conn, "/queue/jobs", b"cancel me", AMQ_SCHEDULED_DELAY="1700")
        bucket = node.broker.queues[bucket_name(int(START) + 1)]
        counted = node.broker.memory.used
        assert len(bucket.pending) == 1 and counted > 0
        advance_to(node, START + 1 - AHEAD_MS / 1000 + EARLY)  # the bucket was read
        assert list(bucket.pending.aside) == [m.mid for m in bucket.pending]
        assert node.broker.memory.used == counted  # still counted, though out of the lanes
        [listed] = snapshot.browse(bucket)["messages"]
        assert listed["body_preview"] == "cancel me"
        assert operations.remove_messages(bucket, [listed["mid"]]) == 1
        assert len(bucket.pending) == 0 and node.broker.memory.used == 0
        advance_to(node, START + 3)
        assert arrived(conn) == 0  # its time came and went: cancelled
        node = node.restart()
        assert node.core.waiting == 0  # the cancel was journaled
    finally:
        node.close()


def test_an_index_snapshot_taken_in_that_half_second_keeps_the_message(tmp_path: Path) -> None:
    node = InProcessBroker(config_for(tmp_path / "data"))
    try:
        producer = node.connect()
        scheduled_send(producer, "/queue/jobs", b"kept", AMQ_SCHEDULED_DELAY="1700")
        advance_to(node, START + 1 - AHEAD_MS / 1000 + EARLY)
        cap = capture(node.broker, STATE_PARTS)
        assert not isinstance(cap, str) and verify(cap) is None  # the holders add up
        save_snapshot(node.broker, STATE_PARTS)
        node = node.restart()
        assert node.core.counts["snapshot"] == 1 and node.core.waiting == 1
        conn = node.connect()
        conn.request("SUBSCRIBE", {"destination": "/queue/jobs", "id": "s"})
        advance_to(node, START + 1.7 - EARLY)
        assert arrived(conn) == 0
        advance_to(node, START + 1.7 + EARLY)
        assert [m.body for m in conn.messages(1)] == [b"kept"]
    finally:
        node.close()


CRON = {"AMQ_SCHEDULED_CRON": "* * * * *", "AMQ_SCHEDULED_DELAY": "200",
        "AMQ_SCHEDULED_PERIOD": "1000", "AMQ_SCHEDULED_REPEAT": "3"}


def expect_copies(node: InProcessBroker, conn: Connection, times: list[float]) -> list[str]:
    """Each copy arrives at its time, not before; returns their message-ids."""
    ids = []
    for at in times:
        advance_to(node, at - EARLY)
        assert arrived(conn) == 0, f"a copy came before {at - START:.3f} s"
        advance_to(node, at + EARLY)
        [copy] = conn.messages(1)
        assert copy.body == b"round"
        ids.append(copy.headers["message-id"])
    return ids


def test_a_cron_round_cut_by_a_restart_between_two_repeats_goes_on_then_the_next_round(
        tmp_path: Path) -> None:
    """Cron `* * * * *` with a 200 ms delay and 3 repeats 1 s apart: copies at :00.2, :01.2,
    :02.2, :03.2 of every minute. The broker restarts between the second and third copy of
    the first round; the third and fourth still come at their times, once each, and the next
    round comes a minute later, once."""
    node = InProcessBroker(config_for(tmp_path / "data"))
    try:
        advance_to(node, START + 10)
        scheduled_send(node.connect(), "/queue/cron", b"round", **CRON)
        conn = node.connect(peer="spec:consumer")
        conn.request("SUBSCRIBE", {"destination": "/queue/cron", "id": "s"})
        minute = START + 60
        ids = expect_copies(node, conn, [minute + 0.2, minute + 1.2])
        advance_to(node, minute + 1.7)
        node = node.restart()  # between the second and the third copy
        assert node.core.waiting == 1
        conn = node.connect(peer="spec:consumer")
        conn.request("SUBSCRIBE", {"destination": "/queue/cron", "id": "s"})
        ids += expect_copies(node, conn, [minute + 2.2, minute + 3.2])
        advance_to(node, minute + 60 - EARLY)
        assert arrived(conn) == 0  # the round is over: nothing until the next minute
        ids += expect_copies(node, conn, [minute + 60 + t for t in (0.2, 1.2, 2.2, 3.2)])
        advance_to(node, minute + 120 - EARLY)
        assert arrived(conn) == 0
        assert len(set(ids)) == 8  # eight copies, each its own message
        [waiting] = [m for name, q in node.broker.queues.items()
                     if name.startswith("sluice.scheduled") for m in q.pending]
        assert int(waiting.headers["sluice-scheduled-at"]) == int((minute + 120.2) * 1000)
    finally:
        node.close()
