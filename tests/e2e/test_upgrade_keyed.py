"""Spec: a data directory written before keyed record checksums (b8e78da) starts on this one,
whole, is keyed from its next segment on, and loses nothing receipted under kill -9 after.

``fixtures/datadir-8d52b76`` was written by 8d52b76 with segment reuse on and then killed -9
(``HOW_WRITTEN.md``): unkeyed spares holding records of their earlier use, and live segments
that are reused files with their earlier contents after their last record. The kill -9 loop
below makes this broker take those old spares as its first keyed segments, so it also says that
no record of a file's earlier use comes back from one.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

from sluice_testing import RawStomp
from sluicemq.storage.headerkey import open_key
from sluicemq.storage.recycle import spare_name
from sluicemq.storage.segment import KEYED, parse_segment_name

FIXTURE = Path(__file__).parent / "fixtures" / "datadir-8d52b76"
CONFIG = "[journal]\nsegment_bytes = 16384\npreallocate = false\nrecycle_bytes = 65536\n"
STREAM = bytes(range(256)) * 96


def on_fixture(broker_factory: Any) -> Any:
    b = broker_factory(config_text=CONFIG)
    b.stop()
    shutil.rmtree(b.data_dir)
    shutil.copytree(FIXTURE / "journal", b.data_dir / "journal")
    b.restart()
    return b


def client(b: Any) -> RawStomp:
    c = RawStomp(b.host, b.port, timeout=30)
    c.connect()
    return c


def drain(b: Any, dest: str) -> list[Any]:
    """Every message left in ``dest``, in order: a marker sent after them ends the read."""
    consumer, producer = client(b), client(b)
    consumer.send("SUBSCRIBE", {"destination": dest, "id": "1", "ack": "auto",
                                "receipt": "sub"})
    assert consumer.recv().headers.get("receipt-id") == "sub"
    producer.send("SEND", {"destination": dest, "persistent": "true", "n": "end",
                           "receipt": "end"}, b"")
    assert producer.recv().command == "RECEIPT"
    got = []
    while (frame := consumer.recv(timeout=30)).headers.get("n") != "end":
        got.append(frame)
    consumer.close()
    producer.close()
    return got


def send_until_killed(b: Any, cycle: int, receipts: int) -> list[str]:
    """Receipted persistent SENDs, 8 in flight, until the broker is killed -9 right after the
    ``receipts``-th RECEIPT: the ids receipted."""
    producer = client(b)
    receipted: list[str] = []
    sent = 0
    while len(receipted) < receipts:
        while sent - len(receipted) < 8:
            n = f"{cycle}-{sent:04d}"
            producer.send("SEND", {"destination": "/queue/upgrade.after", "persistent": "true",
                                   "n": n, "receipt": n}, n.encode().ljust(2048, b"a"))
            sent += 1
        frame = producer.recv(timeout=30)
        assert frame.command == "RECEIPT", frame
        receipted.append(frame.headers["receipt-id"])
    b.kill()
    producer.close()
    return receipted


def keyed_heads(journal: Path) -> dict[int, bool]:
    return {n: bool(path.read_bytes()[3] & KEYED) for path in journal.iterdir()
            if (n := parse_segment_name(path.name)) is not None}


def test_a_data_dir_from_before_keys_starts_whole_and_is_keyed_from_its_next_segment(
        broker_factory) -> None:
    b = on_fixture(broker_factory)
    journal = b.data_dir / "journal"
    keep = drain(b, "/queue/upgrade.keep")
    assert [f.headers["n"] for f in keep] == [str(i) for i in range(30)]
    assert [f.body for f in keep] == [f"keep-{i:02d} ".encode() + b"k" * 200 for i in range(30)]
    chunks = drain(b, "/queue/upgrade.stream")
    assert [f.headers["sluice-stream-seq"] for f in chunks] == [str(i) for i in range(6)]
    assert b"".join(f.body for f in chunks) == STREAM
    assert chunks[-1].headers["sluice-stream-sha256"] == hashlib.sha256(STREAM).hexdigest()
    assert drain(b, "/queue/upgrade.churn") == []  # consumed before the kill: stays consumed
    key = open_key(journal)
    assert key is not None and key.first == 13  # after every file it had (live 12, spares 3, 4)
    b.stop()
    assert all(k == (n >= 13) for n, k in keyed_heads(journal).items())


def test_a_kill_9_loop_on_an_upgraded_data_dir_loses_nothing_receipted(broker_factory) -> None:
    b = on_fixture(broker_factory)
    journal = b.data_dir / "journal"
    key = open_key(journal)
    assert key is not None
    b.kill()  # right after the upgrade's first start: its key stays the journal's key
    b.restart()
    again = open_key(journal)
    assert again is not None and (again.first, again.seeds(13)) == (key.first, key.seeds(13))
    for cycle, receipts in enumerate((20, 45, 70)):  # ~12 segments of 16 KiB a cycle
        receipted = send_until_killed(b, cycle, receipts)
        b.restart()
        back = [f.headers["n"] for f in drain(b, "/queue/upgrade.after")]
        assert set(receipted) <= set(back), sorted(set(receipted) - set(back))
        assert back == sorted(back) and len(set(back)) == len(back)  # in order, once each
        assert all(n.startswith(f"{cycle}-") for n in back)  # none from an earlier use
    # the old spares became keyed segments (oldest first) and nothing of theirs came back
    assert not (journal / spare_name(3)).exists() and not (journal / spare_name(4)).exists()
    assert drain(b, "/queue/upgrade.churn") == []
    keep = drain(b, "/queue/upgrade.keep")
    assert [f.headers["n"] for f in keep] == [str(i) for i in range(30)]
    b.stop()
    heads = keyed_heads(journal)
    assert max(heads) > 13 and all(k == (n >= 13) for n, k in heads.items())
