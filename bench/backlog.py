"""Bounded memory under a deep backlog: queue N persistent messages with no consumer, then
measure the broker's RSS, its restart (recovery) time, persistent send throughput while the
backlog pages in, and the drain rate; optionally churn M messages through and time recovery.

Usage: python bench/backlog.py [--count 1000000] [--size 1024] [--memory-limit "64 MiB"]
                               [--churn 0] [--json out.jsonl]

It starts its own broker (`python -m sluicemq broker`) on a throwaway data directory, so the
numbers are for this machine's disk and CPUs, with the journal fsyncing as in production.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from stompload import Consumer, Producer, read_rss, split
from stompwire import StompConnection

MIB = 1 << 20
LISTEN = re.compile(r"listening on stomp://([\d.]+):(\d+)")
RECOVERED = re.compile(r"recovered (\d+) messages.* in ([\d.]+)s")


class Broker:
    """A broker subprocess on a data directory that survives restarts."""

    def __init__(self, data_dir: Path, config: Path) -> None:
        self.data_dir = data_dir
        self.config = config
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0
        self.recovery_s = 0.0
        self.recovered = 0

    def start(self) -> float:
        """Start and wait until it listens; returns seconds from spawn to listening."""
        started = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sluicemq", "broker", "--host", "127.0.0.1",
             "--port", str(self.port), "--data-dir", str(self.data_dir), "--config",
             str(self.config), "--console-port", "0", "--ws-port", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if m := RECOVERED.search(line):
                self.recovered, self.recovery_s = int(m.group(1)), float(m.group(2))
            if m := LISTEN.search(line):
                self.port = int(m.group(2))
                break
        else:
            raise RuntimeError("broker did not start")
        return time.perf_counter() - started

    def stop(self) -> None:
        assert self.proc is not None
        self.proc.terminate()
        self.proc.wait(60)

    def rss_mib(self) -> float:
        assert self.proc is not None
        return round(read_rss(self.proc.pid)[0] / MIB, 1)


async def connect(port: int) -> StompConnection:
    return await StompConnection.open("127.0.0.1", port)


async def produce(port: int, dest: bytes, count: int, body: bytes, producers: int,
                  window: int) -> float:
    """Persistent sends with receipts, `window` in flight per producer; returns msgs/s."""
    conns = [await connect(port) for _ in range(producers)]
    workers = [Producer(c, dest, n, body, window=window, persistent=True)
               for c, n in zip(conns, split(count, producers), strict=True)]
    started = time.perf_counter()
    await asyncio.gather(*(w.run() for w in workers))
    elapsed = time.perf_counter() - started
    await asyncio.gather(*(c.close() for c in conns))
    return count / elapsed


async def drain(port: int, dest: bytes, count: int, ack: str = "client-individual") -> float:
    conn = await connect(port)
    consumer = Consumer(conn, dest, count, ack=ack, prefetch=1000)
    started = time.perf_counter()
    await consumer.subscribe()
    await consumer.wait(60.0)
    elapsed = time.perf_counter() - started
    await conn.close()
    return count / elapsed


async def run(opts: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"count": opts.count, "size": opts.size,
                           "memory_limit": opts.memory_limit}
    work = Path(tempfile.mkdtemp(prefix="sluice-backlog-"))
    config = work / "broker.toml"
    config.write_text(f'[limits]\nmemory_limit = "{opts.memory_limit}"\n')
    broker = Broker(work / "data", config)
    broker.start()
    body = os.urandom(opts.size)
    out["rss_empty_mib"] = broker.rss_mib()
    backlog = b"/queue/backlog"
    out["enqueue_msgs_per_s"] = round(await produce(broker.port, backlog, opts.count, body,
                                                    opts.producers, opts.window))
    out["rss_backlog_mib"] = broker.rss_mib()
    broker.stop()
    out["restart_s"] = round(broker.start(), 2)
    out["recovery_s"] = broker.recovery_s
    out["recovered"] = broker.recovered
    out["rss_after_recovery_mib"] = broker.rss_mib()
    # Persistent producers on another queue while the backlog pages in to a consumer.
    side = b"/queue/side"
    side_count = min(opts.count, 100_000)
    drain_task = asyncio.create_task(drain(broker.port, backlog, opts.count))
    out["send_during_drain_msgs_per_s"] = round(await produce(
        broker.port, side, side_count, body, opts.producers, opts.window))
    out["drain_msgs_per_s"] = round(await drain_task)
    out["rss_after_drain_mib"] = broker.rss_mib()
    await drain(broker.port, side, side_count, ack="auto")
    if opts.churn:
        churn = b"/queue/churn"
        consumer_task = asyncio.create_task(drain(broker.port, churn, opts.churn, ack="auto"))
        out["churn_msgs_per_s"] = round(await produce(broker.port, churn, opts.churn, body,
                                                      opts.producers, opts.window))
        await consumer_task
    time.sleep(1.5)  # let the last acks' segment deletions land
    segments = len(list((work / "data" / "journal").glob("*.log")))
    out["segments_after_drain"] = segments
    broker.stop()
    out["restart_after_drain_s"] = round(broker.start(), 2)
    out["recovery_after_drain_s"] = broker.recovery_s
    broker.stop()
    subprocess.run(["rm", "-rf", str(work)], check=False)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--window", type=int, default=8, help="unreceipted SENDs per producer")
    parser.add_argument("--memory-limit", default="64 MiB")
    parser.add_argument("--churn", type=int, default=0,
                        help="messages produced and consumed after the drain (recovery after)")
    parser.add_argument("--json", type=Path, help="append the result as one JSON line")
    opts = parser.parse_args()
    try:
        import uvloop

        result = uvloop.run(run(opts))
    except ImportError:
        result = asyncio.run(run(opts))
    for key, value in result.items():
        print(f"{key:28} {value}")
    if opts.json:
        with opts.json.open("a") as fh:
            fh.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
