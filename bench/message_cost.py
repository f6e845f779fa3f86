"""What one message costs the broker in process: 1 KiB SENDs fed to a real session, each
delivered as a MESSAGE to an auto-ack consumer on the same queue (parse, SEND path, cursor,
dispatch, MESSAGE encoding; no sockets). ``--persistent``: the persistent 8 x 8 of
``compare.py`` instead - 8 producers with 8 receipted persistent SENDs each in flight, no
consumer (parse, SEND path, journal append, group commit, durable report, RECEIPT).

Why: on this VM the same code runs 1.5-1.8x slower at some moments (``cpuprobe.py``), so
msgs/s and CPU-seconds cannot tell a 5 % change from the weather. ``--instructions`` counts
the instructions instead (valgrind's callgrind, ~100x slower): it runs the load twice, with
``--count`` and with ``--count`` + ``--extra`` messages, and divides the difference by the
extra messages, so start-up cancels out. Under valgrind the loop turn's input budget
(``turn_budget_ms``, wall-clock time) is raised by ``SLOWDOWN``: at the default 4 ms the ~50x
slower run broke every read into turns of a few frames, so the count carried per-turn costs a
native run does not pay (it parses a 64 KiB read in one turn) and varied by ~2 % run to run.

    .venv/bin/python bench/message_cost.py                      # µs of CPU a message
    .venv/bin/python bench/message_cost.py --instructions       # instructions a message
    .venv/bin/python bench/message_cost.py --instructions --persistent  # ... a receipted 8 x 8 SEND
    PYTHONPATH=<a copy>/src .venv/bin/python bench/message_cost.py --instructions  # A/B
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The in-process broker of the specs (tests/inprocess.py): the real core on a hand-driven loop.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from inprocess import InProcessBroker, config_for
from sluicemq.config import Limits
from sluicemq.protocol.codec import encode_frame
from sluicemq.protocol.frames import Frame

READ = 65536  # bytes per feed, as a socket read hands them over
SLOWDOWN = 100  # under valgrind: the turn budget is this many times the default
TURN_BUDGET_MS = Limits().turn_budget_ms


def run(count: int, turn_budget_ms: float = TURN_BUDGET_MS) -> float:
    """Send and deliver ``count`` messages; the CPU seconds that took."""
    with tempfile.TemporaryDirectory(prefix="sluice-cost-") as tmp:
        broker = InProcessBroker(config_for(Path(tmp),
                                            limits=Limits(turn_budget_ms=turn_budget_ms)))
        try:
            consumer = broker.connect(peer="c:1")
            consumer.request("SUBSCRIBE", {"destination": "/queue/cost", "id": "1"})
            producer = broker.connect(peer="p:1")
            one = encode_frame(Frame("SEND", {"destination": "/queue/cost",
                                              "content-type": "text/plain"}, b"x" * 1024))
            stream = one * count
            started = time.process_time()
            for at in range(0, len(stream), READ):
                producer.session.feed(stream[at:at + READ])
                broker.loop.run()
                consumer.out.data.clear()

            def delivered() -> bool:
                consumer.out.data.clear()
                return consumer.session.delivered >= count

            broker.loop.run_until(delivered, timeout=60)
            return time.process_time() - started
        finally:
            broker.close()


PRODUCERS, WINDOW = 8, 8  # compare.py's persist-8x8


def run_persistent(count: int, turn_budget_ms: float = TURN_BUDGET_MS) -> float:
    """Send ``count`` receipted persistent SENDs from ``PRODUCERS`` connections, ``WINDOW`` in
    flight on each (a connection's next ones are fed once its receipts came back, as
    ``stompload.py persist`` does); the CPU seconds that took."""
    with tempfile.TemporaryDirectory(prefix="sluice-cost-") as tmp:
        broker = InProcessBroker(config_for(Path(tmp),
                                            limits=Limits(turn_budget_ms=turn_budget_ms)))
        try:
            producers = [broker.connect(peer=f"p:{i}") for i in range(PRODUCERS)]
            body = b"x" * 1024
            sent = [0] * PRODUCERS
            receipted = [0] * PRODUCERS
            share = [count // PRODUCERS + (i < count % PRODUCERS) for i in range(PRODUCERS)]

            def frame(rid: int) -> bytes:
                return encode_frame(Frame("SEND", {"destination": "/queue/cost",
                                                   "persistent": "true",
                                                   "receipt": str(rid)}, body))

            def pump() -> bool:
                for i, producer in enumerate(producers):
                    receipted[i] += producer.out.data.count(b"RECEIPT\n")
                    producer.out.data.clear()
                    due = min(share[i], receipted[i] + WINDOW) - sent[i]
                    if due > 0:
                        producer.session.feed(b"".join(frame(sent[i] + n) for n in range(due)))
                        sent[i] += due
                return sum(receipted) >= count

            started = time.process_time()
            while not pump():
                broker.loop.run_until(
                    lambda: any(b"RECEIPT" in p.out.data for p in producers), timeout=60)
            return time.process_time() - started
        finally:
            broker.close()


def instructions(count: int, persistent: bool = False) -> int:
    """Instructions the whole process took for ``count`` messages (valgrind --tool=callgrind)."""
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
         __file__, "--count", str(count),
         "--turn-budget-ms", str(TURN_BUDGET_MS * SLOWDOWN),
         *(["--persistent"] if persistent else [])],
        capture_output=True, text=True, timeout=1800, check=True,
        env=dict(os.environ, PYTHONHASHSEED="0"))
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count from valgrind:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--instructions", action="store_true",
                    help="count instructions a message under valgrind (slow)")
    ap.add_argument("--extra", type=int, default=10_000,
                    help="with --instructions: messages between the two counts")
    ap.add_argument("--persistent", action="store_true",
                    help="receipted persistent SENDs, 8 producers x 8 in flight, no consumer")
    ap.add_argument("--turn-budget-ms", type=float, default=TURN_BUDGET_MS,
                    help="the loop turn's input budget (raised under valgrind)")
    opts = ap.parse_args()
    if opts.instructions:
        base = min(opts.count, 2_000)
        per = (instructions(base + opts.extra, opts.persistent)
               - instructions(base, opts.persistent)) / opts.extra
        print(f"{per:,.0f} instructions a message ({opts.extra:,} messages, "
              f"{time.strftime('%H:%M:%S')})")
        return
    seconds = (run_persistent if opts.persistent else run)(opts.count, opts.turn_budget_ms)
    print(f"{seconds / opts.count * 1e6:.2f} us CPU a message ({opts.count:,} messages)")


if __name__ == "__main__":
    main()
