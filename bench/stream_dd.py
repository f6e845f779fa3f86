"""The 1 GiB stream without a consumer against `dd` + fdatasync, interleaved on one broker.

    .venv/bin/python bench/stream_dd.py --rounds 5         # after compare.py's warm-up
    .venv/bin/python bench/stream_dd.py --rounds 5 --no-warmup --sluice-arg=--ws-port=auto

Why interleaved: on this VM (free page reporting, NEWS 15:20) a page-cache page the guest has
not touched lately costs a host fault, so `dd` of the same GiB runs at 0.3-2.3 GB/s depending on
what ran just before it: right after another `dd` (whose freed pages are still backed by the
host) it is fast, after anything else slow. One `dd` measured before a broker's three runs
(compare.py's disk row) made the issue's "≥ 90 % of dd" ratio swing 0.56-0.94x for the same
broker. Here each round is `dd` (after the previous round's broker run: "cold"), `dd` again
("warm": the best this disk and page cache do), then the broker's run, back to back on the same
disk; the figures are the medians of each, and the medians of the rounds' ratios to each `dd`.
The broker's run is compare.py's `large-nc` (1,024 persistent 1 MiB SENDs, 8 in flight, one
producer; its MB/s excludes the drain that follows, which keeps the disk from filling up).
Appends every run and the summary to bench/results/stream-dd-<date>.jsonl.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import HERE, MIB, TMP, WARMUP, Result, dd_mb_per_s, record, start_sluice, stompload

STREAM = ["persist", "--size", str(MIB), "--producers", "1", "--window", "8", "--count", "1024"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="dd, dd, broker rounds (5)")
    parser.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                        help="compare.py's warm-up first (its 50k burst, 8x8, e2e)")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--sluice-arg", action="append", default=[],
                        help="extra argument for `sluicemq broker` (repeatable)")
    parser.add_argument("--label", default="", help="free text copied into the JSON")
    parser.add_argument("--out", type=Path,
                        default=HERE / "results" / f"stream-dd-{time.strftime('%Y-%m-%d')}.jsonl")
    opts = parser.parse_args(argv)
    run_id = time.strftime("%Y-%m-%dT%H:%M:%S")
    broker = start_sluice(opts.python, opts.sluice_arg)
    dd: dict[str, list[float]] = {"cold": [], "warm": []}
    ours: list[Result] = []
    try:
        if opts.warmup:
            for args in WARMUP:
                stompload(opts.python, broker, args, label="sluice:warmup", timeout=300)
        for n in range(opts.rounds):
            for side in ("cold", "warm"):
                dd[side].append(dd_mb_per_s(TMP / "sluice-bench" / "disk"))
                record(opts.out, {"broker": "disk", "name": f"dd-{side}", "round": n,
                                  "dd_mb_per_s": round(dd[side][-1], 1), "run": run_id,
                                  "time": time.strftime("%Y-%m-%dT%H:%M:%S")})
            result = stompload(opts.python, broker, [*STREAM, "--repeat", "1"],
                               label=f"sluice:large-nc:{opts.label}", timeout=300)
            if "mb_per_s" not in result:
                print(f"broker run failed: {result.get('errors')}", file=sys.stderr)
                return 1
            result.update(broker="sluice", name="large-nc", round=n, run=run_id)
            record(opts.out, result)
            ours.append(result)
    finally:
        broker.stop()
    rates = [r["mb_per_s"] for r in ours]
    summary: Result = {"broker": "sluice", "name": "stream-dd", "run": run_id,
                       "label": opts.label, "rounds": opts.rounds, "warmup": opts.warmup,
                       "sluice_mb_per_s": rates, "sluice_median": statistics.median(rates),
                       "rss_peak_mib": max(r.get("rss_peak_mib", 0) for r in ours),
                       "broker_cpu_us_per_msg": statistics.median(
                           r.get("broker_cpu_us_per_msg", 0) for r in ours)}
    for side, runs in dd.items():
        ratios = [r / d for r, d in zip(rates, runs, strict=True)]
        summary.update({f"dd_{side}_mb_per_s": [round(d, 1) for d in runs],
                        f"dd_{side}_median": round(statistics.median(runs), 1),
                        f"ratio_{side}_median": round(statistics.median(ratios), 3),
                        f"ratios_{side}": [round(x, 3) for x in ratios]})
    record(opts.out, summary)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
