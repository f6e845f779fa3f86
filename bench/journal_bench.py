"""Journal throughput under group commit: N producers that each wait for durability.

Each producer is a coroutine on one asyncio loop (as connections are in the broker): append a
record, wait until on_durable covers it (when a RECEIPT would go out), repeat. Reported per
scenario: records/s, MB/s, fsyncs/s, mean records per batch, fdatasync latency p50/p99.

    .venv/bin/python bench/journal_bench.py [--seconds 3] [--dir /path/on/the/disk/to/test]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from sluicemq.storage.journal import Journal


@dataclass(frozen=True)
class Scenario:
    producers: int
    record_bytes: int
    preallocate: bool
    sync: bool = True

    @property
    def label(self) -> str:
        size = f"{self.record_bytes >> 20} MiB" if self.record_bytes >= 1 << 20 else (
            f"{self.record_bytes >> 10} KiB")
        extra = "" if self.sync else ", no fsync"
        prealloc = "on " if self.preallocate else "off"
        return f"{size:>7} x{self.producers:<3} prealloc={prealloc}{extra}"


@dataclass(frozen=True)
class Result:
    records_s: float
    mb_s: float
    fsyncs_s: float
    mean_batch: float
    p50_ms: float
    p99_ms: float


async def _drive(journal: Journal, scenario: Scenario, warmup: float, seconds: float) -> Result:
    loop = asyncio.get_running_loop()
    waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    def durable(seq: int) -> None:
        while waiting and waiting[0][0] <= seq:
            waiting.popleft()[1].set_result(None)

    journal.start(lambda seq: loop.call_soon_threadsafe(durable, seq), print)
    payload = bytes(scenario.record_bytes)
    done = 0
    stop = False

    async def producer() -> None:
        nonlocal done
        while not stop:
            ticket = journal.append(1, payload)
            future = loop.create_future()
            waiting.append((ticket.seq, future))
            await future
            done += 1

    tasks = [asyncio.create_task(producer()) for _ in range(scenario.producers)]
    await asyncio.sleep(warmup)
    stats = journal.stats
    start_done, start_fsyncs, start_batches = done, stats.fsyncs, stats.batches
    start_records = stats.records
    started = time.perf_counter()
    await asyncio.sleep(seconds)
    elapsed = time.perf_counter() - started
    records = done - start_done
    batches = stats.batches - start_batches
    latencies = sorted(list(stats.fsync_latency_s)[-max(batches, 1) :]) or [0.0]
    stop = True
    await asyncio.gather(*tasks)
    return Result(
        records_s=records / elapsed,
        mb_s=records * scenario.record_bytes / elapsed / 1e6,
        fsyncs_s=(stats.fsyncs - start_fsyncs) / elapsed,
        mean_batch=(stats.records - start_records) / max(batches, 1),
        p50_ms=statistics.median(latencies) * 1e3,
        p99_ms=latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e3,
    )


def run(scenario: Scenario, parent: Path | None, warmup: float, seconds: float) -> Result:
    directory = Path(tempfile.mkdtemp(prefix="journal-bench-", dir=parent))
    try:
        journal = Journal(directory, preallocate=scenario.preallocate, sync=scenario.sync)
        for _ in journal.recover():
            pass
        try:
            return asyncio.run(_drive(journal, scenario, warmup, seconds))
        finally:
            journal.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def recovery_rate(parent: Path | None, count: int = 200_000, size: int = 1024) -> str:
    """Write `count` records without fsync, then time a cold-ish recover() of them."""
    directory = Path(tempfile.mkdtemp(prefix="journal-bench-", dir=parent))
    try:
        journal = Journal(directory, sync=False)
        for _ in journal.recover():
            pass
        journal.start(lambda seq: None, print)
        payload = bytes(size)
        for _ in range(count):
            journal.append(1, payload)
        journal.close()
        journal = Journal(directory)
        started = time.perf_counter()
        seen = sum(1 for _ in journal.recover())
        elapsed = time.perf_counter() - started
        journal.close()
        assert seen == count
        return (f"recovery: {count} x {size} B records in {elapsed:.2f}s = "
                f"{count / elapsed:,.0f} records/s, {count * size / elapsed / 1e6:.0f} MB/s")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="measured time per scenario")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured lead-in")
    parser.add_argument("--dir", type=Path, default=None, help="where to put the journal")
    parser.add_argument("--quick", action="store_true", help="1 KiB x8 both ways only")
    args = parser.parse_args()
    scenarios = [Scenario(8, 1024, True), Scenario(8, 1024, False)] if args.quick else [
        *(Scenario(p, 1024, pre) for p in (1, 8, 64) for pre in (True, False)),
        Scenario(64, 1024, True, sync=False),
        *(Scenario(p, 1 << 20, pre) for p in (1, 8) for pre in (True, False)),
    ]
    print(f"{'scenario':<34} {'records/s':>10} {'MB/s':>8} {'fsyncs/s':>9} {'batch':>6} "
          f"{'p50 ms':>7} {'p99 ms':>7}")
    for scenario in scenarios:
        r = run(scenario, args.dir, args.warmup, args.seconds)
        print(f"{scenario.label:<34} {r.records_s:>10.0f} {r.mb_s:>8.1f} {r.fsyncs_s:>9.0f} "
              f"{r.mean_batch:>6.1f} {r.p50_ms:>7.2f} {r.p99_ms:>7.2f}", flush=True)
    if not args.quick:
        print(recovery_rate(args.dir))


if __name__ == "__main__":
    main()
