"""Shared-storage failover: takeover time and the lost/duplicated ledger over many takeovers.

Two `sluice broker` processes share one throwaway data directory (a master and a standby on
fixed loopback ports). Measured:

* takeover: kill -9 of the master -> first RECEIPT from the new master, seen by a client with a
  `failover:(...)` URL that sends one persistent message at a time; with an empty store and with
  `--backlog` messages queued (broken down into lock taken / listening / first receipt);
* loop: `--takeovers` kill -9s under load (`--producers` failover clients pipelining persistent
  sends, one consumer acking client-individual with receipts); after each takeover the killed
  broker restarts as the new standby. At the end the queue is drained and every receipted
  message is checked against what was consumed: lost and duplicated counts. Producer throughput
  during the loop is compared with the same load without kills.

Usage: python bench/failover.py [--backlog 200000] [--takeovers 10] [--producers 4]
                                [--lock-retry 0.5] [--json out.jsonl]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from sluicemq import Client, ClientError
from sluicemq.client.failover import FailoverEvent
from stompload import Producer, split
from stompwire import StompConnection

LISTEN = re.compile(r"listening on stomp://")
TAKEN = re.compile(r"lock taken after")
STANDBY = re.compile(r"sluice: standby:")
RECOVERED = re.compile(r"recovered (\d+) messages.* in ([\d.]+)s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Node:
    """One broker process on the shared data directory, on a fixed port; its log with times."""

    def __init__(self, data_dir: Path, lock_retry: float) -> None:
        self.data_dir = data_dir
        self.lock_retry = lock_retry
        self.port = free_port()
        self.proc: subprocess.Popen[str] | None = None
        self.lines: list[tuple[float, str]] = []
        self._cond = threading.Condition()

    @property
    def url(self) -> str:
        return f"stomp://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.lines = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sluicemq", "broker", "--host", "127.0.0.1",
             "--port", str(self.port), "--data-dir", str(self.data_dir), "--console-port", "off",
             "--ws-port", "off", "--lock-retry", str(self.lock_retry)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1"))
        threading.Thread(target=self._pump, args=(self.proc,), daemon=True).start()

    def _pump(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with self._cond:
                self.lines.append((time.perf_counter(), line))
                self._cond.notify_all()

    def wait(self, pattern: re.Pattern[str], timeout: float = 600.0) -> float:
        """Wait for a log line; returns when it was read."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for at, line in self.lines:
                    if pattern.search(line):
                        return at
                if self.proc is not None and self.proc.poll() is not None:
                    raise RuntimeError("broker exited:\n" + "".join(text for _, text in self.lines))
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no line like {pattern.pattern!r}")
                self._cond.wait(0.1)  # woken by each new line; re-checks the process too

    def found(self, pattern: re.Pattern[str]) -> re.Match[str] | None:
        with self._cond:
            return next((m for _, line in self.lines if (m := pattern.search(line))), None)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()


def failover_url(nodes: list[Node]) -> str:
    inner = ",".join(n.url for n in nodes)
    return f"failover:({inner})?randomize=false&initialReconnectDelay=10&maxReconnectDelay=100"


async def fill(port: int, dest: bytes, count: int, body: bytes) -> float:
    """Queue ``count`` persistent messages (8 producers x 8 in flight); returns msgs/s."""
    conns = [await StompConnection.open("127.0.0.1", port) for _ in range(8)]
    workers = [Producer(c, dest, n, body, window=8, persistent=True)
               for c, n in zip(conns, split(count, 8), strict=True)]
    started = time.perf_counter()
    await asyncio.gather(*(w.run() for w in workers))
    elapsed = time.perf_counter() - started
    await asyncio.gather(*(c.close() for c in conns))
    return count / elapsed


