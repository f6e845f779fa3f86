"""How fast each vCPU runs right now: one fixed pure-Python loop, timed on each vCPU in turn.

Why: on this 2-vCPU VM a vCPU at times runs the same code 1.5-1.9x slower than usual, for
seconds, with nothing else scheduled on it and no steal time counted. The scheduler keeps the
broker on one vCPU and the two load clients on the other, so whichever vCPU is slow decides
the run: that was the "bimodal" end-to-end rate (README Benchmarks, #15). `compare.py`
records a probe before each scenario (``cpu_probe_ms``, one figure per vCPU) so that a slow
row can be told apart from a slower broker.

    .venv/bin/python bench/cpuprobe.py              # one probe
    .venv/bin/python bench/cpuprobe.py --watch 10   # one every 0.5 s for 10 s
"""

from __future__ import annotations

import argparse
import json
import os
import time

LOOPS = 300_000  # ~15 ms on a vCPU at full speed here


def probe(loops: int = LOOPS) -> list[float]:
    """Milliseconds the loop took on each vCPU this thread may use, in vCPU order.

    The calling thread moves to each vCPU in turn and back to where it may run after, so
    processes started later inherit the affinity they would have had anyway.
    """
    allowed = os.sched_getaffinity(0)
    times = []
    try:
        for cpu in sorted(allowed):
            os.sched_setaffinity(0, {cpu})
            started = time.perf_counter()
            total = 0
            for i in range(loops):
                total += i
            times.append(round((time.perf_counter() - started) * 1e3, 2))
    finally:
        os.sched_setaffinity(0, allowed)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--watch", type=float, default=0.0, help="probe for this many seconds")
    parser.add_argument("--every", type=float, default=0.5, help="seconds between probes")
    opts = parser.parse_args()
    deadline = time.monotonic() + opts.watch
    while True:
        print(json.dumps({"time": time.strftime("%H:%M:%S"), "cpu_probe_ms": probe()}),
              flush=True)
        if time.monotonic() >= deadline:
            return 0
        time.sleep(opts.every)


if __name__ == "__main__":
    raise SystemExit(main())
