"""Crash recovery after periodic index snapshots: the broker snapshots its stored state while it
runs; after kill -9 the next start loads the newest snapshot and replays only the journal
records written after it. The result is exactly what a full scan of the journal gives and what
clients were told: receipted messages are back, acknowledged ones are gone, in order."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_dispatch_runs_crash import stalled
from test_fast_restart import (
    SNAPSHOT,
    build_state,
    client,
    durable_held,
    durable_subscribe,
    observe,
    send,
)

from sluice_testing import BrokerProcess, RawStomp, eventually, stored
from sluicemq import Client, ClientError
from sluicemq.storage.segment import MAGIC

EVERY = 40
CONFIG = f"""
[journal]
segment_bytes = 65536
snapshot_records = {EVERY}

[[policy]]
queue = "held.>"
stream_dispatch = "complete"
"""


def snapshots(b: BrokerProcess) -> int:
    return sum("index snapshot written" in line for line in b.output)


def wait_for_snapshot(b: BrokerProcess, written: int) -> None:
    """Until more than ``written`` periodic snapshots were written."""
    b.wait_for_log("index snapshot written", 60, count=written + 1)


def fresh_snapshot(b: BrokerProcess) -> None:
    """Append enough filler records for a new snapshot and wait for it (taken on the broker's
    one-second tick). The tick may fall while the fillers are still being written, so up to
    ``EVERY - 1`` of them may follow the snapshot (``TAIL_BOUND``)."""
    written = snapshots(b)
    c = client(b)
    send(c, "/queue/filler", ["f"] * EVERY)
    c.close()
    wait_for_snapshot(b, written)


def ack_first(b: BrokerProcess, dest: str, n: int) -> list[str]:
    """Consume ``n`` messages with individual, receipted ACKs; returns their bodies."""
    c = client(b)
    c.send("SUBSCRIBE", {"destination": dest, "id": "a", "ack": "client-individual",
                         "activemq.prefetchSize": "1"})
    bodies: list[str] = []
    receipts = 0
    while receipts < n:
        frame = c.recv()
        if frame.command == "RECEIPT":
            receipts += 1
        elif len(bodies) < n:
            bodies.append(frame.body.decode())
            c.send("ACK", {"id": frame.headers["ack"], "receipt": f"ack{len(bodies)}"})
    c.close()
    return bodies


def crash(b: BrokerProcess) -> str:
    """kill -9 and start again; returns the start-up log."""
    b.kill()
    mark = b.mark()
    b.restart()
    return b.log(since=mark)


# Records a restart may replay after fresh_snapshot and a few more records: the fillers that
# followed the snapshot (< EVERY) and what the spec wrote after it (< EVERY in every spec here).
TAIL_BOUND = 2 * EVERY


def replayed(cycle: str) -> int:
    line = next(x for x in cycle.splitlines() if "index snapshot used" in x)
    return int(line.split("then ")[1].split(" journal records")[0])


def records_read(log: str) -> int:
    """Journal records a start read ("recovered ... from N records")."""
    line = next(x for x in log.splitlines() if "durable subscriptions from" in x)
    return int(line.split(" from ")[1].split(" records")[0])


def test_a_crash_replays_only_the_records_after_the_newest_snapshot(broker_factory) -> None:
    b = broker_factory(config_text=CONFIG)
    c = client(b)
    send(c, "/queue/orders", [f"m{i}" for i in range(60)])
    fresh_snapshot(b)
    send(c, "/queue/orders", [f"n{i}" for i in range(5)])
    assert ack_first(b, "/queue/orders", 10) == [f"m{i}" for i in range(10)]
    cycle = crash(b)
    assert "index snapshot used" in cycle
    assert 0 < replayed(cycle) < TAIL_BOUND, cycle
    assert stored(b.url, "/queue/orders") == [f"m{i}" for i in range(10, 60)] + [
        f"n{i}" for i in range(5)]


def test_messages_unacknowledged_at_the_snapshot_are_redelivered(broker_factory) -> None:
    b = broker_factory(config_text=CONFIG)
    send(client(b), "/queue/work", [f"w{i}" for i in range(20)])
    holder = client(b)
    holder.send("SUBSCRIBE", {"destination": "/queue/work", "id": "h", "ack": "client",
                              "activemq.prefetchSize": "5"})
    held = [holder.recv() for _ in range(5)]
    fresh_snapshot(b)  # captured while w0..w4 sit unacknowledged with the consumer
    holder.send("ACK", {"id": held[1].headers["ack"], "receipt": "r"})  # cumulative: w0, w1
    while holder.recv().command != "RECEIPT":
        pass
    assert "index snapshot used" in crash(b)
    assert stored(b.url, "/queue/work") == [f"w{i}" for i in range(2, 20)]


def test_what_a_stuck_auto_ack_consumer_was_never_written_at_the_snapshot_comes_back(
        broker_factory) -> None:
    """An ack:auto consumer that reads nothing is handed what its connection has room for; the
    kernel takes some of it, the broker holds the rest, and the removal of that rest is not
    journaled. A snapshot taken then keeps those messages as the queue's (its self-check
    counts them, or there is no snapshot), so after a crash none is lost: the queue holds every
    message the consumer did not read, in order, and perhaps a few it read (at least once)."""
    b = broker_factory(config_text=CONFIG + '[limits]\noutput_buffer_bytes = "32 KiB"\n')
    bodies = [f"{i:04d}" + "." * 2000 for i in range(150)]
    send(client(b), "/queue/auto.stuck", bodies)
    stuck = RawStomp(b.host, b.port, timeout=30, rcvbuf=4096)
    stuck.connect()
    stuck.send("SUBSCRIBE", {"destination": "/queue/auto.stuck", "id": "s", "ack": "auto"})
    stalled(b, "/queue/auto.stuck")
    fresh_snapshot(b)  # captured while the broker holds frames it never wrote
    assert "index snapshot used" in crash(b)
    read: list[str] = []
    try:
        while True:
            frame = stuck.recv(timeout=30)
            if frame.command == "MESSAGE":
                read.append(frame.body.decode())
    except (ConnectionError, OSError):
        pass
    stuck.close()
    assert read == bodies[:len(read)] and len(read) < len(bodies)
    left = stored(b.url, "/queue/auto.stuck")
    assert left, "what was never written came back"
    first = bodies.index(left[0])
    assert first <= len(read), f"lost after the crash: {bodies[len(read)][:4]}..."
    assert left == bodies[first:]


def test_snapshot_and_tail_give_what_a_full_scan_gives(broker_factory) -> None:
    b = broker_factory(config_text=CONFIG, name="snap")
    build_state(b)
    durable_subscribe(b, "late")
    durable_subscribe(b, "gone")
    fresh_snapshot(b)
    # After the snapshot: acks of captured messages, new messages of several priorities,
    # topic messages for durable subscriptions (one with a selector), an unsubscribe, and
    # a stream chunk that moves the stream's resume point.
    assert ack_first(b, "/queue/work", 3) == ["w3", "w4", "w5"]
    p = client(b)
    for i in range(4):
        send(p, "/queue/prio", [f"q{i}"], priority=str(9 - i))
    send(p, "/topic/ledger", ["e6", "e7"], n="7")
    gone = client(b, client_id="svc-gone")
    gone.send("UNSUBSCRIBE", {"id": "d", "activemq.subscriptionName": "gone",
                              "destination": "/topic/ledger", "receipt": "u"})
    assert gone.recv().command == "RECEIPT"
    gone.close()
    p.send("SEND", {"destination": "/queue/files", "persistent": "true",
                    "sluice-stream-id": "open", "JMSXGroupID": "open", "sluice-stream-seq": "2",
                    "sluice-stream-offset": "10", "sluice-stream-name": "open.bin",
                    "receipt": "c"}, b"open2")
    assert p.recv().command == "RECEIPT"
    b.kill()
    scanned_dir = b.data_dir.parent / "scanned"
    shutil.copytree(b.data_dir, scanned_dir)
    (scanned_dir / SNAPSHOT).unlink()
    mark = b.mark()
    b.restart()
    cycle = b.log(since=mark)
    assert "index snapshot used" in cycle and 0 < replayed(cycle) < TAIL_BOUND, cycle
    other = broker_factory(config_text=CONFIG, name="scanned")
    assert "no index snapshot: scanning the whole journal" in other.log()
    assert replayed(cycle) < records_read(other.log()), other.log()  # the snapshot spared most
    from_snapshot, from_scan = observe(b), observe(other)
    assert from_snapshot == from_scan
    assert from_scan["/queue/work"] == [f"w{i}" for i in range(6, 20)]
    assert from_scan["/queue/prio"][:5] == ["p9", "p19", "p29", "p39", "q0"]
    assert from_scan["books"] == ["e3", "e4", "e5", "e6", "e7"]
    assert from_scan["/queue/files"] == ["open0", "open1", "open2"]
    assert from_scan["stream"]["sluice-stream-next-seq"] == "3"
    for broker in (b, other):
        assert durable_held(broker, "late") == ["e6", "e7"]
        with Client(broker.url) as c, pytest.raises(ClientError,
                                                    match="no durable subscription 'gone'"):
            c.head("/topic/ledger", subscription="gone", client_id="svc-gone")


def written_segments(b: BrokerProcess) -> int:
    """Journal segments that hold records (the next one is made ahead of need, zeroed)."""
    count = 0
    for path in (b.data_dir / "journal").glob("*.log"):
        try:
            with path.open("rb") as f:
                count += f.read(len(MAGIC)) == MAGIC
        except FileNotFoundError:
            continue  # reclaimed meanwhile
    return count


def test_compaction_after_the_snapshot_moves_what_it_captured(broker_factory) -> None:
    """The snapshot points at messages in segment 1; compaction then copies them forward and
    deletes segment 1; the crash restart finds the copies in the journal after the snapshot."""
    b = broker_factory(config_text="[journal]\nsegment_bytes = 65536\nsnapshot_records = 0\n")
    c = client(b)
    send(c, "/queue/keep", ["k1", "k2"])
    churn = "x" * 1000
    send(c, "/queue/churn", [churn] * 70)  # fills segment 1, starts segment 2
    assert len(stored(b.url, "/queue/churn")) == 70
    send(c, "/queue/keep2", ["k3"])  # in segment 2, where the snapshot will be anchored
    b.stop()
    b.restart()  # the clean stop's snapshot: k1, k2 in segment 1; k3 in segment 2
    segment_1 = b.data_dir / "journal" / "00000000000000000001.log"
    c = client(b)
    # Compaction looks at the oldest segment once three segments hold records. Churn stops
    # there: with a fourth, segment 2 (k3, the snapshot's anchor) would be copied next.
    for _ in range(5):
        if written_segments(b) >= 3:
            break
        send(c, "/queue/churn", [churn] * 40)
        assert len(stored(b.url, "/queue/churn")) == 40
    assert written_segments(b) == 3
    # On the broker's one-second tick; its log line may reach us after the deletion.
    eventually(lambda: not segment_1.exists(),
               lambda: f"compaction moved k1 and k2 and deleted segment 1: {b.log()[-2000:]}")
    b.wait_for_log("compacting journal segment 1")
    cycle = crash(b)
    assert "index snapshot used: 3 messages as of segment 2" in cycle, cycle
    assert stored(b.url, "/queue/keep") == ["k1", "k2"]
    assert stored(b.url, "/queue/keep2") == ["k3"]


def test_a_corrupt_snapshot_falls_back_to_a_full_scan(broker_factory) -> None:
    b = broker_factory(config_text=CONFIG)
    send(client(b), "/queue/c", [f"m{i}" for i in range(50)])
    fresh_snapshot(b)
    path = b.data_dir / SNAPSHOT
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x04
    path.write_bytes(bytes(data))
    leftover = path.with_name(path.name + ".tmp")
    leftover.write_bytes(b"half a snapshot")  # as if a crash interrupted a write
    cycle = crash(b)
    assert "index snapshot ignored (checksum mismatch): scanning the whole journal" in cycle
    assert not leftover.exists()
    assert stored(b.url, "/queue/c") == [f"m{i}" for i in range(50)]


def test_a_truncated_snapshot_falls_back_to_a_full_scan(broker_factory) -> None:
    b = broker_factory(config_text=CONFIG)
    send(client(b), "/queue/t", [f"m{i}" for i in range(50)])
    fresh_snapshot(b)
    path: Path = b.data_dir / SNAPSHOT
    path.write_bytes(path.read_bytes()[:-7])
    assert "index snapshot ignored (bad trailer (truncated?))" in crash(b)
    assert stored(b.url, "/queue/t") == [f"m{i}" for i in range(50)]


def test_damage_the_snapshot_did_not_scan_costs_only_the_damaged_message(broker_factory) -> None:
    """Records before a snapshot's anchor are not read at start-up: a damaged one is found when
    its message is paged in, dropped and logged, and the queue carries on."""
    # One segment: no compaction copies the message elsewhere behind the test's back.
    b = broker_factory(config_text=CONFIG.replace("segment_bytes = 65536",
                                                  "segment_bytes = 1048576"))
    bodies = [f"body-{i:02d}-" + "x" * 200 for i in range(3000)]
    send(client(b), "/queue/rot", bodies)  # far beyond the in-memory window: paged out
    b.stop()
    segment = b.data_dir / "journal" / "00000000000000000001.log"  # then the zeroed spare
    data = bytearray(segment.read_bytes())
    at = data.find(b"body-05-")
    assert at > 0 and data.find(b"body-05-", at + 1) < 0
    data[at + 10] ^= 0x01
    segment.write_bytes(bytes(data))
    mark = b.mark()
    b.restart()
    assert "index snapshot used: 3000 messages" in b.log(since=mark)
    with Client(b.url) as c, c.subscribe("/queue/rot") as sub:  # the index counts 3000
        got = [sub.get(timeout=30) for _ in range(len(bodies) - 1)]
        assert [m.text() for m in got if m is not None] == bodies[:5] + bodies[6:]
        assert c.head("/queue/rot").count == 0, "the damaged one is gone, not waiting"
    assert "journal: dropped unreadable message" in b.log(since=mark)
