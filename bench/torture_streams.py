"""Crash-loop torture for large streams: kill -9 the broker while files stream through it.

Run: ``.venv/bin/python bench/torture_streams.py [--cycles 50] [--producers 3] [--consumers 4]``.

Producers send random files (0 B to `--max-size`, small chunks so every file has many) with
`send_file(resume=True)`; after a crash they reconnect and resend the same file, which makes
the client ask the broker where the stream stopped and continue there. Consumers save streams
into one directory per queue with `save_stream` (what `receive_file` does), so a delivery the
broker resumes mid-stream continues the `.part` file another consumer left behind.

The verdict comes from append-only ledgers, never from the broker: a producer writes a
stream's id, SHA-256 and size to its "plan" ledger before sending and to its "acked" ledger
once `close()` returned (the final chunk's receipt); a consumer hashes every file it saved
and appends what it found. Every acknowledged stream must have been received whole at least
once, and no saved file may differ from its plan. Duplicates and resumes are counted.

The CI suite (tests/torture/test_stream_crash_loop.py) runs a few cycles of the same engine.
Exit status 1 if a stream was lost, a file corrupt, or the broker logged an internal error.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "torture")]

from torture_engine import Broker, Ledger, connect  # noqa: E402

from sluice_testing import BrokerProcess  # noqa: E402
from sluicemq.client import Client  # noqa: E402
from sluicemq.client.files import PARTIAL_DIR, file_identity, save_stream  # noqa: E402
from sluicemq.errors import ClientError  # noqa: E402
from sluicemq.streaming.errors import StreamIntegrityError  # noqa: E402
from sluicemq.streaming.manifest import MAX_STREAMS, STREAM_ID  # noqa: E402

KiB, MiB = 1 << 10, 1 << 20
HASH_BLOCK = 1 << 20


@dataclass(frozen=True)
class Settings:
    """Shape of one run; the defaults suit the short CI version."""

    cycles: int = 4
    producers: int = 3
    consumers: int = 4
    queues: int = 2
    max_size: int = 3 * MiB
    chunk_size: int = 64 * KiB
    window: int = 8
    min_up: float = 0.8
    max_up: float = 2.5
    seed: int = 1
    drain_timeout: float = 60.0
    stall_timeout: float = 3.0  # a consumer gives up on a stream that sends nothing this long


@dataclass
class StreamVerdict:
    """What the ledgers say after a run."""

    cycles: int = 0
    planned: int = 0
    acknowledged: int = 0
    received_whole: int = 0
    deliveries: int = 0
    lost: list[str] = field(default_factory=list)
    corrupt: list[str] = field(default_factory=list)
    duplicates: int = 0
    resumed_deliveries: int = 0
    resent_streams: int = 0  # producer attempts after the first, i.e. sends resumed
    skipped_bytes: int = 0  # bytes a resumed send did not have to send again
    duplicate_chunks: int = 0
    already_complete: int = 0
    unacknowledged_received: int = 0  # stored though the crash ate the final receipt
    bytes_acknowledged: int = 0
    dead_lettered: Counter[str] = field(default_factory=Counter)  # chunks per stream in DLQs
    consumer_errors: Counter[str] = field(default_factory=Counter)
    error_samples: dict[str, str] = field(default_factory=dict)  # first message of each kind

    @property
    def ok(self) -> bool:
        return not self.lost and not self.corrupt

    def summary(self) -> str:
        errors = ", ".join(f"{k} {n}" for k, n in sorted(self.consumer_errors.items()))
        return (f"{self.cycles} kill -9 cycles: {self.acknowledged} streams acknowledged "
                f"({self.bytes_acknowledged / MiB:.0f} MiB) of {self.planned} started, "
                f"{self.received_whole} received whole ({self.deliveries} deliveries, "
                f"{self.duplicates} duplicates, {self.resumed_deliveries} resumed deliveries, "
                f"{self.unacknowledged_received} stored without final receipt); "
                f"producers: {self.resent_streams} resumed sends skipping "
                f"{self.skipped_bytes / MiB:.1f} MiB, {self.duplicate_chunks} duplicate chunks, "
                f"{self.already_complete} already complete; "
                f"{len(self.lost)} lost, {len(self.corrupt)} corrupt, "
                f"{self.dead_lettered.total()} chunks of {len(self.dead_lettered)} streams "
                f"dead-lettered; "
                f"consumer errors: {errors or 'none'}")


def file_sha(path: Path) -> tuple[str, int]:
    """SHA-256 (hex) and size of a file, read in blocks."""
    sha, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while block := f.read(HASH_BLOCK):
            sha.update(block)
            size += len(block)
    return sha.hexdigest(), size


def random_size(rng: random.Random, max_size: int, chunk_size: int) -> int:
    """Mostly arbitrary sizes, with the edges a chunker gets wrong: empty, one byte, exact
    multiples of the chunk size and one byte either side of them."""
    k = rng.randrange(1, max(2, max_size // chunk_size))
    return rng.choice((0, 1, k * chunk_size, k * chunk_size + 1, k * chunk_size - 1,
                       *(rng.randrange(max_size + 1) for _ in range(5))))


def make_file(path: Path, size: int, rng: random.Random) -> str:
    """Write `size` random bytes to `path`; return their SHA-256."""
    sha = hashlib.sha256()
    with open(path, "wb") as f:
        for start in range(0, size, MiB):
            block = rng.randbytes(min(MiB, size - start))
            sha.update(block)
            f.write(block)
    return sha.hexdigest()


def producer(url: str, queues: list[str], name: str, workdir: Path, ledger: Ledger,
             stop: threading.Event, s: Settings, seed: int) -> None:
    """Send files until told to stop; a started file is always finished (a half stream left
    open would hold its consumer until the broker's stream timeout)."""
    rng = random.Random(seed)
    plan, acked = ledger.writer(f"plan-{name}"), ledger.writer(f"acked-{name}")
    outbox = workdir / "outbox" / name
    outbox.mkdir(parents=True)
    never = threading.Event()  # a started file is finished, so keep reconnecting
    client: Client | None = None
    seq = 0
    while not stop.is_set():
        path = outbox / f"{name}-{seq}.bin"
        seq += 1
        sha = make_file(path, random_size(rng, s.max_size, s.chunk_size), rng)
        queue = rng.choice(queues)
        _, stream_id, size = file_identity(path, queue)
        # Before the first chunk leaves: a stream whose final receipt the crash ate may
        # still be stored and delivered, and must then be checked too.
        plan(f"{stream_id} {sha} {size}")
        attempts = 0
        while True:
            client = client or connect(url, never)
            assert client is not None
            attempts += 1
            try:
                writer = client.send_file(queue, path, chunk_size=s.chunk_size,
                                          window=s.window, resume=True)
            except (ClientError, OSError):
                with contextlib.suppress(Exception):
                    client.disconnect()
                client = None
                continue
            acked(f"{writer.stream_id} {sha} {writer.bytes_written} attempts={attempts} "
                  f"skipped={writer.resumed_at} dup_chunks={writer.duplicates} "
                  f"complete={int(writer.already_complete)}")
            break
        path.unlink()
    if client is not None:
        with contextlib.suppress(Exception):
            client.disconnect()


def consumer(url: str, queue: str, name: str, inbox: Path, ledger: Ledger,
             stop: threading.Event, drained: threading.Event, s: Settings) -> None:
    """Save streams into `inbox` and hash each saved file; reconnect after every failure."""
    record, errors = ledger.writer(f"recv-{name}"), ledger.writer(f"error-{name}")
    while not stop.is_set():
        client = connect(url, stop)
        if client is None:
            return
        try:
            with client.streams(queue, window=s.window, timeout=s.stall_timeout) as streams:
                while not stop.is_set():
                    stream = next(streams, None)
                    if stream is None:
                        if drained.is_set():
                            return
                        continue
                    offset = stream.offset
                    final = save_stream(stream, inbox)
                    sha, size = file_sha(final)
                    record(f"{stream.id} {sha} {size} offset={offset}")
        except (ClientError, OSError) as exc:
            errors(f"{error_kind(exc)} {type(exc).__name__}: {exc}")
        finally:
            with contextlib.suppress(Exception):
                client.disconnect()


def error_kind(exc: BaseException) -> str:
    """A one-word class of a consumer failure, for the report."""
    text = str(exc)
    for kind, marker in (("cannot-resume", "cannot resume"), ("stalled", "stalled"),
                         ("abandoned", "abandoned"), ("gap", "gap")):
        if marker in text:
            return kind
    if isinstance(exc, StreamIntegrityError):
        return "integrity"
    connection = isinstance(exc, OSError) or "connection" in text.lower()
    return "connection" if connection else "other"


def run(broker: Broker, workdir: Path, s: Settings,
        on_cycle: Callable[[int], None] | None = None) -> StreamVerdict:
    """Run the crash loop, drain, and return the ledgers' verdict."""
    rng = random.Random(s.seed)
    ledger = Ledger(workdir / "ledger")
    queues = [f"/queue/torture.streams.{i}" for i in range(s.queues)]
    stop_producing, stop_consuming, drained = (threading.Event(), threading.Event(),
                                               threading.Event())
    producers = [threading.Thread(target=producer, daemon=True,
                                  args=(broker.url, queues, f"p{i}", workdir, ledger,
                                        stop_producing, s, s.seed * 1000 + i))
                 for i in range(s.producers)]
    consumers = [threading.Thread(target=consumer, daemon=True,
                                  args=(broker.url, queues[i % s.queues], f"c{i}",
                                        workdir / "inbox" / str(i % s.queues), ledger,
                                        stop_consuming, drained, s))
                 for i in range(max(s.consumers, s.queues))]
    for t in producers + consumers:
        t.start()
    for cycle in range(s.cycles):
        time.sleep(rng.uniform(s.min_up, s.max_up))
        broker.kill()
        if rng.random() < 0.3:
            time.sleep(rng.uniform(0, 0.5))  # clients notice, retry against a closed port
        broker.restart()
        if on_cycle is not None:
            on_cycle(cycle + 1)
    time.sleep(s.min_up)
    stop_producing.set()
    for t in producers:
        t.join(s.drain_timeout)
    deadline = time.monotonic() + s.drain_timeout
    while time.monotonic() < deadline and judge(ledger, s.cycles).lost:
        time.sleep(0.5)
    drained.set()
    stop_consuming.set()
    for t in consumers:
        t.join(s.stall_timeout + 10)
    verdict = judge(ledger, s.cycles)
    for q in queues:
        verdict.dead_lettered += waiting_chunks(broker.url, dead_letter_queue(q))
    return verdict


def dead_letter_queue(queue: str) -> str:
    return "/queue/DLQ." + queue.removeprefix("/queue/")


def waiting_chunks(url: str, queue: str, idle: float = 1.0) -> Counter[str]:
    """Chunks per stream id waiting on `queue`; left there, as none is acknowledged."""
    found: Counter[str] = Counter()
    with Client(url, timeout=5) as client:
        sub = client.subscribe(queue, ack="client-individual", prefetch=10_000,
                               headers={MAX_STREAMS: "0"})
        while (message := sub.get(idle)) is not None:
            found[message.headers.get(STREAM_ID, "?")] += 1
    return found


def fields(line: str) -> tuple[str, str, int, dict[str, int]]:
    """(id, sha, size, key=value extras) of a ledger line."""
    stream_id, sha, size, *rest = line.split()
    extras = {k: int(v) for k, v in (item.split("=", 1) for item in rest)}
    return stream_id, sha, int(size), extras


def judge(ledger: Ledger, cycles: int) -> StreamVerdict:
    planned = {i: (sha, size) for i, sha, size, _ in map(fields, ledger.read("plan-"))}
    acked = [fields(line) for line in ledger.read("acked-")]
    received = [fields(line) for line in ledger.read("recv-")]
    v = StreamVerdict(cycles=cycles, planned=len(planned), acknowledged=len(acked),
                      deliveries=len(received))
    whole: Counter[str] = Counter()
    for stream_id, sha, size, extras in received:
        if planned.get(stream_id) == (sha, size):
            whole[stream_id] += 1
        else:
            v.corrupt.append(f"{stream_id}: got {size} bytes sha {sha[:12]}, planned "
                             f"{planned.get(stream_id)}")
        v.resumed_deliveries += extras["offset"] > 0
    acked_ids = {stream_id for stream_id, *_ in acked}
    v.received_whole = len(acked_ids & set(whole))
    v.lost = sorted(acked_ids - set(whole))
    v.duplicates = sum(n - 1 for n in whole.values())
    v.unacknowledged_received = len(set(whole) - acked_ids)
    for _, _, size, extras in acked:
        v.bytes_acknowledged += size
        v.resent_streams += extras["attempts"] > 1
        v.skipped_bytes += extras["skipped"]
        v.duplicate_chunks += extras["dup_chunks"]
        v.already_complete += extras["complete"]
    for line in ledger.read("error-"):
        kind, message = line.split(" ", 1)
        v.consumer_errors[kind] += 1
        v.error_samples.setdefault(kind, message)
    return v


def leftover_parts(workdir: Path) -> list[Path]:
    """Part files still in the inboxes: streams some consumer never finished."""
    return sorted((workdir / "inbox").glob(f"*/{PARTIAL_DIR}/*.part"))


def broker_problems(log: str) -> list[str]:
    """Lines of the broker log that mean a bug rather than a crash we caused."""
    return [line for line in log.splitlines()
            if "internal error" in line.lower() or "Traceback" in line]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=50)
    ap.add_argument("--producers", type=int, default=3)
    ap.add_argument("--consumers", type=int, default=4)
    ap.add_argument("--queues", type=int, default=2)
    ap.add_argument("--max-size", type=int, default=4 * MiB, help="largest file in bytes")
    ap.add_argument("--chunk-size", type=int, default=64 * KiB)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    s = Settings(cycles=args.cycles, producers=args.producers, consumers=args.consumers,
                 queues=args.queues, max_size=args.max_size, chunk_size=args.chunk_size,
                 seed=args.seed, drain_timeout=180)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sluice-torture-streams-") as tmp:
        broker = BrokerProcess(Path(tmp) / "data",
                               ["--console-port", "off", "--ws-port", "off"]).start()
        try:
            verdict = run(broker, Path(tmp), s, on_cycle=lambda n: print(
                f"cycle {n}/{s.cycles}", flush=True) if n % 10 == 0 else None)
        finally:
            broker.kill()
        problems = broker_problems(broker.log())
        parts = leftover_parts(Path(tmp))
    print(f"torture --streams: {verdict.summary()}; {len(parts)} leftover part files; "
          f"{len(problems)} broker log problems; {time.monotonic() - started:.0f}s")
    for kind, message in sorted(verdict.error_samples.items()):
        print(f"   e.g. {kind}: {message[:300]}")
    for line in verdict.lost[:20] + verdict.corrupt[:20] + problems[:20]:
        print("  ", line)
    return 0 if verdict.ok and not problems else 1


if __name__ == "__main__":
    sys.exit(main())