def takeover(base: Path, backlog: int, lock_retry: float) -> dict[str, Any]:
    """One kill -9 of the master; times from the kill to lock, listening and first receipt."""
    data = Path(tempfile.mkdtemp(prefix="takeover-", dir=base))
    master, standby = Node(data, lock_retry), Node(data, lock_retry)
    master.start()
    master.wait(LISTEN)
    fill_rate = asyncio.run(fill(master.port, b"/queue/backlog", backlog, b"x" * 1024)) \
        if backlog else None
    standby.start()
    standby.wait(STANDBY)
    receipts: list[tuple[float, str]] = []
    stop = threading.Event()
    started = threading.Event()

    def probe() -> None:
        with Client(failover_url([master, standby]), timeout=120) as c:
            while not stop.is_set():
                c.send("/queue/probe", b"p")
                receipts.append((time.perf_counter(), c.address))
                started.set()

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    started.wait(30)
    # The standby retries on a fixed grid that started when it printed its standby line; a
    # random phase makes the lock wait typical (uniform in [0, lock_retry)) instead of fixed.
    time.sleep(random.uniform(0, lock_retry))
    killed = time.perf_counter()
    master.kill()
    taken = standby.wait(TAKEN)
    listening = standby.wait(LISTEN)
    while not any(at > killed and addr == standby.url for at, addr in receipts):
        if not thread.is_alive():
            raise RuntimeError("probe client died")
        time.sleep(0.01)  # a benchmark may poll its own ledger
    first = min(at for at, addr in receipts if at > killed and addr == standby.url)
    stop.set()
    thread.join(30)
    recovered = standby.found(RECOVERED)
    standby.stop()
    return {"scenario": "takeover", "backlog": backlog, "lock_retry": lock_retry,
            "fill_msgs_s": round(fill_rate) if fill_rate else None,
            "lock_taken_s": round(taken - killed, 3),
            "listening_s": round(listening - killed, 3),
            "first_receipt_s": round(first - killed, 3),
            "recovered": int(recovered.group(1)) if recovered else None,
            "recovery_s": float(recovered.group(2)) if recovered else None}


class Load:
    """Failover producers (pipelined, receipted) and one client-individual consumer; the
    ledger of what was receipted and what was consumed (ACK receipted)."""

    def __init__(self, url: str, producers: int, window: int) -> None:
        self.url = url
        self.producers = producers
        self.window = window
        self.receipted: list[str] = []
        self.consumed: Counter[str] = Counter()
        self.uncertain: set[str] = set()  # ACK written, connection lost before its receipt
        self.events: list[FailoverEvent] = []
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._produce, args=(n,), daemon=True)
                         for n in range(producers)]
        self._threads.append(threading.Thread(target=self._consume, daemon=True))

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def finish(self) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(120)

    def _produce(self, n: int) -> None:
        try:
            with Client(self.url, timeout=120, on_failover=self.events.append) as c:
                window: list[tuple[str, Any]] = []
                i = 0
                while not self.stop.is_set() or window:
                    if not self.stop.is_set():
                        body = f"p{n}-{i}"
                        i += 1
                        window.append((body, c.send_async("/queue/load", body)))
                    if len(window) >= self.window or self.stop.is_set():
                        body, receipt = window.pop(0)
                        receipt.result()
                        with self._lock:
                            self.receipted.append(body)
        except BaseException as exc:
            self.errors.append(exc)

    def _consume(self) -> None:
        try:
            with Client(self.url, timeout=120) as c, \
                    c.subscribe("/queue/load", ack="client-individual", prefetch=100) as sub:
                while not self.stop.is_set():
                    msg = sub.get(timeout=0.2)
                    if msg is None:
                        continue
                    try:
                        msg.ack(receipt=True)
                    except ClientError as exc:
                        if "lost before the broker confirmed" in str(exc):
                            self.uncertain.add(msg.text())
                        continue
                    self.consumed[msg.text()] += 1
        except BaseException as exc:
            self.errors.append(exc)

    def drain(self, url: str) -> None:
        with Client(url, timeout=120) as c:
            rest = c.head("/queue/load").count
            with c.subscribe("/queue/load", ack="client-individual", prefetch=1000) as sub:
                for _ in range(rest):
                    msg = sub.get(timeout=60)
                    if msg is None:
                        break
                    self.consumed[msg.text()] += 1
                    msg.ack()
            c.head("/queue/load")  # a round trip: every ACK above was processed


