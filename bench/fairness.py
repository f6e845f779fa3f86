"""Fairness: what other users get while one client streams GiBs or eight producers flood.

    .venv/bin/python bench/fairness.py                       # SluiceMQ, every load
    .venv/bin/python bench/fairness.py --brokers activemq,sluice --loads quiet,large,flood

For each load a fresh broker is started (compare.py's start functions; the peers only through
/work/shared/bench/brokers/*.sh), warmed up with compare.py's warm-up, and four probes run
beside the load, each a process of its own with our blocking client (``sluicemq.client``):

  receipt   a persistent 1 KiB SEND with a receipt every 20 ms: SEND -> RECEIPT
  e2e       a persistent 1 KiB SEND (no receipt) every 20 ms from one connection to a
            subscriber on another: SEND -> MESSAGE
  connect   a new connection every 100 ms: TCP connect + CONNECT -> CONNECTED
  metrics   GET /metrics of the console every 250 ms (SluiceMQ only)

The loads (stompload.py, as compare.py's scenarios): ``quiet`` (nothing for --quiet-seconds,
the baseline), ``large`` (--stream-mib, 4 GiB, as 1 MiB persistent chunks, 8 in flight, a
live client-individual consumer: compare.py's 1 GiB run lasts under a second), ``large-nc``
(the same without a consumer), ``flood`` (8 producers x 8 in flight of persistent 1 KiB with
receipts, no consumer). A probe's samples
count for a load when they started between the load's start and end; the figures are p50,
p99 and max in ms and their ratio to the same broker's quiet run. Every probe row goes to
bench/results/hostile-<date>.jsonl (``--out``). ``--rounds N`` repeats the loads N times
(each a fresh broker), the order reversed every other round; the summary takes medians over
the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import (
    HERE,
    WARMUP,
    Broker,
    record,
    start_activemq,
    start_sluice,
    stompload,
)
from stompload import MIB, percentile

Result = dict[str, Any]
PROBES = {"receipt": 0.020, "e2e": 0.020, "connect": 0.100, "metrics": 0.250}
BODY = b"f" * 1024
FLOOD = {"sluice": 240_000, "activemq": 30_000}  # ~6-10 s of each broker's 8 x 8 rate
LOADS: dict[str, list[str]] = {
    "large": ["large", "--chunk-mib", "1", "--window", "8", "--ack", "client-individual"],
    "large-nc": ["persist", "--size", str(MIB), "--producers", "1", "--window", "8",
                 "--no-drain"],
    "flood": ["persist", "--producers", "8", "--window", "8", "--no-drain"],
}


# ---------------------------------------------------------------- the probes (child processes)


def run_probe(kind: str, port: int, console: str) -> None:
    """Take samples until stdin closes; then print them as one JSON line."""
    from sluicemq.client import Client

    samples: list[tuple[float, float]] = []
    errors: list[str] = []
    stop = threading.Event()

    def until_eof() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=until_eof, daemon=True).start()
    url = f"stomp://127.0.0.1:{port}"
    every = PROBES[kind]

    def timed(step: Any) -> None:
        started, t0 = time.time(), time.perf_counter()
        try:
            step()
        except Exception as exc:  # a failed probe is a sample too: 10 s, and its reason
            errors.append(f"{type(exc).__name__}: {exc}"[:200])
            samples.append((started, 10.0))
            return
        samples.append((started, time.perf_counter() - t0))

    if kind == "receipt":
        with Client(url, heartbeat=(0, 0)) as client:
            while not stop.wait(every):
                timed(lambda: client.send("/queue/fair.receipt", BODY))
    elif kind == "e2e":
        with Client(url, heartbeat=(0, 0)) as sender, Client(url, heartbeat=(0, 0)) as taker:
            sub = taker.subscribe("/queue/fair.e2e")

            def one() -> None:
                sender.send("/queue/fair.e2e", BODY, receipt=False)
                if sub.get(timeout=10) is None:
                    raise TimeoutError("no MESSAGE in 10 s")

            while not stop.wait(every):
                timed(one)
    elif kind == "connect":
        def connect() -> None:
            client = Client(url, heartbeat=(0, 0), timeout=10)
            threading.Thread(target=client.disconnect, daemon=True).start()  # not timed

        while not stop.wait(every):
            timed(connect)
    elif kind == "metrics":
        def scrape() -> None:
            with urllib.request.urlopen(f"{console}/metrics", timeout=10) as resp:
                resp.read()

        while not stop.wait(every):
            timed(scrape)
    print(json.dumps({"samples": samples, "errors": errors[:5], "failed": len(errors)}))


class Probes:
    """The probe processes of one load: started, then stopped and read."""

    def __init__(self, python: str, broker: Broker, console: str) -> None:
        kinds = [k for k in PROBES if k != "metrics" or console]
        self.procs = {k: subprocess.Popen(
            [python, __file__, "--probe", k, "--port", str(broker.port), "--console", console],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for k in kinds}

    def stop(self) -> dict[str, Result]:
        out: dict[str, Result] = {}
        for kind, proc in self.procs.items():
            try:
                stdout, _ = proc.communicate("", timeout=60)
                out[kind] = json.loads(stdout.strip().splitlines()[-1])
            except (subprocess.TimeoutExpired, IndexError, json.JSONDecodeError) as exc:
                proc.kill()
                proc.wait(10)
                out[kind] = {"samples": [], "errors": [repr(exc)], "failed": 1}
        return out


def summary(samples: list[tuple[float, float]], start: float, end: float) -> Result:
    during = sorted(int(lat * 1e9) for t, lat in samples if start <= t <= end)
    if not during:
        return {"n": 0}
    return {"n": len(during), "p50_ms": round(percentile(during, 50) / 1e6, 3),
            "p99_ms": round(percentile(during, 99) / 1e6, 3),
            "max_ms": round(during[-1] / 1e6, 3)}


# ---------------------------------------------------------------- one load on a fresh broker


def start(name: str, opts: argparse.Namespace) -> tuple[Broker, str]:
    if name == "activemq":
        return start_activemq(), ""
    broker = start_sluice(opts.python, ["--console-port", "auto", "--ws-port", "auto",
                                        *opts.sluice_arg])
    console = next((ln.split("console on ")[1].strip() for ln in broker.log
                    if "console on " in ln), "")
    return broker, console


def one_load(name: str, load: str, round_: int, opts: argparse.Namespace) -> list[Result]:
    broker, console = start(name, opts)
    try:
        for args in WARMUP:
            stompload(opts.python, broker, args, label=f"{name}:warmup", timeout=300)
        probes = Probes(opts.python, broker, console)
        time.sleep(1.0)  # the probes connect and subscribe before the window opens
        began = time.time()
        run: Result = {}
        if load == "quiet":
            time.sleep(opts.quiet_seconds)
        else:
            mib = 64 if opts.quick else opts.stream_mib  # --quick: a smoke test
            args = [*LOADS[load], *{
                "large": ["--total-mib", str(mib)], "large-nc": ["--count", str(mib)],
                "flood": ["--count", str(5000 if opts.quick else
                                         opts.flood_count or FLOOD[name])]}[load]]
            run = stompload(opts.python, broker, args, label=f"{name}:fair:{load}",
                            timeout=opts.timeout)
        ended = time.time()
        found = probes.stop()
    finally:
        broker.stop()
    rows = []
    load_figures = {k: run.get(k) for k in ("mb_per_s", "msgs_per_s", "rss_peak_mib",
                                            "receipt_p50_ms", "receipt_p99_ms", "errors")
                    if run.get(k) is not None}
    for kind, got in found.items():
        row: Result = {"broker": name, "name": f"fairness-{load}", "probe": kind,
                       "round": round_, "load": load_figures, "seconds": round(ended - began, 2),
                       "failed": got.get("failed", 0), "probe_errors": got.get("errors", []),
                       "label": opts.label, "run": opts.run_id,
                       "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                       **summary(got["samples"], began, ended)}
        record(opts.out, row)
        rows.append(row)
        figures = "  ".join(f"{f} {row.get(f + '_ms', float('nan')):8.2f}"
                            for f in ("p50", "p99", "max"))
        print(f"{name:8} {load:8} r{round_} {kind:8} n={row['n']:4} {figures} ms  "
              f"failed {row['failed']}  load {load_figures}", file=sys.stderr, flush=True)
    return rows


def table(rows: list[Result]) -> str:
    """Medians over rounds per (broker, load, probe), with ratios to that broker's quiet."""
    groups: dict[tuple[str, str, str], list[Result]] = {}
    for r in rows:
        groups.setdefault((r["broker"], r["name"].removeprefix("fairness-"), r["probe"]),
                          []).append(r)

    def med(key: tuple[str, str, str], fig: str) -> float | None:
        values = [r[fig] for r in groups.get(key, []) if fig in r]
        return statistics.median(values) if values else None

    lines = ["| broker | load | probe | p50 ms | p99 ms | max ms | p50 / quiet | p99 / quiet |",
             "|---|---|---|---|---|---|---|---|"]
    for (broker, load, probe) in groups:
        p50, p99, top = (med((broker, load, probe), f) for f in ("p50_ms", "p99_ms", "max_ms"))
        q50, q99 = (med((broker, "quiet", probe), f) for f in ("p50_ms", "p99_ms"))
        ratio = [f"{a / b:.2f}x" if a is not None and b else "-"
                 for a, b in ((p50, q50), (p99, q99))]
        lines.append(f"| {broker} | {load} | {probe} | {p50} | {p99} | {top} | "
                     f"{ratio[0]} | {ratio[1]} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--brokers", default="sluice", help="activemq, sluice (comma-separated)")
    parser.add_argument("--loads", default="quiet,large,large-nc,flood")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--quiet-seconds", type=float, default=6.0)
    parser.add_argument("--stream-mib", type=int, default=4096,
                        help="MiB of each stream (default 4 GiB: enough probe samples)")
    parser.add_argument("--flood-count", type=int, default=0,
                        help="messages of the flood (default: per broker, ~6-10 s)")
    parser.add_argument("--quick", action="store_true", help="small loads: a smoke test")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--sluice-arg", action="append", default=[])
    parser.add_argument("--label", default="")
    parser.add_argument("--out", type=Path,
                        default=HERE / "results" / f"hostile-{time.strftime('%Y-%m-%d')}.jsonl")
    parser.add_argument("--probe", choices=list(PROBES), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--console", default="", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.probe:
        run_probe(opts.probe, opts.port, opts.console)
        return 0
    opts.run_id = time.strftime("%Y-%m-%dT%H:%M:%S")
    brokers = [b for b in opts.brokers.split(",") if b]
    loads = [x for x in opts.loads.split(",") if x]
    rows: list[Result] = []
    for round_ in range(opts.rounds):
        for name in brokers if round_ % 2 == 0 else brokers[::-1]:
            for load in loads if round_ % 2 == 0 else loads[::-1]:
                if name == "activemq" and load == "large-nc":
                    continue  # it runs out of heap (OutOfMemoryError: README, Benchmarks)
                rows += one_load(name, load, round_, opts)
    print(table(rows))
    os.sync()
    return 0


if __name__ == "__main__":
    sys.exit(main())
