"""The no-consumer 1 GiB stream for two or more source trees, one broker at a time, all on ONE
data directory.

    .venv/bin/python bench/stream_ab.py --side main=/tmp/me/main/src --side new=src
    .venv/bin/python bench/stream_ab.py --rounds 4 --runs 2 --side A=... --side B=...

Why not brokers side by side: started together, each on a data directory of its own (the
session 19-20 harness), a broker kept its speed for the whole hold. Three copies of one tree
measured that way, 6 rounds (2026-11-26 20:58, session 21): the second and third 1.20x and
1.18x the first, every round; 4 AIO slots were credited with 1.12x that way, and measured
0.97x here. Where a broker's segment files lie (on this VM's virtual disk), or which broker
started first, decides as much as the build. The same identical trees here: 1.03x.

Here every side in turn starts a broker on the same data directory (the segment files, kept
as spares, are the next broker's), warms it up as compare.py does, runs compare.py's
``large-nc`` (1,024 persistent 1 MiB SENDs, 8 in flight, one producer, then the drain)
``--runs`` times and stops it; the order of the sides is reversed every other round, and `dd`
+ fdatasync runs twice (cold, warm) before each round. The very first run writes the fresh
directory's new files and is slow, whichever side has it.
Each side is a source tree put on PYTHONPATH (``--side NAME=PATH``, the first is the base).
Prints the medians per side and each side's run-by-run ratio to the base's run in the same
place; appends every run and the summary to bench/results/stream-ab-<date>.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import HERE, MIB, TMP, WARMUP, Result, dd_mb_per_s, record, start_sluice, stompload

STREAM = ["persist", "--size", str(MIB), "--producers", "1", "--window", "8", "--count", "1024",
          "--repeat", "1"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--side", action="append", required=True, metavar="NAME=PATH",
                        help="a source tree (its src directory) to put on PYTHONPATH")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of every side (4)")
    parser.add_argument("--runs", type=int, default=2, help="large-nc runs a broker (2)")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--label", default="", help="free text copied into the JSON")
    parser.add_argument("--out", type=Path,
                        default=HERE / "results" / f"stream-ab-{time.strftime('%Y-%m-%d')}.jsonl")
    opts = parser.parse_args(argv)
    sides = dict(side.split("=", 1) for side in opts.side)
    names = list(sides)
    data = TMP / "sluice-bench" / "stream-ab"
    shutil.rmtree(data, ignore_errors=True)
    run_id = time.strftime("%Y-%m-%dT%H:%M:%S")
    runs: dict[str, list[Result]] = {name: [] for name in names}
    try:
        if not _rounds(opts, sides, data, run_id, runs):
            return 1
    finally:
        shutil.rmtree(data, ignore_errors=True)
    summary: Result = {"broker": "sluice", "name": "stream-ab", "run": run_id,
                       "label": opts.label, "rounds": opts.rounds, "runs": opts.runs}
    base = runs[names[0]]
    for name in names:
        rates = [r["mb_per_s"] for r in runs[name]]
        summary[f"{name}_median"] = statistics.median(rates)
        summary[f"{name}_warm_dd_median"] = round(statistics.median(
            r["mb_per_s"] / r["dd_warm"] for r in runs[name]), 3)
        if name != names[0]:
            pairs = [r["mb_per_s"] / b["mb_per_s"] for r, b in zip(runs[name], base, strict=True)]
            summary[f"{name}_ratios"] = [round(x, 3) for x in pairs]
            summary[f"{name}_ratio_median"] = round(statistics.median(pairs), 3)
    record(opts.out, summary)
    print(json.dumps(summary))
    return 0


def _rounds(opts: argparse.Namespace, sides: dict[str, str], data: Path, run_id: str,
            runs: dict[str, list[Result]]) -> bool:
    """Every round: dd cold and warm, then each side's broker in turn; False if a run failed."""
    names = list(sides)
    for n in range(opts.rounds):
        dd = {kind: dd_mb_per_s(TMP / "sluice-bench" / "disk") for kind in ("cold", "warm")}
        for name in names if n % 2 == 0 else names[::-1]:
            saved = os.environ.get("PYTHONPATH")
            os.environ["PYTHONPATH"] = str(Path(sides[name]).resolve())
            try:
                broker = start_sluice(opts.python, ["--ws-port=auto", "--console-port=auto",
                                                    f"--data-dir={data}"])
            finally:
                if saved is None:
                    os.environ.pop("PYTHONPATH")
                else:
                    os.environ["PYTHONPATH"] = saved
            try:
                for args in WARMUP:
                    stompload(opts.python, broker, args, label=f"{name}:warmup", timeout=300)
                for k in range(opts.runs):
                    result = stompload(opts.python, broker, STREAM, label=f"{name}:large-nc",
                                       timeout=300)
                    if "mb_per_s" not in result:
                        print(f"{name}: run failed: {result.get('errors')}", file=sys.stderr)
                        return False
                    result.update(broker="sluice", name="large-nc", side=name, round=n, k=k,
                                  run=run_id, label=opts.label, dd_cold=round(dd["cold"], 1),
                                  dd_warm=round(dd["warm"], 1))
                    record(opts.out, result)
                    runs[name].append(result)
                    print(name, n, k, result["mb_per_s"], "dd", round(dd["cold"]),
                          round(dd["warm"]), flush=True)
            finally:
                broker.stop()
    return True


if __name__ == "__main__":
    sys.exit(main())
