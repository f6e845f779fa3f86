"""Receipted persistent messages survive kill -9; a torn journal tail is cut, never fatal."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from stomp_helpers import connect, nothing_delivered, send_with_receipt


def _drain(broker, destination: str, expect: int) -> list[str]:
    c, lc = connect(broker)
    c.subscribe(destination, id="s", ack="auto")
    out = [lc.next(timeout=20).body for _ in range(expect)]
    assert nothing_delivered(c, lc), "more messages than were sent"
    c.disconnect()
    return out


def test_every_receipted_message_survives_kill_9_in_order(broker) -> None:
    p, lp = connect(broker)
    n = 500
    for i in range(n):
        send_with_receipt(p, lp, "/queue/crash", f"m{i}", f"r{i}", persistent="true")
    broker.kill()
    broker.restart()
    assert _drain(broker, "/queue/crash", n) == [f"m{i}" for i in range(n)]


def test_concurrent_producers_killed_mid_flight_lose_nothing_receipted(broker) -> None:
    receipted: dict[int, list[str]] = {i: [] for i in range(4)}
    stop = threading.Event()

    def produce(pid: int) -> None:
        conn, lst = connect(broker)
        i = 0
        try:
            while not stop.is_set():
                body = f"p{pid}-{i}"
                conn.send("/queue/race", body, receipt=body, headers={"persistent": "true"})
                lst.receipts.get(timeout=5)
                receipted[pid].append(body)
                i += 1
        except Exception:
            return  # the broker died under us: only receipted sends count

    threads = [threading.Thread(target=produce, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    while sum(len(v) for v in receipted.values()) < 400:
        threading.Event().wait(0.02)
    broker.kill()
    stop.set()
    for t in threads:
        t.join(10)
    broker.restart()
    total = sum(len(v) for v in receipted.values())
    c, lc = connect(broker)
    c.subscribe("/queue/race", id="s")
    got: list[str] = []
    while True:
        try:
            got.append(lc.next(timeout=2).body)
        except Exception:
            break
    missing = {b for v in receipted.values() for b in v} - set(got)
    assert not missing, f"{len(missing)} receipted messages lost of {total}"
    for pid in range(4):  # per producer, order is kept
        mine = [b for b in got if b.startswith(f"p{pid}-")]
        assert mine == sorted(mine, key=lambda s: int(s.split("-")[1]))


def test_acked_messages_stay_acked_after_kill(broker) -> None:
    p, lp = connect(broker)
    for i in range(10):
        send_with_receipt(p, lp, "/queue/acked", str(i), f"r{i}", persistent="true")
    c, lc = connect(broker)
    c.subscribe("/queue/acked", id="s", ack="client-individual")
    frames = [lc.next() for _ in range(10)]
    for f in frames[:6]:
        c.send("/queue/acked-unused", "x")  # interleave other traffic
        c.ack(f.headers["ack"], receipt=f"a{f.body}")
        assert lc.receipts.get(timeout=5) == f"a{f.body}"
    broker.kill()
    broker.restart()
    assert _drain(broker, "/queue/acked", 4) == ["6", "7", "8", "9"]


def test_non_persistent_messages_are_gone_after_restart(broker) -> None:
    p, lp = connect(broker)
    send_with_receipt(p, lp, "/queue/np", "volatile", "r1")
    send_with_receipt(p, lp, "/queue/np", "kept", "r2", persistent="true")
    broker.stop()
    broker.restart()
    assert _drain(broker, "/queue/np", 1) == ["kept"]


def test_clean_stop_and_restart_keeps_messages(broker) -> None:
    p, lp = connect(broker)
    for i in range(20):
        send_with_receipt(p, lp, "/queue/clean", str(i), f"r{i}", persistent="true")
    assert broker.stop() == 0
    broker.restart()
    assert _drain(broker, "/queue/clean", 20) == [str(i) for i in range(20)]


def _segments(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "journal").glob("*.log"))


def test_torn_tail_is_truncated_with_a_log_line(broker) -> None:
    p, lp = connect(broker)
    for i in range(50):
        send_with_receipt(p, lp, "/queue/torn", f"m{i}", f"r{i}", persistent="true")
    broker.kill()
    seg = [s for s in _segments(broker.data_dir) if s.read_bytes().strip(b"\x00")][-1]
    data = seg.read_bytes()
    end = len(data.rstrip(b"\x00"))
    with open(seg, "r+b") as fh:  # garbage where the next record would be, as a torn write
        fh.seek(end)
        fh.write(os.urandom(200))
        fh.seek(end - 10)  # and tear the last record in half
        fh.write(b"\x00" * 10)
    mark = broker.mark()
    broker.restart()
    assert "dropped" in broker.log(since=mark)
    got = _drain(broker, "/queue/torn", 49)
    assert got == [f"m{i}" for i in range(49)]
    p2, lp2 = connect(broker)
    send_with_receipt(p2, lp2, "/queue/torn", "new", "n", persistent="true")
    assert _drain(broker, "/queue/torn", 1) == ["new"]
