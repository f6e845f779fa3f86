"""Topic fan-out throughput: one publisher, one topic, N subscribers that keep up.

    .venv/bin/python bench/fanout.py [--subs 10] [--count 20000] [--size 1024] [--repeat 3]

Starts a broker, opens ``--subs`` subscribers of ``/topic/fan`` (one connection each, auto
ack, reading as fast as they can), then one publisher pipelines ``--count`` non-persistent
messages of ``--size`` bytes to it. Prints messages/s (first SEND until every subscriber has
every message), deliveries/s and the broker's CPU per delivery (user + sys of its process over
the run), medians of ``--repeat`` runs, with the load average. Why: a topic SEND is counted
against its publisher's share of the loop turn with the deliveries it makes (``Turns.fan_out``,
issue #16); this is what that costs a publisher whose subscribers all keep up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sluicemq.protocol.codec import encode_frame
from sluicemq.protocol.frames import Frame
from streams import start_broker
from wildcards import drain, open_conn


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run(port: int, pid: int, subs: int, count: int, size: int) -> tuple[float, float]:
    """One run: (messages/s, broker CPU seconds a delivery)."""
    conns = [await open_conn(port) for _ in range(subs)]
    for i, (r, w) in enumerate(conns):
        w.write(encode_frame(Frame("SUBSCRIBE", {"destination": "/topic/fan", "id": str(i),
                                                 "receipt": "ready"})))
        await w.drain()
        await r.readuntil(b"\0")  # the receipt: the subscription is live
    want, done = [count * subs], asyncio.Event()
    readers = [asyncio.create_task(drain(r, want, done)) for r, _w in conns]
    _pr, pw = await open_conn(port)
    body = b"f" * size
    cpu, started = cpu_seconds(pid), time.perf_counter()
    frame = encode_frame(Frame("SEND", {"destination": "/topic/fan"}, body))
    for first in range(0, count, 500):
        pw.write(frame * min(500, count - first))
        await pw.drain()
    await asyncio.wait_for(done.wait(), 300)
    elapsed, cpu = time.perf_counter() - started, cpu_seconds(pid) - cpu
    for t in readers:
        t.cancel()
    for _r, w in conns:
        w.close()
    pw.close()
    return count / elapsed, cpu / (count * subs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--subs", type=int, default=10)
    ap.add_argument("--count", type=int, default=20_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--label", default="", help="a name for this run in the JSON line")
    ap.add_argument("--json", type=Path, help="append the result as one JSON line")
    opts = ap.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_broker(Path(tmp) / "data", ["--console-port", "off",
                                                      "--ws-port", "off"])
        port = int(url.rsplit(":", 1)[1])
        try:
            runs = [asyncio.run(run(port, proc.pid, opts.subs, opts.count, opts.size))
                    for _ in range(opts.repeat)]
        finally:
            proc.terminate()
            proc.wait(30)
    load_after = os.getloadavg()
    rate = sorted(r for r, _ in runs)[len(runs) // 2]
    cpu = sorted(c for _, c in runs)[len(runs) // 2]
    print(f"{opts.subs} subscribers, {opts.count} x {opts.size} B: {rate:,.0f} msgs/s, "
          f"{rate * opts.subs:,.0f} deliveries/s, broker CPU {cpu * 1e6:.1f} us a delivery "
          f"(medians of {opts.repeat}); load {load_before[0]:.2f} -> {load_after[0]:.2f}; "
          f"runs {[round(r) for r, _ in runs]}")
    if opts.json:
        line = {"date": time.strftime("%Y-%m-%d %H:%M"), "bench": "fanout", "label": opts.label,
                "subs": opts.subs, "count": opts.count, "size": opts.size,
                "median_msgs_per_s": round(rate), "median_cpu_us_per_delivery": round(cpu * 1e6, 2),
                "runs": [round(r) for r, _ in runs], "load_before": load_before,
                "load_after": load_after}
        with opts.json.open("a") as fh:
            fh.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
