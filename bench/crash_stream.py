"""kill -9 loop for concurrent store and dispatch: a stream of persistent chunks with a live
consumer, the broker killed at a random moment, restarted, the queue drained; every receipted
chunk must have reached the consumer before the kill or be in the queue after it, and what is
in the queue must be this cycle's chunks, in order, once each (a chunk of an earlier cycle would
be a record of a reused segment file's earlier use: ``stale``).

The cycle is the one `tests/e2e/test_store_and_dispatch.py` runs three times; here it runs as
often as asked, with both ack modes, and prints one JSON line.

    .venv/bin/python bench/crash_stream.py --cycles 50
    .venv/bin/python bench/crash_stream.py --cycles 20 --ack client-individual --seed 7
    .venv/bin/python bench/crash_stream.py --cycles 20 --segment-bytes 4194304  # reuse often
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "e2e")]

from test_store_and_dispatch import Stream, config, drain_until_marker  # noqa: E402

from sluice_testing import BrokerProcess  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--ack", default="auto,client-individual",
                        help="comma-separated ack modes, alternated per cycle")
    parser.add_argument("--store-delay-ms", type=float, default=5.0)
    parser.add_argument("--max-receipts", type=int, default=200,
                        help="kill after a random number of receipts below this")
    parser.add_argument("--seed", default="crash-stream")
    parser.add_argument("--segment-bytes", type=int, default=0,
                        help="journal segment size (0: the broker's default, 64 MiB); smaller "
                             "segments are reclaimed and their files reused more often")
    opts = parser.parse_args(argv)
    rng = random.Random(opts.seed)
    modes = opts.ack.split(",")
    totals = {"cycles": 0, "receipted": 0, "consumed": 0, "left_after_restart": 0, "lost": 0,
              "stale": 0, "disordered": 0, "duplicated": 0}
    journal = config(opts.store_delay_ms)
    if opts.segment_bytes:
        journal += f"segment_bytes = {opts.segment_bytes}\n"
    lost_ids: list[str] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="crash-stream-") as tmp:
        broker = BrokerProcess(Path(tmp) / "data", ["--console-port", "0", "--ws-port", "0"],
                               journal).start()
        try:
            for cycle in range(opts.cycles):
                stream = Stream(broker, modes[cycle % len(modes)], cycle * 1_000_000)
                want = rng.randrange(1, opts.max_receipts)
                deadline = time.monotonic() + 120
                while len(stream.receipted) < want and time.monotonic() < deadline:
                    if not any(t.is_alive() for t in stream.threads):
                        break
                    stream.threads[0].join(0.01)
                broker.kill()
                stream.join()
                broker.restart()
                drained = drain_until_marker(broker)
                left = set(drained)
                lost = stream.receipted - stream.consumed - left
                numbers = [int(n) for n in drained]
                totals["stale"] += sum(1 for n in numbers
                                       if not stream.first <= n < stream.first + 1_000_000)
                totals["disordered"] += int(numbers != sorted(numbers))
                totals["duplicated"] += len(numbers) - len(left)
                lost_ids += sorted(lost)
                totals["cycles"] += 1
                totals["receipted"] += len(stream.receipted)
                totals["consumed"] += len(stream.consumed)
                totals["left_after_restart"] += len(left)
                totals["lost"] += len(lost)
        finally:
            broker.stop()
    print(json.dumps({**totals, "lost_ids": lost_ids[:20], "seed": opts.seed,
                      "seconds": round(time.monotonic() - started, 1)}))
    bad = totals["lost"] + totals["stale"] + totals["disordered"] + totals["duplicated"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
