"""Large streams across a failover: `send_file` through a failover URL keeps going when the
master is killed mid-file, re-sending only its unconfirmed window (not from chunk 0), and the
file arrives whole (SHA-256 checked). `receive_file` does the same: it resumes from the chunks
the new master redelivers, and an acknowledgement of a chunk delivered before the failover is
void (the new master would read its ack id as one of its own deliveries)."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

from ha_helpers import failover_url
from sluicemq import Client

SIZE = 24 << 20
CHUNK = 256 << 10


def sha(path: Path) -> bytes:
    return hashlib.sha256(path.read_bytes()).digest()


def kill_after(broker, threshold: int):
    """A progress callback that kills the broker once ``threshold`` bytes went by."""
    killed = threading.Event()

    def progress(done: int, total: int | None) -> None:
        if done >= threshold and not killed.is_set():
            killed.set()
            broker.kill()

    return progress, killed


def test_send_file_continues_on_the_new_master(cluster, tmp_path: Path) -> None:
    master = cluster.master()
    standby = cluster.standby()
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(SIZE))
    progress, killed = kill_after(master, SIZE // 3)
    resent = []
    with Client(failover_url(master, standby), timeout=60,
                on_failover=lambda e: resent.append(e.resent)) as c:
        c.send_file("/queue/files", src, chunk_size=CHUNK, progress=progress)
    assert killed.is_set()
    assert resent and resent[0] < SIZE // CHUNK // 3  # only the unconfirmed window, not all
    out = tmp_path / "in"
    out.mkdir()
    with Client(standby.url, timeout=60) as c:
        got = c.receive_file("/queue/files", out, timeout=60)
    assert sha(got) == sha(src)


def test_receive_file_continues_on_the_new_master(cluster, tmp_path: Path) -> None:
    master = cluster.master()
    standby = cluster.standby()
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(SIZE))
    with Client(master.url, timeout=60) as c:
        c.send_file("/queue/files", src, chunk_size=CHUNK)
    kill, killed = kill_after(master, SIZE // 3)
    seen: list[int] = []

    def progress(done: int, total: int | None) -> None:
        seen.append(done)
        kill(done, total)

    out = tmp_path / "in"
    out.mkdir()
    with Client(failover_url(master, standby), timeout=60) as c:
        got = c.receive_file("/queue/files", out, timeout=60, progress=progress)
    assert killed.is_set()
    assert sha(got) == sha(src)
    assert seen == sorted(seen)  # it went on from where it was, never back to chunk 0
