"""Range reads over a deep, paged-out backlog: what head queries, range reads and ledger
commits cost (docs/replay-protocol.md, sections 1-2).

Queues N persistent messages (no consumer, so nearly all are paged out to the journal), then
measures with the blocking client: head-query latency on the idle queue (what a Spark driver
polls), a head with splits, range-read throughput (a slice and the whole backlog), and
commit-upto of half the backlog; the broker's CPU time and RSS around each step. The whole
backlog is read one MESSAGE frame a message and then ``--repeat`` times as column batches
(what the Spark source reads): median msgs/s and the broker's CPU microseconds a message.

Usage: python bench/ranges.py [--count 1000000] [--size 100] [--polls 1000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "src"))
from sluicemq.client import Client
from sluicemq.protocol.codec import encode_frame
from sluicemq.protocol.frames import Frame

LISTEN = re.compile(r"listening on stomp://([\d.]+):(\d+)")


def broker_cpu(pid: int) -> float:
    """User + system CPU seconds of the broker process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def fill(c: Client, destination: str, count: int, size: int) -> None:
    """Pipelined persistent SENDs, one receipt per 2,000 (as bench/backlog.py)."""
    body = b"x" * size
    for start in range(0, count, 2000):
        n = min(2000, count - start)
        frames = [encode_frame(Frame("SEND", {"destination": destination, "persistent": "true"},
                                     body), "1.2") for _ in range(n - 1)]
        with c._write:
            c._sock.sendall(b"".join(frames))
        c.send(destination, body)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--polls", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=5, help="column-batch reads of the backlog")
    args = ap.parse_args()
    data = Path(tempfile.mkdtemp(prefix="sluice-ranges-"))
    proc = subprocess.Popen([sys.executable, "-m", "sluicemq", "broker", "--port", "0",
                             "--data-dir", str(data / "d"), "--console-port", "off",
                             "--ws-port", "off"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if m := LISTEN.search(line):
            url = f"stomp://{m.group(1)}:{m.group(2)}"
            break
    q = "/queue/bench"
    try:
        with Client(url, timeout=600) as c:
            t0 = time.perf_counter()
            fill(c, q, args.count, args.size)
            print(f"filled {args.count:,} x {args.size} B in {time.perf_counter() - t0:.1f}s, "
                  f"broker RSS {rss_mib(proc.pid):.0f} MiB")

            lat = []
            cpu0 = broker_cpu(proc.pid)
            for _ in range(args.polls):
                t = time.perf_counter()
                h = c.head(q)
                lat.append((time.perf_counter() - t) * 1000)
            cpu = (broker_cpu(proc.pid) - cpu0) / args.polls * 1000
            lat.sort()
            print(f"head (idle, {h.count:,} retained): p50 {statistics.median(lat):.2f} ms, "
                  f"p99 {lat[int(len(lat) * 0.99)]:.2f} ms, broker CPU {cpu:.3f} ms/query")

            t = time.perf_counter()
            h = c.head(q, splits=8)
            print(f"head with 8 splits: {(time.perf_counter() - t) * 1000:.1f} ms "
                  f"(first query after a change: no cache)")

            def read(start: int, end: int, batch_bytes: int | None = None) -> tuple[float, float]:
                cpu0, t = broker_cpu(proc.pid), time.perf_counter()
                n = nbytes = 0
                with c.read_range(q, start, end, batch_bytes=batch_bytes) as rng:
                    if batch_bytes is None:
                        for msg in rng:
                            n += 1
                            nbytes += len(msg.body)
                    else:
                        for cols in rng.batches():
                            n += cols.count
                            nbytes += cols.body_bytes
                dt = time.perf_counter() - t
                cpu = broker_cpu(proc.pid) - cpu0
                print(f"read {n:,} messages{' as column batches' if batch_bytes else ''} in "
                      f"{dt:.2f}s: {n / dt:,.0f} msgs/s, {nbytes / dt / 1e6:.1f} MB/s of bodies; "
                      f"broker CPU {cpu:.1f}s ({cpu / n * 1e6:.2f} us a message), "
                      f"RSS {rss_mib(proc.pid):.0f} MiB")
                return n / dt, cpu / n * 1e6

            mid = h.splits[len(h.splits) // 2]
            read(h.splits[0], h.splits[1])
            read(h.first, h.end)
            runs = [read(h.first, h.end, 4 << 20) for _ in range(args.repeat)]
            print(f"column batches (4 MiB), median of {args.repeat}: "
                  f"{statistics.median(r[0] for r in runs):,.0f} msgs/s, broker "
                  f"{statistics.median(r[1] for r in runs):.2f} us a message")

            t = time.perf_counter()
            done = c.commit_upto(q, mid, ledger="bench")
            dt = time.perf_counter() - t
            print(f"commit-upto removed {done.count:,} in {dt:.2f}s "
                  f"({done.count / dt:,.0f} msgs/s), durable; RSS {rss_mib(proc.pid):.0f} MiB")
            t = time.perf_counter()
            print(f"head after commit: {c.head(q).count:,} retained "
                  f"({(time.perf_counter() - t) * 1000:.1f} ms)")
    finally:
        proc.kill()
        proc.wait()
        subprocess.run(["rm", "-rf", str(data)], check=False)


if __name__ == "__main__":
    main()
