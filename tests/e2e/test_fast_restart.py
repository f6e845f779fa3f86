"""Fast restart: a clean stop leaves an index snapshot that the next start loads instead of
scanning the journal, replaying only the records after it; a damaged snapshot or one whose
anchoring record is gone means a full scan; either way the broker comes back in the same state.
(Crashes after periodic snapshots: test_crash_restart.py.)"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from sluice_testing import BrokerProcess, RawStomp, eventually, restart_cycle, stored
from sluicemq import Client

SNAPSHOT = Path("journal") / "index.snapshot"
CONFIG = """
[journal]
segment_bytes = 65536

[[policy]]
queue = "held.>"
stream_dispatch = "complete"
"""


def client(b: BrokerProcess, **headers: str) -> RawStomp:
    c = RawStomp(b.host, b.port)
    c.connect(**headers)
    return c


def send(c: RawStomp, dest: str, bodies: list[str], **headers: str) -> None:
    """Persistent SENDs, each receipted before the next."""
    for body in bodies:
        c.send("SEND", {"destination": dest, "persistent": "true", "receipt": "r", **headers},
               body.encode())
        frame = c.recv()
        assert frame.command == "RECEIPT", frame


def durable_held(b: BrokerProcess, name: str, **headers: str) -> list[str]:
    """Everything durable subscription ``name`` of /topic/ledger (client-id ``svc-<name>``)
    holds, read by re-attaching to it (auto ack): the broker says how many (a head query)
    and each is awaited, so a slow delivery cannot end the reading early."""
    with Client(b.url) as q:
        count = q.head("/topic/ledger", subscription=name, client_id=f"svc-{name}").count
    d = client(b, client_id=f"svc-{name}")
    d.send("SUBSCRIBE", {"destination": "/topic/ledger", "id": name, "ack": "auto",
                         "activemq.subscriptionName": name, **headers})
    frames = [d.recv(timeout=30) for _ in range(count)]
    assert all(f.command == "MESSAGE" for f in frames), frames
    return [f.body.decode() for f in frames]




def test_clean_stop_writes_a_snapshot_that_the_next_start_uses(broker) -> None:
    send(client(broker), "/queue/fast", [f"m{i}" for i in range(300)])
    cycle = restart_cycle(broker)
    assert "index snapshot written: 300 messages" in cycle
    assert "index snapshot used: 300 messages" in cycle
    assert "then 0 journal records replayed" in cycle
    assert (broker.data_dir / SNAPSHOT).exists(), "a snapshot stays valid while the journal grows"
    assert stored(broker.url, "/queue/fast") == [f"m{i}" for i in range(300)]


def test_kill_9_after_a_snapshot_start_replays_the_records_after_it(broker) -> None:
    c = client(broker)
    send(c, "/queue/k", ["a", "b"])
    assert "index snapshot used" in restart_cycle(broker)
    send(client(broker), "/queue/k", ["c"])
    cycle = restart_cycle(broker, kill=True)
    assert "index snapshot used: 2 messages" in cycle and "then 1 journal records" in cycle
    assert stored(broker.url, "/queue/k") == ["a", "b", "c"]


def test_an_older_snapshot_plus_the_journal_after_it_is_exact(broker) -> None:
    send(client(broker), "/queue/s", ["a", "b", "c"])
    broker.stop()
    old = (broker.data_dir / SNAPSHOT).read_bytes()
    broker.restart()
    c = client(broker)
    send(c, "/queue/s", ["d"])
    c.send("SUBSCRIBE", {"destination": "/queue/s", "id": "x", "ack": "client-individual"})
    first = c.recv()
    c.send("ACK", {"id": first.headers["ack"], "receipt": "acked"})
    while c.recv().command != "RECEIPT":
        pass
    broker.stop()
    (broker.data_dir / SNAPSHOT).write_bytes(old)  # as if the newer snapshot had been lost
    mark = broker.mark()
    broker.restart()
    assert "index snapshot used: 3 messages" in broker.log(since=mark)
    assert stored(broker.url, "/queue/s") == ["b", "c", "d"]


def test_a_snapshot_whose_anchor_is_gone_is_ignored(broker_factory) -> None:
    b = broker_factory(config_text="[journal]\nsegment_bytes = 65536\n")
    send(client(b), "/queue/g", ["a"])
    b.stop()
    old = (b.data_dir / SNAPSHOT).read_bytes()
    b.restart()
    c = client(b)
    send(c, "/queue/g", ["x" * 1000 for _ in range(200)])  # four more segments
    assert len(stored(b.url, "/queue/g")) == 201  # consumed: the old segments are reclaimed
    journal = b.data_dir / "journal"
    eventually(lambda: not (journal / "00000000000000000001.log").exists(),
               "the first segment reclaimed")
    b.kill()
    (b.data_dir / SNAPSHOT).write_bytes(old)
    mark = b.mark()
    b.restart()
    cycle = b.log(since=mark)
    assert "index snapshot ignored (segment 1 is gone): scanning the whole journal" in cycle
    assert not (b.data_dir / SNAPSHOT).exists(), "an unusable snapshot is deleted"
    send(client(b), "/queue/g", ["after"])
    assert stored(b.url, "/queue/g") == ["after"]


def test_a_damaged_snapshot_is_ignored(broker) -> None:
    send(client(broker), "/queue/d", ["a", "b"])
    broker.stop()
    path = broker.data_dir / SNAPSHOT
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    mark = broker.mark()
    broker.restart()
    assert "index snapshot ignored (checksum mismatch): scanning the whole journal" in broker.log(
        since=mark)
    assert stored(broker.url, "/queue/d") == ["a", "b"]


def durable_subscribe(b: BrokerProcess, name: str, selector: str | None = None) -> None:
    """Create durable subscription ``name`` on /topic/ledger (client-id ``svc-<name>``) and
    leave it without a consumer: detached by UNSUBSCRIBE (no subscription name: it stays)
    before anything is published, so no message can reach the departing consumer."""
    d = client(b, client_id=f"svc-{name}")
    headers = {"destination": "/topic/ledger", "id": "d", "receipt": "sub",
               "activemq.subscriptionName": name}
    if selector:
        headers["selector"] = selector
    d.send("SUBSCRIBE", headers)
    assert d.recv().command == "RECEIPT"
    d.send("UNSUBSCRIBE", {"id": "d", "receipt": "detached"})
    assert d.recv().command == "RECEIPT"
    d.close()


def build_state(b: BrokerProcess) -> None:
    """Queues with priorities, acked and returned messages, durable subscriptions (one with a
    selector), an open stream and a stream held for `complete` dispatch."""
    p = client(b)
    for i in range(40):
        send(p, "/queue/prio", [f"p{i}"], priority=str(i % 10))
    send(p, "/queue/work", [f"w{i}" for i in range(20)])
    c = client(b)
    c.send("SUBSCRIBE", {"destination": "/queue/work", "id": "w", "ack": "client-individual",
                         "activemq.prefetchSize": "5"})
    frames = [c.recv() for _ in range(5)]
    for f in frames[:3]:
        c.send("ACK", {"id": f.headers["ack"], "receipt": f"a{f.headers['ack']}"})
        while c.recv().command != "RECEIPT":
            pass
    c.close()  # two delivered, unacked messages go back to the queue
    durable_subscribe(b, "books", "n > 2")
    durable_subscribe(b, "all")
    for i in range(6):
        send(p, "/topic/ledger", [f"e{i}"], n=str(i))
    for dest, sid in (("/queue/files", "open"), ("/queue/held.files", "held")):
        for seq in range(2):
            p.send("SEND", {"destination": dest, "persistent": "true", "sluice-stream-id": sid,
                            "JMSXGroupID": sid, "sluice-stream-seq": str(seq),
                            "sluice-stream-offset": str(seq * 5), "receipt": "c",
                            "sluice-stream-name": f"{sid}.bin"}, f"{sid}{seq}".encode())
            assert p.recv().command == "RECEIPT"


def observe(b: BrokerProcess) -> dict[str, Any]:
    """What clients can see of the state `build_state` made."""
    c = client(b)
    seen: dict[str, Any] = {}
    c.send("SEND", {"destination": "/queue/files", "sluice-stream-query": "open",
                    "receipt": "q"})
    answer = c.recv()
    seen["stream"] = {k: v for k, v in answer.headers.items() if k.startswith("sluice-stream")}
    c.send("SEND", {"destination": "/queue/held.files", "persistent": "true",
                    "sluice-stream-id": "held", "JMSXGroupID": "held", "sluice-stream-seq": "2",
                    "sluice-stream-offset": "10", "sluice-stream-final": "true",
                    "sluice-stream-size": "15", "sluice-stream-sha256": "x",
                    "sluice-stream-name": "held.bin", "receipt": "f"}, b"held2")
    assert c.recv().command == "RECEIPT"
    for dest in ("/queue/prio", "/queue/work", "/queue/files", "/queue/held.files"):
        seen[dest] = stored(b.url, dest)
    seen["books"] = durable_held(b, "books", selector="n > 2")
    seen["all"] = durable_held(b, "all")
    return seen


def test_restored_state_equals_the_scanned_state(broker_factory) -> None:
    b = broker_factory(config_text=CONFIG, name="snap")
    build_state(b)
    b.stop()
    scanned_dir = b.data_dir.parent / "scanned"
    shutil.copytree(b.data_dir, scanned_dir)
    (scanned_dir / SNAPSHOT).unlink()
    mark = b.mark()
    b.restart()
    assert "index snapshot used" in b.log(since=mark)
    other = broker_factory(config_text=CONFIG, name="scanned")
    assert "no index snapshot: scanning the whole journal" in other.log()
    from_snapshot, from_scan = observe(b), observe(other)
    assert from_snapshot == from_scan
    assert from_scan["/queue/prio"][:4] == ["p9", "p19", "p29", "p39"]
    assert from_scan["/queue/work"] == [f"w{i}" for i in range(3, 20)]
    assert from_scan["books"] == ["e3", "e4", "e5"]
    assert from_scan["all"] == [f"e{i}" for i in range(6)]
    assert from_scan["/queue/files"] == ["open0", "open1"]
    assert from_scan["/queue/held.files"] == ["held0", "held1", "held2"]
    assert from_scan["stream"]["sluice-stream-next-seq"] == "2"


def test_after_a_snapshot_start_segments_are_freed_and_a_crash_loses_nothing(
        broker_factory) -> None:
    # Three segments: fewer than compaction needs, so only consumption frees them.
    b = broker_factory(config_text="[journal]\nsegment_bytes = 262144\n")
    body = "x" * 900
    send(client(b), "/queue/bulk", [f"{i:04d}{body}" for i in range(600)])
    assert "index snapshot used: 600 messages" in restart_cycle(b)
    journal = b.data_dir / "journal"
    before = len(list(journal.glob("*.log")))
    c = client(b)
    c.send("SUBSCRIBE", {"destination": "/queue/bulk", "id": "s", "ack": "client"})
    frames = [c.recv() for _ in range(550)]
    c.send("ACK", {"id": frames[-1].headers["ack"], "receipt": "done"})  # cumulative: all 550
    while c.recv().command != "RECEIPT":
        pass
    c.close()
    assert before == 4  # three segments and the preallocated next one
    eventually(lambda: len(list(journal.glob("*.log"))) <= before - 2,
               "consumed segments reclaimed")
    assert "index snapshot used: 600 messages" in restart_cycle(b, kill=True)
    assert [m[:4] for m in stored(b.url, "/queue/bulk")] == [f"{i:04d}" for i in
                                                                range(550, 600)]


def test_a_backlog_of_packed_slot_blocks_survives_snapshots_kill_9_and_clean_stops(
        broker_factory) -> None:
    """30,000 paged-out messages fill several packed blocks of cursor slots; snapshots store
    those blocks as they are (the front one partly consumed) and a restart unpacks them.

    The order of events is fixed, not left to a periodic snapshot's timing: snapshots are
    written at clean stops only, so the kill -9 restart always loads a snapshot of the whole
    backlog (in-memory head as columns, then packed blocks) and replays a tail that acked the
    head and part of the first block. That is the case that once put a packed block after the
    block that followed it."""
    b = broker_factory(config_text="[journal]\nsnapshot_records = 100000000\n")
    c = client(b)
    n = 30_000
    for i in range(n):
        c.send("SEND", {"destination": "/queue/packed", "persistent": "true",
                        "receipt": str(i)}, f"m{i}".encode())
    receipts = [c.recv() for _ in range(n)]
    assert all(f.command == "RECEIPT" for f in receipts)
    c.close()
    cycle = restart_cycle(b)
    assert f"index snapshot written: {n} messages" in cycle
    assert f"index snapshot used: {n} messages" in cycle
    c = client(b)
    c.send("SUBSCRIBE", {"destination": "/queue/packed", "id": "s", "ack": "client",
                         "activemq.prefetchSize": "5000"})
    frames = [c.recv() for _ in range(5000)]
    assert [f.body.decode() for f in frames] == [f"m{i}" for i in range(5000)]
    c.send("ACK", {"id": frames[-1].headers["ack"], "receipt": "acked"})
    c.send("UNSUBSCRIBE", {"id": "s", "receipt": "gone"})
    while (f := c.recv()).command != "RECEIPT" or f.headers["receipt-id"] != "gone":
        pass
    c.close()
    cycle = restart_cycle(b, kill=True)
    assert f"index snapshot used: {n} messages" in cycle, "the tail after it holds the ACK"
    cycle = restart_cycle(b)
    assert "index snapshot written: 25000 messages" in cycle
    assert "index snapshot used: 25000 messages" in cycle
    # packed: 8 bytes of id and a few of packed fields a message, not 33 bytes of columns
    assert (b.data_dir / SNAPSHOT).stat().st_size < 25_000 * 16
    c = client(b)
    c.send("SUBSCRIBE", {"destination": "/queue/packed", "id": "d", "ack": "auto"})
    got = [c.recv().body.decode() for _ in range(n - 5000)]
    assert got == [f"m{i}" for i in range(5000, n)]
    c.send("UNSUBSCRIBE", {"id": "d", "receipt": "end"})
    assert c.recv().headers.get("receipt-id") == "end", "nothing more was queued"
