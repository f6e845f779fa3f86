"""`sluice send` and `sluice receive` through a failover URL, run as real subprocesses, keep
going when the master is killed -9 mid-file: the file arrives whole (SHA-256), only the
unconfirmed window is sent again (or only the unacknowledged chunks delivered again), and the
command says on stderr that it failed over and to where."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

from ha_helpers import failover_url
from sluice_testing import BrokerProcess, eventually
from sluicemq import Client

SLUICE = [sys.executable, "-m", "sluicemq"]
SIZE = 32 << 20
CHUNK = 256 << 10
CHUNKS = SIZE // CHUNK
FAILED_OVER = re.compile(r"failed over from (\S+) to (\S+) in [\d.]+s \(\d+ attempts, "
                         r"(\d+) sends re-sent")


def destination(broker: BrokerProcess, name: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.console_port}/api/destinations",
                                timeout=10) as resp:
        found = [d for d in json.loads(resp.read())["destinations"] if d["name"] == name]
    return found[0] if found else {"depth": 0, "dequeued": 0}


def wait_until(check, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """Poll ``check`` (a broker's own count) until true; the command must still be running."""

    def progressed() -> bool:
        assert proc.poll() is None, "the command finished before the master was killed"
        return bool(check())

    eventually(progressed, "the transfer made no progress", timeout)


def finish(proc: subprocess.Popen) -> tuple[str, str]:
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    return out, err


def test_sluice_send_continues_on_the_new_master(cluster, tmp_path: Path) -> None:
    master = cluster.master()
    standby = cluster.standby()
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(SIZE))
    proc = subprocess.Popen([*SLUICE, "send", str(src), "--url", failover_url(master, standby),
                             "--to", "files", "--chunk-size", str(CHUNK), "--limit-rate",
                             "8MiB", "-q"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        wait_until(lambda: destination(master, "files")["depth"] >= CHUNKS // 4, proc)
        master.kill()
        out, err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    moved = FAILED_OVER.search(err)
    assert moved and (moved[1], moved[2]) == (master.url, standby.url), err
    assert int(moved[3]) <= 8  # the window (--window 8), not the file from chunk 0
    assert f"sent {src} ({SIZE} bytes" in out
    with Client(standby.url, timeout=60) as c:
        got = c.receive_file("/queue/files", tmp_path / "in", timeout=60)
    assert hashlib.sha256(got.read_bytes()).digest() == hashlib.sha256(src.read_bytes()).digest()


def test_sluice_receive_continues_on_the_new_master(cluster, tmp_path: Path) -> None:
    master = cluster.master()
    standby = cluster.standby()
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(SIZE))
    with Client(master.url, timeout=60) as c:
        c.send_file("/queue/files", src, chunk_size=CHUNK)
    out_dir = tmp_path / "out"
    proc = subprocess.Popen([*SLUICE, "receive", "--url", failover_url(master, standby),
                             "--from", "files", "--dir", str(out_dir), "--count", "1",
                             "--timeout", "60", "--limit-rate", "8MiB", "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: destination(master, "files")["dequeued"] >= CHUNKS // 4, proc)
        master.kill()
        out, err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    moved = FAILED_OVER.search(err)
    assert moved and (moved[1], moved[2]) == (master.url, standby.url), err
    got = Path(out.strip())
    assert got.parent == out_dir
    assert hashlib.sha256(got.read_bytes()).digest() == hashlib.sha256(src.read_bytes()).digest()
    # The new master handed out only what the old one had not seen acknowledged.
    assert 0 < destination(standby, "files")["dequeued"] <= CHUNKS - CHUNKS // 4 + 8


def test_sluice_receive_count_stops_at_n_across_a_failover(cluster, tmp_path: Path) -> None:
    """`sluice receive --count 2`, the master killed while it reads the second file: it asks
    the new master for the one stream it has not read, writes exactly two files, and the
    third stream goes to the next receiver untouched (not one chunk delivered before)."""
    master = cluster.master()
    standby = cluster.standby()
    blobs = [os.urandom(SIZE // 4 + i) for i in range(3)]  # 33 chunks: ~1 s each at 8 MiB/s
    per_file = len(blobs[0]) // CHUNK + 1
    with Client(master.url, timeout=60) as c:
        for i, blob in enumerate(blobs):
            with c.stream_writer("/queue/files", name=f"b{i}", chunk_size=CHUNK) as w:
                w.write(blob)
    out_dir = tmp_path / "out"
    proc = subprocess.Popen([*SLUICE, "receive", "--url", failover_url(master, standby),
                             "--from", "files", "--dir", str(out_dir), "--count", "2",
                             "--timeout", "60", "--limit-rate", "8MiB", "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: destination(master, "files")["dequeued"] >= per_file + 4, proc)
        master.kill()
        out, err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert FAILED_OVER.search(err), err
    assert [Path(p).read_bytes() for p in out.split()] == blobs[:2]
    streams = {s["name"]: s["delivered_bytes"] for s in standby.api("streams")["streams"]}
    assert streams.get("b2", 0) == 0
    with Client(standby.url, timeout=60) as c:
        got = c.receive_file("/queue/files", tmp_path / "next", timeout=60)
    assert got.read_bytes() == blobs[2]
