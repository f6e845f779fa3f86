"""Spec: a due scheduled message moves only while its destination has room (its policy's
``store_limit``), in process (tests/inprocess.py): the real broker core on a hand-moved clock,
so "due" is exact and nothing waits on a sleep.

What waits in the scheduler for a capped destination counts against its cap from the SEND on
(the scheduler's tally, ``Broker.scheduled_bytes``), so a burst larger than the cap comes due
only from a repetition's copies or from a cap lowered across a restart - as here: 30 KiB sent
under a 64 KiB cap, due under an 8 KiB one. The destination takes what its ``store_limit``
allows and the rest stays in its bucket - stored, listed and cancellable through the admin API -
until a consumer makes room. Then it moves, in due order: nothing lost, nothing twice. Another
destination's messages, due later, go on time meanwhile.
"""

from __future__ import annotations

from pathlib import Path

from inprocess import Connection, InProcessBroker, config_for
from sluicemq.admin import operations, snapshot
from sluicemq.config import PolicyEntry
from sluicemq.core.routing.names import QUEUE
from sluicemq.core.scheduling.calendar import NAME, bucket_name
from sluicemq.protocol.frames import Frame

START = 1_800_000_000.0  # the in-process clock's start: a whole second
LIMIT = 8192
BODY = 1024
BURST = 30  # 30 KiB due at once into a queue whose store_limit is 8 KiB
FIT = LIMIT // BODY  # moves while less than the limit is held: 8, as 8 SENDs would
ROOMY = PolicyEntry("queue", "full.>", {"store_limit": 8 * LIMIT})  # the cap at SEND time
FULL_Q = (QUEUE, "full.q")


def body(i: int) -> bytes:
    return f"{i:04d}".encode().ljust(BODY, b".")


def send_burst(conn: Connection) -> list[int]:
    """Message i is due at 1.000 s + (29 - i) x 10 ms: sent in the reverse of its due order,
    so only due order explains the order they arrive in. Returns the indexes in due order."""
    for i in range(BURST):
        answer = conn.request("SEND", {"destination": "/queue/full.q", "persistent": "true",
                                       "AMQ_SCHEDULED_DELAY": str(1000 + (BURST - 1 - i) * 10)},
                              body(i))
        assert answer.command == "RECEIPT", answer.headers
    for i in range(3):  # due after the whole burst, to a queue without a limit
        answer = conn.request("SEND", {"destination": "/queue/other", "persistent": "true",
                                       "AMQ_SCHEDULED_DELAY": "1400"}, b"other %d" % i)
        assert answer.command == "RECEIPT", answer.headers
    return list(reversed(range(BURST)))


def burst_under_a_lowered_cap(tmp_path: Path) -> tuple[InProcessBroker, list[int]]:
    """The burst sent under a 64 KiB cap, then the broker restarted with an 8 KiB one."""
    node = InProcessBroker(config_for(tmp_path / "data", policies=(ROOMY,)))
    due_order = send_burst(node.connect())
    assert node.broker.scheduled_bytes == {FULL_Q: BURST * BODY}
    node.close()
    policy = PolicyEntry("queue", "full.>", {"store_limit": LIMIT})
    node = InProcessBroker(config_for(tmp_path / "data", policies=(policy,)), node.clock)
    assert node.broker.scheduled_bytes == {FULL_Q: BURST * BODY}  # rebuilt by recovery
    return node, due_order


def drain(node: InProcessBroker, conn: Connection, count: int) -> list[Frame]:
    """Receive ``count`` messages, letting the scheduler take its turns as room appears (a
    turn is a zero-delay timer: the hand-moved clock fires it)."""
    got: list[Frame] = []
    for _ in range(4 * BURST):
        got += conn.take("MESSAGE")
        if len(got) >= count:
            break
        node.loop.advance(0.001)
        node.loop.run_until(lambda: any(f.command == "MESSAGE" for f in conn.frames()))
    return got