def loop(base: Path, takeovers: int, producers: int, window: int, lock_retry: float,
         settle: float) -> dict[str, Any]:
    """``takeovers`` kill -9s under load; the killed broker comes back as the next standby."""
    data = Path(tempfile.mkdtemp(prefix="loop-", dir=base))
    nodes = [Node(data, lock_retry), Node(data, lock_retry)]
    nodes[0].start()
    nodes[0].wait(LISTEN)
    nodes[1].start()
    nodes[1].wait(STANDBY)
    load = Load(failover_url(nodes), producers, window)
    load.start()
    started = time.perf_counter()
    master, standby = nodes
    times = []
    for _ in range(takeovers):
        target = len(load.receipted) + int(settle * 1000)
        while len(load.receipted) < target and not load.errors:
            time.sleep(0.01)  # a benchmark may poll its own ledger
        killed = time.perf_counter()
        master.kill()
        times.append(standby.wait(LISTEN) - killed)
        master.start()
        master.wait(STANDBY)
        master, standby = standby, master
    load.finish()
    elapsed = time.perf_counter() - started
    load.drain(master.url)
    for n in nodes:
        n.stop()
    lost = set(load.receipted) - set(load.consumed) - load.uncertain
    duplicated = sum(n - 1 for n in load.consumed.values() if n > 1)
    return {"scenario": "loop", "takeovers": takeovers, "producers": producers,
            "window": window, "receipted": len(load.receipted),
            "consumed": sum(load.consumed.values()), "uncertain_acks": len(load.uncertain),
            "lost": len(lost), "duplicated": duplicated, "errors": [repr(e) for e in load.errors],
            "resent": sum(e.resent for e in load.events),
            "producer_msgs_s": round(len(load.receipted) / elapsed),
            "takeover_listening_s_median": round(sorted(times)[len(times) // 2], 3)
            if times else None,
            "takeover_listening_s_max": round(max(times), 3) if times else None}


def baseline(base: Path, producers: int, window: int, seconds: float) -> dict[str, Any]:
    """The same load without kills, for the throughput comparison."""
    data = Path(tempfile.mkdtemp(prefix="base-", dir=base))
    node = Node(data, 0.5)
    node.start()
    node.wait(LISTEN)
    load = Load(failover_url([node]), producers, window)
    load.start()
    started = time.perf_counter()
    time.sleep(seconds)  # the measurement interval itself
    load.finish()
    elapsed = time.perf_counter() - started
    node.stop()
    return {"scenario": "baseline", "producers": producers, "window": window,
            "producer_msgs_s": round(len(load.receipted) / elapsed)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backlog", type=int, default=200_000)
    parser.add_argument("--takeovers", type=int, default=10)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--window", type=int, default=8)
    parser.add_argument("--settle", type=float, default=2.0,
                        help="thousands of receipts between two kills")
    parser.add_argument("--lock-retry", type=float, default=0.5)
    parser.add_argument("--skip", default="", help="comma list: takeover,backlog,loop,baseline")
    parser.add_argument("--json", type=Path, default=None)
    opts = parser.parse_args(argv)
    skip = set(filter(None, opts.skip.split(",")))
    base = Path(tempfile.mkdtemp(prefix="sluice-failover-"))
    results = []
    if "takeover" not in skip:
        results.append(takeover(base, 0, opts.lock_retry))
    if "backlog" not in skip and opts.backlog:
        results.append(takeover(base, opts.backlog, opts.lock_retry))
    if "loop" not in skip:
        results.append(loop(base, opts.takeovers, opts.producers, opts.window,
                            opts.lock_retry, opts.settle))
    if "baseline" not in skip:
        results.append(baseline(base, opts.producers, opts.window, 10.0))
    for r in results:
        print(json.dumps(r), flush=True)
        if opts.json is not None:
            with opts.json.open("a") as fh:
                fh.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
