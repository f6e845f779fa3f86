"""Spec of the blocking client's range reads: bounded client memory, a connection that stays
alive while the caller is slow, no deadlock when the caller uses the client inside the loop,
and cancellation by leaving the loop."""

from __future__ import annotations

import time

from sluicemq.client import Client
from sluicemq.client.ranges import MAX_BYTES, RangeHead, parse_end, range_headers

# Heart-beats every second: a silent peer counts as dead after two, and the slow caller below
# stays away for three. Faster beats would also test whether a busy machine schedules every
# process within 600 ms, which is not this spec's business.
FAST_BEATS = "[limits]\nheartbeat_ms = 1000\n"


def test_headers_and_end_frames_translate_both_ways() -> None:
    assert range_headers(start=5, end=9, head_only=True, splits=3, ledger="l",
                         subscription="s", client_id="c", streams=True) == {
        "browser": "true", "sluice-seq-from": "5", "sluice-seq-to": "9",
        "sluice-head-only": "true", "sluice-splits": "3", "sluice-ledger": "l",
        "activemq.subscriptionName": "s", "sluice-client-id": "c",
        "sluice-streams": "complete"}
    assert "sluice-client-id" not in range_headers(client_id="c")  # only with a subscription
    end = {"browser": "end", "sluice-seq-first": "1", "sluice-seq-next": "9",
           "sluice-seq-end": "9", "sluice-count": "4", "sluice-splits": "3,6",
           "sluice-ledger-committed": "2"}
    assert parse_end(end) == RangeHead(1, 9, 9, 4, [3, 6], 2)
    assert parse_end({**end, "sluice-splits": ""}).splits == []


def fill(c: Client, destination: str, n: int, size: int) -> None:
    body = b"x" * size
    for _ in range(n - 1):
        c.send_async(destination, body)
    c.send(destination, body)


def test_a_slow_caller_holds_the_read_back_and_the_connection_stays_alive(broker_factory) -> None:
    b = broker_factory(config_text=FAST_BEATS)
    with Client(b.url) as producer:  # filled without fast heart-beats: not what is tested
        fill(producer, "/queue/slow", 600, 64 << 10)  # 38 MiB: more than the client buffers
    with Client(b.url, heartbeat=(1000, 1000)) as c:
        with c.read_range("/queue/slow") as rng:
            first = next(rng)
            time.sleep(3.0)  # a slow caller: the reader thread waits for us, the broker for it
            buffered = rng._bytes
            rest = sum(1 for _ in rng)
        assert buffered <= MAX_BYTES + (64 << 10)
        assert first.seq is not None and rest == 599
        assert rng.head is not None and rng.head.count == 600
        assert c.head("/queue/slow").count == 600  # still connected, nothing consumed


def test_using_the_client_inside_a_range_loop_does_not_deadlock(broker) -> None:
    with Client(broker.url, timeout=20) as c:
        fill(c, "/queue/src", 3000, 8 << 10)  # 24 MiB
        copied = 0
        for msg in c.read_range("/queue/src"):
            if msg.seq is not None and msg.seq % 100 == 0:
                c.send("/queue/copy", msg.body)  # waits for a receipt behind the range
                copied += 1
        assert c.head("/queue/copy").count == copied


def test_leaving_a_read_early_cancels_it(broker) -> None:
    with Client(broker.url) as c:
        fill(c, "/queue/cancel", 3000, 1 << 10)
        with c.read_range("/queue/cancel") as rng:
            taken = [next(rng) for _ in range(5)]
        assert len(taken) == 5 and rng.head is None
        assert c.head("/queue/cancel").count == 3000
        with c.read_range("/queue/cancel", max_messages=2) as again:
            assert len(list(again)) == 2