def test_a_due_burst_waits_in_its_bucket_while_the_queue_is_full_then_moves_in_due_order(
        tmp_path: Path) -> None:
    node, due_order = burst_under_a_lowered_cap(tmp_path)
    try:
        other = node.connect(peer="spec:other")
        other.request("SUBSCRIBE", {"destination": "/queue/other", "id": "o"})
        node.loop.advance(START + 1.5 - node.clock.now)  # everything is due
        node.loop.run_until(lambda: node.broker.queues["full.q"].pending.held >= LIMIT)

        full = node.broker.queues["full.q"]
        assert len(full.pending) == FIT and full.pending.held == LIMIT  # not 30 KiB
        assert node.core.scheduler.waiting_for_room() == BURST - FIT
        assert node.broker.scheduled_bytes == {FULL_Q: (BURST - FIT) * BODY}
        assert [m.body for m in other.messages(3)] == [b"other %d" % i for i in range(3)]
        bucket = node.broker.queues[bucket_name(int(START) + 1)]
        listed = snapshot.browse(bucket)["messages"]
        assert len(listed) == BURST - FIT  # still the bucket's: listed, counted
        cancelled = due_order[FIT + 5]
        [mid] = [m["mid"] for m in listed if m["body_preview"].startswith(f"{cancelled:04d}")]
        assert operations.remove_messages(bucket, [mid]) == 1
        assert node.broker.scheduled_bytes == {FULL_Q: (BURST - FIT - 1) * BODY}  # cancelled
        node.loop.advance(0.5)
        assert len(full.pending) == FIT  # still no room: nothing moved

        consumer = node.connect(peer="spec:consumer")
        consumer.request("SUBSCRIBE", {"destination": "/queue/full.q", "id": "s"})
        got = drain(node, consumer, BURST - 1)
        expected = [i for i in due_order if i != cancelled]
        assert [int(m.body[:4]) for m in got] == expected  # due order, once each
        assert len({m.headers["message-id"] for m in got}) == BURST - 1
        node.loop.advance(1.0)
        assert consumer.take("MESSAGE") == [] and len(bucket.pending) == 0
        assert node.core.scheduler.waiting_for_room() == 0
        assert node.broker.scheduled_bytes == {} and node.core.scheduler.tallied() == 0
    finally:
        node.close()


def test_held_messages_survive_a_restart_and_still_wait_for_room(tmp_path: Path) -> None:
    node, due_order = burst_under_a_lowered_cap(tmp_path)
    try:
        node.loop.advance(START + 1.5 - node.clock.now)
        node.loop.run_until(lambda: node.broker.queues["full.q"].pending.held >= LIMIT)
        assert node.core.scheduler.waiting_for_room() == BURST - FIT
        node = node.restart()
        assert node.core.waiting == BURST - FIT  # the held ones (the other queue got its 3)
        node.loop.advance(0.5)
        node.loop.run_until(lambda: node.core.scheduler.waiting_for_room() == BURST - FIT)
        assert len(node.broker.queues["full.q"].pending) == FIT
        consumer = node.connect(peer="spec:consumer")
        consumer.request("SUBSCRIBE", {"destination": "/queue/full.q", "id": "s"})
        got = drain(node, consumer, BURST)
        assert [int(m.body[:4]) for m in got] == due_order
    finally:
        node.close()


def test_the_tally_follows_what_waits_for_a_capped_destination(tmp_path: Path) -> None:
    """Persistent scheduled bytes for a capped destination are counted when filed (SEND,
    refiling from the far queue, each repetition), out when moved or cancelled, and rebuilt
    by recovery; non-persistent ones and uncapped destinations are not counted."""
    node = InProcessBroker(config_for(tmp_path / "data", policies=(ROOMY,)))
    try:
        conn = node.connect()

        def send(delay_ms: int, destination: str = "/queue/full.q", **extra: str) -> None:
            headers = {"destination": destination, "persistent": "true",
                       "AMQ_SCHEDULED_DELAY": str(delay_ms), **extra}
            assert conn.request("SEND", headers, body(0)).command == "RECEIPT"

        for _ in range(3):
            send(120_000)  # far: in sluice.scheduled, refiled into its bucket a minute before
        send(1000)
        send(1000, AMQ_SCHEDULED_PERIOD="100", AMQ_SCHEDULED_REPEAT="2")  # three copies
        send(1000, persistent="false")  # not stored: not counted
        send(1000, destination="/queue/uncapped")
        tally = node.broker.scheduled_bytes
        assert tally == {FULL_Q: 5 * BODY} and node.core.scheduler.tallied() == 5
        far = node.broker.queues[NAME]
        assert operations.remove_messages(far, [next(iter(far.pending)).mid]) == 1
        assert tally == {FULL_Q: 4 * BODY}

        node = node.restart()
        tally = node.broker.scheduled_bytes
        assert tally == {FULL_Q: 4 * BODY}
        node.loop.advance(START + 1.05 - node.clock.now)  # the one-off and the first copy
        node.loop.run_until(lambda: len(node.broker.queues["full.q"].pending) == 2)
        assert tally == {FULL_Q: 3 * BODY}  # two far, the repetition's next copy
        node.loop.advance(0.25)  # the two other copies
        node.loop.run_until(lambda: len(node.broker.queues["full.q"].pending) == 4)
        assert tally == {FULL_Q: 2 * BODY}
        node.loop.advance(START + 100 - node.clock.now)  # the far ones refiled: still counted
        node.loop.run_until(lambda: len(node.broker.queues[NAME].pending) == 0)
        assert tally == {FULL_Q: 2 * BODY} and node.core.scheduler.tallied() == 2
        node.loop.advance(21.0)  # and moved
        node.loop.run_until(lambda: len(node.broker.queues["full.q"].pending) == 6)
        assert tally == {} and node.core.scheduler.tallied() == 0
    finally:
        node.close()
