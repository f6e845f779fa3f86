"""Scheduled delivery accuracy: N persistent messages with AMQ_SCHEDULED_DELAY, lateness of each.

Every message carries its due time (the client's clock before the SEND + its delay, spread
uniformly over [--min-delay, --max-delay] ms); a consumer subscribed from the start notes how
late each arrives. Prints p50/p99/max lateness, how many came early (must be 0) or never, and
the broker's peak RSS. The consumer runs in a process of its own: sharing the producer's
interpreter (and its GIL) it fell seconds behind an unpaced producer and measured itself.
Broker-agnostic over stomp.py: without --url it starts a SluiceMQ on a
throwaway data directory; for ActiveMQ 5.17, start it with ``schedulerSupport="true"`` on its
``<broker>`` element and pass --url and --pid.

    python bench/scheduled.py [--count 100000] [--min-delay 5000] [--max-delay 15000]
                              [--rate 2000] [--url stomp://127.0.0.1:61613 --pid PID
                              | --activemq] [--json out.jsonl]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import stomp

sys.path.insert(0, str(Path(__file__).parent))
from ranges import rss_mib
from streams import start_broker


class Lateness(stomp.ConnectionListener):
    def __init__(self, expected: int) -> None:
        self.late: list[int] = []
        self.expected = expected
        self.done = threading.Event()
        self.lock = threading.Lock()

    def on_message(self, frame: Any) -> None:
        now = int(time.time() * 1000)
        with self.lock:
            self.late.append(now - int(frame.headers["due-ms"]))
            if len(self.late) >= self.expected:
                self.done.set()


def consume(host: str, port: int, count: int, wait_s: float, ready: Any, out: Any) -> None:
    """The consumer process: subscribe, tell the parent, collect ``count`` latenesses."""
    listener = Lateness(count)
    consumer = stomp.Connection12([(host, port)], heartbeats=(0, 0))
    consumer.set_listener("l", listener)
    consumer.connect("admin", "admin", wait=True)
    subscribed = threading.Event()
    consumer.set_listener("r", type("R", (stomp.ConnectionListener,), {
        "on_receipt": lambda self, frame: subscribed.set()})())
    consumer.subscribe("/queue/bench.scheduled", id="1", ack="auto",
                       headers={"receipt": "sub"})
    subscribed.wait(30)
    ready.set()
    listener.done.wait(wait_s)
    with listener.lock:
        out.send(listener.late)
    consumer.disconnect()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--min-delay", type=int, default=5_000)
    ap.add_argument("--max-delay", type=int, default=15_000)
    ap.add_argument("--url", help="a running broker (default: start a SluiceMQ)")
    ap.add_argument("--activemq", action="store_true", help="start a private ActiveMQ 5.17 "
                    "(schedulerSupport on, bench/amq_compat.py) and measure it")
    ap.add_argument("--pid", type=int, help="its process id, for RSS")
    ap.add_argument("--rate", type=float, default=0, help="sends per second (0: as fast as "
                    "receipts allow); equal rates make brokers comparable")
    ap.add_argument("--label", default=None)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.activemq:
        from amq_compat import activemq
        with activemq() as (port, pid):
            run(args, f"stomp://127.0.0.1:{port}", pid, None)
        return
    proc = None
    if args.url is None:
        proc, url = start_broker(Path(tempfile.mkdtemp(prefix="sluice-sched-")) / "data")
        pid = proc.pid
    else:
        url, pid = args.url, args.pid
    run(args, url, pid, proc)


def run(args: argparse.Namespace, url: str, pid: int | None,
        proc: subprocess.Popen[str] | None) -> None:
    """One measurement against the broker at ``url`` (``proc``: ours to stop after)."""
    host, port = url.removeprefix("stomp://").rsplit(":", 1)
    try:
        ready = multiprocessing.Event()
        results, child_end = multiprocessing.Pipe(duplex=False)
        wait_s = args.count / 500 + args.max_delay / 1000 + 180
        child = multiprocessing.Process(target=consume, args=(
            host, int(port), args.count, wait_s, ready, child_end), daemon=True)
        child.start()
        assert ready.wait(60), "consumer did not subscribe"
        producer = stomp.Connection12([(host, int(port))], heartbeats=(0, 0))
        receipts = threading.Semaphore(0)
        producer.set_listener("r", type("R", (stomp.ConnectionListener,), {
            "on_receipt": lambda self, frame: receipts.release()})())
        producer.connect("admin", "admin", wait=True)
        rng = random.Random(1)
        peak = rss_mib(pid) if pid else 0.0
        started = time.time()
        for i in range(args.count):
            if args.rate:
                ahead = started + i / args.rate - time.time()
                if ahead > 0:
                    time.sleep(ahead)
            delay = rng.randint(args.min_delay, args.max_delay)
            due = int(time.time() * 1000) + delay
            receipt = f"r{i}" if i % 1000 == 999 or i == args.count - 1 else None
            headers = {"AMQ_SCHEDULED_DELAY": str(delay), "due-ms": str(due),
                       "persistent": "true"}
            if receipt:
                headers["receipt"] = receipt
            producer.send("/queue/bench.scheduled", b"x" * 100, headers=headers)
            if receipt:
                receipts.acquire(timeout=120)
                if pid:
                    peak = max(peak, rss_mib(pid))
        sent_s = time.time() - started
        deadline = time.time() + args.max_delay / 1000 + 120
        while not results.poll(0.5) and time.time() < deadline:
            if pid:
                peak = max(peak, rss_mib(pid))
        late = sorted(results.recv()) if results.poll(wait_s) else []
        child.join(30)
        result = {
            "date": time.strftime("%Y-%m-%d %H:%M"), "broker": args.label or (
                "sluice" if proc else "activemq" if args.activemq else url),
            "scenario": "scheduled-delivery",
            "messages": args.count, "delay_ms": [args.min_delay, args.max_delay],
            "rate": args.rate or None,
            "send_msgs_per_s": round(args.count / sent_s), "received": len(late),
            "early": sum(1 for x in late if x < 0),
            "late_p50_ms": statistics.median(late) if late else None,
            "late_p99_ms": late[int(len(late) * 0.99) - 1] if late else None,
            "late_max_ms": late[-1] if late else None, "rss_peak_mib": round(peak, 1)}
        print(json.dumps(result), flush=True)
        if args.json:
            with args.json.open("a") as fh:
                fh.write(json.dumps(result) + "\n")
        producer.disconnect()
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
