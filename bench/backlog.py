"""Bounded memory and restart time under a deep backlog: queue N persistent messages with no
consumer, then measure the broker's RSS, its restart after kill -9 and after a clean stop
(spawn to listening, recovery time from its log, RSS), persistent send throughput while the
backlog pages in, and the drain rate; optionally push M more messages through a producer and
a consumer ("history") and time the restart after that.

Usage: python bench/backlog.py [--count 1000000] [--size 1024] [--memory-limit "64 MiB"]
                               [--restarts crash,clean] [--history 0] [--snapshot-records N]
                               [--user-store-limit "1 TiB"] [--json out.jsonl]

It starts its own broker (`python -m sluicemq broker`) on a throwaway data directory, so the
numbers are for this machine's disk and CPUs, with the journal fsyncing as in production.
While the backlog is enqueued a probe connection sends a non-persistent SEND with a receipt
every 20 ms: its worst round trip shows event-loop stalls (index snapshots are captured on the
loop; the broker also logs each capture's loop time).
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
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from stompload import Consumer, Producer, read_rss, split
from stompwire import StompConnection

MIB = 1 << 20
LISTEN = re.compile(r"listening on stomp://([\d.]+):(\d+)")
RECOVERED = re.compile(r"recovered (\d+) messages.* from (\d+) records in ([\d.]+)s")
SNAPSHOT_USED = re.compile(r"index snapshot used: (\d+) messages")
CAPTURE = re.compile(r"index snapshot written: (\d+) messages, (\d+) bytes.*capture ([\d.]+) ms "
                     r"on the loop, written in ([\d.]+)s")


class Broker:
    """A broker subprocess on a data directory that survives restarts; its log is kept."""

    def __init__(self, data_dir: Path, config: Path) -> None:
        self.data_dir = data_dir
        self.config = config
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0
        self.lines: list[str] = []

    def start(self) -> dict[str, Any]:
        """Start and wait until it listens; returns spawn-to-listening seconds and what its
        recovery log line says."""
        started = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sluicemq", "broker", "--host", "127.0.0.1",
             "--port", str(self.port), "--data-dir", str(self.data_dir), "--config",
             str(self.config), "--console-port", "0", "--ws-port", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        mark = len(self.lines)
        listening = threading.Event()
        threading.Thread(target=self._pump, args=(self.proc, listening), daemon=True).start()
        while not listening.wait(0.01):
            if self.proc.poll() is not None:
                raise RuntimeError("broker did not start:\n" + "".join(self.lines[mark:]))
        out: dict[str, Any] = {"listening_s": round(time.perf_counter() - started, 2)}
        for line in self.lines[mark:]:
            if m := RECOVERED.search(line):
                out["recovered"] = int(m.group(1))
                out["records_replayed"] = int(m.group(2))
                out["recovery_s"] = float(m.group(3))
            out["from_snapshot"] = out.get("from_snapshot", False) or bool(
                SNAPSHOT_USED.search(line))
        out["rss_mib"] = self.rss_mib()
        return out

    def _pump(self, proc: subprocess.Popen[str], listening: threading.Event) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.append(line)
            if m := LISTEN.search(line):
                self.port = int(m.group(2))
                listening.set()

    def stop(self) -> None:
        assert self.proc is not None
        self.proc.terminate()
        self.proc.wait(120)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(60)

    def rss_mib(self) -> float:
        assert self.proc is not None
        return round(read_rss(self.proc.pid)[0] / MIB, 1)

    def snapshots(self) -> list[tuple[int, int, float, float]]:
        """(messages, bytes, loop ms, write s) of every periodic snapshot logged so far."""
        return [(int(m.group(1)), int(m.group(2)), float(m.group(3)), float(m.group(4)))
                for line in self.lines if (m := CAPTURE.search(line))]


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


async def drain(port: int, dest: bytes, count: int, ack: str = "client-individual",
                idle_timeout: float = 60.0) -> float:
    conn = await connect(port)
    consumer = Consumer(conn, dest, count, ack=ack, prefetch=1000)
    started = time.perf_counter()
    await consumer.subscribe()
    await consumer.wait(idle_timeout)
    elapsed = time.perf_counter() - started
    await conn.close()
    return count / elapsed


async def probe(port: int, stop: asyncio.Event, every: float = 0.02) -> dict[str, float]:
    """BEGIN, then ABORT with a receipt, until ``stop``: the worst round trip is about the
    longest the broker's loop did not answer (plus one group commit: a receipt waits for what
    was appended before it). Transactions are not subject to flow control; SENDs would be."""
    conn = await connect(port)
    samples: list[float] = []
    while not stop.is_set():
        started = time.perf_counter()
        conn.write(b"BEGIN\ntransaction:p\n\n\x00")
        await conn.request(b"ABORT", [(b"transaction", b"p")])
        samples.append((time.perf_counter() - started) * 1000)
        await asyncio.sleep(every)
    await conn.close()
    samples.sort()
    return {"probe_p99_ms": round(samples[int(len(samples) * 0.99)], 1),
            "probe_max_ms": round(samples[-1], 1)} if samples else {}


async def restart(broker: Broker, how: str) -> dict[str, Any]:
    (broker.kill if how == "crash" else broker.stop)()
    return broker.start()


async def run(opts: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"count": opts.count, "size": opts.size,
                           "memory_limit": opts.memory_limit, "history": opts.history,
                           "snapshot_records": opts.snapshot_records,
                           "user_store_limit": opts.user_store_limit}
    work = Path(tempfile.mkdtemp(prefix="sluice-backlog-", dir=opts.work_dir))
    config = work / "broker.toml"
    text = f'[limits]\nmemory_limit = "{opts.memory_limit}"\n'
    if opts.user_store_limit:  # the per-user share kept (anonymous: every message counted)
        text += f'user_store_limit = "{opts.user_store_limit}"\n'
    if opts.snapshot_records is not None:
        text += f"[journal]\nsnapshot_records = {opts.snapshot_records}\n"
    config.write_text(text)
    broker = Broker(work / "data", config)
    broker.start()
    body = os.urandom(opts.size)
    out["rss_empty_mib"] = broker.rss_mib()
    backlog = b"/queue/backlog"
    if opts.count:
        stop = asyncio.Event()
        prober = asyncio.create_task(probe(broker.port, stop))
        out["enqueue_msgs_per_s"] = round(await produce(broker.port, backlog, opts.count, body,
                                                        opts.producers, opts.window))
        stop.set()
        out.update(await prober)
        out["rss_backlog_mib"] = broker.rss_mib()
        assert broker.proc is not None
        out["rss_peak_while_enqueuing_mib"] = round(read_rss(broker.proc.pid)[1] / MIB, 1)
        snaps = broker.snapshots()
        if snaps:
            out["snapshots_while_enqueuing"] = len(snaps)
            out["snapshot_max_loop_ms"] = max(s[2] for s in snaps)
            out["snapshot_last"] = {"messages": snaps[-1][0], "bytes": snaps[-1][1],
                                    "loop_ms": snaps[-1][2], "write_s": snaps[-1][3]}
        for how in opts.restarts:
            out[f"restart_{how}"] = await restart(broker, how)
        # Persistent producers on another queue while the backlog pages in to a consumer.
        side = b"/queue/side"
        side_count = min(opts.count, 100_000)
        drain_task = asyncio.create_task(drain(broker.port, backlog, opts.count))
        out["send_during_drain_msgs_per_s"] = round(await produce(
            broker.port, side, side_count, body, opts.producers, opts.window))
        out["drain_msgs_per_s"] = round(await drain_task)
        out["rss_after_drain_mib"] = broker.rss_mib()
        await drain(broker.port, side, side_count, ack="auto")
    if opts.history:
        churn = b"/queue/churn"
        consumer_task = asyncio.create_task(drain(broker.port, churn, opts.history, ack="auto",
                                                  idle_timeout=300.0))
        started = time.perf_counter()
        await produce(broker.port, churn, opts.history, body, opts.producers, opts.window)
        await consumer_task
        out["history_msgs_per_s"] = round(opts.history / (time.perf_counter() - started))
        out["rss_after_history_mib"] = broker.rss_mib()
    time.sleep(1.5)  # let the last acks' segment deletions land
    out["segments_at_end"] = len(list((work / "data" / "journal").glob("*.log")))
    for how in opts.restarts:
        out[f"restart_{how}_at_end"] = await restart(broker, how)
    broker.stop()
    if opts.log:
        opts.log.write_text("".join(broker.lines))
    subprocess.run(["rm", "-rf", str(work)], check=False)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1_000_000, help="backlog messages")
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--window", type=int, default=8, help="unreceipted SENDs per producer")
    parser.add_argument("--memory-limit", default="64 MiB")
    parser.add_argument("--restarts", default="crash,clean",
                        help="restarts to time, in order: crash (kill -9) and/or clean")
    parser.add_argument("--history", "--churn", type=int, default=0,
                        help="messages produced and consumed after the drain (restart after)")
    parser.add_argument("--snapshot-records", type=int, default=None,
                        help="[journal] snapshot_records for the broker (0: no periodic ones)")
    parser.add_argument("--user-store-limit", default="",
                        help='[limits] user_store_limit, e.g. "1 TiB" (default: none)')
    parser.add_argument("--work-dir", default=None, help="where the data directory goes")
    parser.add_argument("--json", type=Path, help="append the result as one JSON line")
    parser.add_argument("--log", type=Path, help="write the broker's log (all runs) here")
    opts = parser.parse_args()
    opts.restarts = [r for r in opts.restarts.split(",") if r]
    try:
        import uvloop

        result = uvloop.run(run(opts))
    except ImportError:
        result = asyncio.run(run(opts))
    for key, value in result.items():
        print(f"{key:30} {value}")
    if opts.json:
        with opts.json.open("a") as fh:
            fh.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
