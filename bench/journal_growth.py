"""Journal on disk against what is unconsumed, under a Spark-like pipeline (issue #16).

Run: ``.venv/bin/python bench/journal_growth.py [--seconds 300] [--backlog 500000]
[--kept 200000] [--segment-mib 64]``

Goal (issue #16): in steady state the journal holds at most 2 x the unconsumed bytes + 2
segments. A Spark evaluation run once left 6.6 GB of journal for ~1.1 GB unconsumed. This
replays the shape of such a run with the real client, one process each:

* producer: persistent 1 KiB messages to ``/queue/raw``, 256 in flight, as fast as it goes;
  every ``--kept-every``-th one also to ``/queue/kept``, a queue nobody reads (what batch
  reads leave behind), until it holds ``--kept`` messages: long-lived messages scattered
  over the whole journal;
* pipeline (a streaming query): head of ``/queue/raw``, a column-batch range read of what is
  new, the batches staged as one part of a sink batch, published, then ``commit_upto`` with a
  ledger - records read, staged, published and removed as Spark's source and sink do;
* downstream (a job that is behind): keeps ``--backlog`` messages unconsumed in
  ``/queue/out`` and commits the rest, oldest first.

Every 2 s it notes the journal's bytes on disk (its segment files) and the unconsumed bytes
(messages waiting in the three queues x their record size); it prints the series and the
ratio in steady state (the backlog and the kept queue full).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sluicemq.client import Client
from sluicemq.protocol import columns

BODY = 1024
RECORD = BODY + 120  # a stored message: body, id, key, headers JSON, record header


def producer(url: str, stop: mp.synchronize.Event, kept: int, kept_every: int) -> None:
    body = os.urandom(BODY // 2).hex().encode()
    sent_kept = 0
    with Client(url, timeout=60) as c:
        window = []
        n = 0
        while not stop.is_set():
            window.append(c.send_async("/queue/raw", body))
            n += 1
            if sent_kept < kept and n % kept_every == 0:
                window.append(c.send_async("/queue/kept", body))
                sent_kept += 1
            if len(window) >= 256:
                for r in window:
                    r.result(60)
                window.clear()
        for r in window:
            r.result(60)


def pipeline(url: str, stop: mp.synchronize.Event) -> None:
    batch = 0
    with Client(url, timeout=60) as c:
        while not stop.is_set():
            h = c.head("/queue/raw", ledger="etl")
            if not h.count:
                time.sleep(0.05)
                continue
            upto = min(h.next, h.first + 20_000)
            with c.stage("etl-sink", batch, "p0") as part, c.read_range(
                    "/queue/raw", h.first, upto, ledger="etl", batch_bytes=1 << 20) as rows:
                for frame in rows:
                    body = bytes(frame.body)
                    part.send_batch("/queue/out", body, columns.decode(body).count)
            c.publish_stage("etl-sink", batch, ["p0"])
            c.commit_upto("/queue/raw", upto, ledger="etl")
            batch += 1


def downstream(url: str, stop: mp.synchronize.Event, backlog: int) -> None:
    with Client(url, timeout=60) as c:
        while not stop.is_set():
            h = c.head("/queue/out")
            if h.count > backlog:
                cut = c.head("/queue/out", h.first, max_messages=h.count - backlog)
                c.commit_upto("/queue/out", cut.end, ledger="downstream")
            else:
                time.sleep(0.2)


def start_broker(tmp: Path, config: Path) -> tuple[subprocess.Popen[bytes], str, Path]:
    """The broker, its log in ``tmp/broker.log`` (compactions are counted from it)."""
    log = tmp / "broker.log"
    proc = subprocess.Popen([sys.executable, "-m", "sluicemq", "broker", "--port", "0",
                             "--data-dir", str(tmp / "data"), "--config", str(config),
                             "--console-port", "off", "--ws-port", "off", "--log-level", "info"],
                            stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if m := re.search(r"listening on (stomp://\S+) ", log.read_text()):
            return proc, m.group(1), log
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("broker did not start:\n" + log.read_text())


def journal_bytes(data_dir: Path) -> int:
    return sum(p.stat().st_size for p in (data_dir / "journal").glob("*.log"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--backlog", type=int, default=500_000, help="messages left in /queue/out")
    ap.add_argument("--kept", type=int, default=200_000, help="messages nobody reads")
    ap.add_argument("--kept-every", type=int, default=10)
    ap.add_argument("--segment-mib", type=int, default=64)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    segment = args.segment_mib << 20
    keep_log = os.environ.get("JOURNAL_GROWTH_LOG")
    with tempfile.TemporaryDirectory(dir=os.environ.get("SLUICE_BENCH_DIR")) as tmp:
        data = Path(tmp) / "data"
        config = Path(tmp) / "broker.toml"
        config.write_text(f"[journal]\nsegment_bytes = {segment}\n")
        proc, url, log = start_broker(Path(tmp), config)
        stop = mp.Event()
        workers = [mp.Process(target=producer, args=(url, stop, args.kept, args.kept_every)),
                   mp.Process(target=pipeline, args=(url, stop)),
                   mp.Process(target=downstream, args=(url, stop, args.backlog))]
        for w in workers:
            w.start()
        rows = []
        started = time.monotonic()
        try:
            with Client(url, timeout=60) as c:
                while time.monotonic() - started < args.seconds:
                    time.sleep(2)
                    depth = {q: c.head(f"/queue/{q}").count for q in ("raw", "out", "kept")}
                    unconsumed = sum(depth.values()) * RECORD
                    disk = journal_bytes(data)
                    rows.append({"t": round(time.monotonic() - started, 1), **depth,
                                 "unconsumed_mb": round(unconsumed / 1e6, 1),
                                 "journal_mb": round(disk / 1e6, 1),
                                 "goal_mb": round((2 * unconsumed + 2 * segment) / 1e6, 1)})
                    print(json.dumps(rows[-1]), flush=True)
        finally:
            stop.set()
            for w in workers:
                w.join(120)
            proc.terminate()
            proc.wait(60)
            compactions = log.read_text().count("compacting journal segment")
            if keep_log:
                Path(keep_log).write_text(log.read_text())
    steady = [r for r in rows if r["out"] >= args.backlog * 0.95 and r["kept"] >= args.kept]
    over = [r for r in steady if r["journal_mb"] > r["goal_mb"]]
    ratios = [r["journal_mb"] / r["unconsumed_mb"] for r in steady if r["unconsumed_mb"]]
    summary = {"segment_mib": args.segment_mib, "samples": len(rows), "steady": len(steady),
               "compactions": compactions,
               "over_goal": len(over),
               "journal_mb_max": max((r["journal_mb"] for r in steady), default=None),
               "unconsumed_mb_median": statistics.median(r["unconsumed_mb"] for r in steady)
               if steady else None,
               "ratio_median": round(statistics.median(ratios), 2) if ratios else None,
               "ratio_max": round(max(ratios), 2) if ratios else None}
    print(json.dumps(summary))
    if args.json:
        with args.json.open("a") as f:
            f.write(json.dumps({"bench": "journal_growth", **vars(args), "json": None,
                                **summary, "rows": rows}, default=str) + "\n")
    sys.exit(0)


if __name__ == "__main__":
    main()
