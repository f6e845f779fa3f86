"""Advisory overhead: the 8 producers x 8 in flight persistent scenario with advisories on and
a listener on ``/topic/ActiveMQ.Advisory.>``, on with no listener, and off.

Each round starts a fresh SluiceMQ per variant (variants interleaved, so drift in the shared
machine's speed hits each alike) and runs ``bench/stompload.py persist`` against it; prints
the median enqueue/drain rates per variant, their ratio to "off", and how many advisories
the listener received.

    python bench/advisories.py [--count 100000] [--rounds 3] [--json out.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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
from streams import start_broker

HERE = Path(__file__).parent
VARIANTS = {"on + listener": "", "on, nobody listens": "", "off": "[advisories]\nenabled = false\n"}


class Counter(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.n = 0
        self.lock = threading.Lock()

    def on_message(self, frame: Any) -> None:
        with self.lock:
            self.n += 1


def one(variant: str, count: int) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="sluice-adv-"))
    config = base / "broker.toml"
    config.write_text(VARIANTS[variant])
    proc, url = start_broker(base / "data", ["--config", str(config)])
    port = int(url.rsplit(":", 1)[1])
    listener = None
    counter = Counter()
    try:
        if variant == "on + listener":
            listener = stomp.Connection12([("127.0.0.1", port)], heartbeats=(0, 0))
            listener.set_listener("c", counter)
            listener.connect(wait=True)
            listener.subscribe("/topic/ActiveMQ.Advisory.>", id="adv")
        out = subprocess.run(
            [sys.executable, str(HERE / "stompload.py"), "persist", "--port", str(port),
             "--producers", "8", "--window", "8", "--count", str(count),
             "--broker-pid", str(proc.pid), "--label", variant],
            capture_output=True, text=True, timeout=900, check=True)
        result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        time.sleep(0.5)  # (the last advisories are on their way; a count, not a figure)
        result["advisories_received"] = counter.n
        return result
    finally:
        if listener is not None:
            listener.disconnect()
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(base, ignore_errors=True)


def rate(result: dict[str, Any], *keys: str) -> float:
    for key in keys:
        if key in result:
            return float(result[key])
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for _ in range(args.rounds):
        for variant in VARIANTS:
            runs[variant].append(one(variant, args.count))
    summary = {}
    for variant, results in runs.items():
        summary[variant] = {
            "enqueue_msgs_per_s": statistics.median(
                rate(r, "enqueue_msgs_per_s", "msgs_per_s") for r in results),
            "drain_msgs_per_s": statistics.median(
                rate(r, "drain_msgs_per_s") for r in results),
            "advisories_received": max(r["advisories_received"] for r in results)}
    load_after = os.getloadavg()
    off = summary["off"]
    for variant, s in summary.items():
        s["enqueue_vs_off"] = round(s["enqueue_msgs_per_s"] / off["enqueue_msgs_per_s"], 3)
        print(f"{variant:<20} enqueue {s['enqueue_msgs_per_s']:>9,.0f}/s "
              f"({s['enqueue_vs_off']:.3f}x off)  drain {s['drain_msgs_per_s']:>9,.0f}/s  "
              f"advisories {s['advisories_received']}")
    print(f"load average (1 min) {load_before[0]:.2f} before, {load_after[0]:.2f} after")
    line = {"date": time.strftime("%Y-%m-%d %H:%M"), "scenario": "advisory-overhead-8x8",
            "count": args.count, "rounds": args.rounds, "summary": summary,
            "load_before": load_before, "load_after": load_after, "runs": runs}
    print(json.dumps({k: v for k, v in line.items() if k != "runs"}))
    if args.json:
        with args.json.open("a") as fh:
            fh.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
