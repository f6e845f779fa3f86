"""Crash-loop torture: producers and consumers run while the broker is killed -9 and restarted.

The verdict comes from an independent ledger, never from the broker: producers append a message
id to their ledger file only after its RECEIPT; consumers append every delivery with whether its
embedded SHA-256 matched. At the end every receipted id must have been delivered at least once
and no delivery may be corrupt; redeliveries (duplicates) are counted, as at-least-once allows.
One ACK in 16 is sent with a receipt: once it came, that message must never be delivered again
(a delivery after it is recorded ``after-ack``: a lost ACK, or a record of a reused journal
file's earlier use read back). Each consumer checks the ids it acknowledged itself, which is
every redelivery when each queue has one consumer (the default: as many consumers as queues).

Used by tests/torture/ (a short run) and bench/torture.py (N cycles). The broker is anything
with `url`, `kill()`, `restart()`: the test fixture's BrokerProcess or the bench's launcher.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sluicemq.client import Client
from sluicemq.errors import ClientError

SEP = b"|"


class Broker(Protocol):
    url: str

    def kill(self) -> None: ...

    def restart(self) -> Any: ...


def make_body(msg_id: str, rng: random.Random, max_size: int) -> bytes:
    """id | payload | sha256(id|payload): any flipped or lost byte is detectable."""
    size = rng.choice((16, 200, 4096, rng.randrange(1, max_size + 1)))
    payload = rng.randbytes(size)
    head = msg_id.encode() + SEP + payload
    return head + SEP + hashlib.sha256(head).hexdigest().encode()


def check_body(body: bytes) -> str | None:
    """The message id if the body is intact, else None."""
    head, sep, digest = body.rpartition(SEP)
    if not sep or hashlib.sha256(head).hexdigest().encode() != digest:
        return None
    return head.split(SEP, 1)[0].decode(errors="replace")


@dataclass
class Verdict:
    """What the ledgers say after a run."""

    cycles: int = 0
    receipted: int = 0
    delivered_unique: int = 0
    deliveries: int = 0
    lost: list[str] = field(default_factory=list)
    corrupt: int = 0
    duplicates: int = 0
    unreceipted_delivered: int = 0  # sends whose receipt the crash ate but that were stored
    after_ack: int = 0  # delivered again after an ACK whose receipt came: never allowed

    @property
    def ok(self) -> bool:
        return not self.lost and not self.corrupt and not self.after_ack

    def summary(self) -> str:
        return (f"{self.cycles} kill -9 cycles: {self.receipted} receipted, "
                f"{self.delivered_unique} delivered ({self.deliveries} deliveries, "
                f"{self.duplicates} duplicates, {self.unreceipted_delivered} stored without "
                f"receipt), {len(self.lost)} lost, {self.corrupt} corrupt, "
                f"{self.after_ack} delivered after a receipted ACK")


class Ledger:
    """Append-only files, one per worker, flushed per line: the test's own memory. A
    consumer's line also wakes ``wait_received``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.changed = threading.Condition()
        self.received: set[str] = set()  # ids consumers recorded, intact or not
        self.awaited: set[str] = set()  # of the ids wait_received waits for, those not seen

    def writer(self, name: str) -> Callable[[str], None]:
        fh = open(self.directory / f"{name}.log", "a", buffering=1)  # noqa: SIM115
        receiving = name.startswith("recv-")

        def append(line: str) -> None:
            fh.write(line + "\n")
            if receiving:
                msg_id = line.split(" ", 1)[0]
                with self.changed:
                    self.received.add(msg_id)
                    self.awaited.discard(msg_id)
                    if not self.awaited:
                        self.changed.notify_all()

        return append

    def wait_received(self, ids: set[str], timeout: float) -> bool:
        """Until consumers recorded every one of ``ids`` (or ``timeout``): woken by their lines,
        no polling of the files."""
        with self.changed:
            self.awaited = ids - self.received
            return self.changed.wait_for(lambda: not self.awaited, timeout)

    def read(self, prefix: str) -> list[str]:
        lines: list[str] = []
        for path in sorted(self.directory.glob(f"{prefix}*.log")):
            lines += path.read_text().splitlines()
        return lines


def connect(url: str, stop: threading.Event, **kwargs: Any) -> Client | None:
    """Keep trying until the broker is back (or the run is over)."""
    while not stop.is_set():
        try:
            return Client(url, timeout=5, **kwargs)
        except (ClientError, OSError):
            time.sleep(0.05)  # the broker is down on purpose: retry pacing, not a wait for it
    return None


def producer(url: str, queues: list[str], name: str, ledger: Ledger, stop: threading.Event,
             seed: int, max_size: int) -> None:
    rng = random.Random(seed)
    record = ledger.writer(f"sent-{name}")
    seq = 0
    while not stop.is_set():
        client = connect(url, stop)
        if client is None:
            return
        try:
            while not stop.is_set():
                msg_id = f"{name}-{seq}"
                seq += 1
                client.send(rng.choice(queues), make_body(msg_id, rng, max_size),
                            {"torture-id": msg_id})
                record(msg_id)  # only now: the broker promised it is durable
        except (ClientError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                client.disconnect()


def consumer(url: str, queue: str, name: str, ledger: Ledger, stop: threading.Event,
             drained: threading.Event) -> None:
    record = ledger.writer(f"recv-{name}")
    acked: set[str] = set()  # ids whose ACK was receipted
    delivered = 0
    while not stop.is_set():
        client = connect(url, stop)
        if client is None:
            return
        try:
            sub = client.subscribe(queue, ack="client-individual", prefetch=50)
            while not stop.is_set():
                msg = sub.get(0.5)
                if msg is None:
                    if drained.is_set():
                        return
                    continue
                msg_id = check_body(msg.body)
                if msg_id is None:
                    record(f"{msg.headers.get('torture-id')} corrupt")
                else:
                    record(f"{msg_id} after-ack" if msg_id in acked else f"{msg_id} ok")
                delivered += 1
                if delivered % 16 or msg_id is None:
                    msg.ack()
                else:
                    msg.ack(receipt=True)
                    acked.add(msg_id)
        except (ClientError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                client.disconnect()


def run(broker: Broker, workdir: Path, *, cycles: int, producers: int = 3, consumers: int = 2,
        queues: int = 2, min_up: float = 0.3, max_up: float = 1.5, seed: int = 1,
        max_size: int = 200_000, drain_timeout: float = 60.0,
        on_cycle: Callable[[int], None] | None = None,
        before_kill: Callable[[int], None] | None = None) -> Verdict:
    """Run the crash loop and return the ledgers' verdict. ``before_kill(cycle)`` runs after
    each random up time, just before the kill: a spec waits there for an event the kill must
    come after; ``on_cycle(cycle)`` runs once the broker is back."""
    rng = random.Random(seed)
    ledger = Ledger(workdir / "ledger")
    names = [f"/queue/torture.{i}" for i in range(queues)]
    stop_producing, stop_consuming, drained = (threading.Event(), threading.Event(),
                                               threading.Event())
    threads = [threading.Thread(target=producer, daemon=True,
                                args=(broker.url, names, f"p{i}", ledger, stop_producing,
                                      seed * 1000 + i, max_size))
               for i in range(producers)]
    threads += [threading.Thread(target=consumer, daemon=True,
                                 args=(broker.url, names[i % queues], f"c{i}", ledger,
                                       stop_consuming, drained))
                for i in range(max(consumers, queues))]
    for t in threads:
        t.start()
    for cycle in range(cycles):
        time.sleep(rng.uniform(min_up, max_up))  # the kill lands at a random moment: the test
        if before_kill is not None:
            before_kill(cycle + 1)
        broker.kill()
        if rng.random() < 0.3:
            time.sleep(rng.uniform(0, 0.3))  # clients notice, retry against a closed port
        broker.restart()
        if on_cycle is not None:
            on_cycle(cycle + 1)
    time.sleep(min_up)  # traffic after the last restart is part of the run
    stop_producing.set()
    for t in threads[:producers]:
        t.join(30)
    sent = set(ledger.read("sent-"))
    ledger.wait_received(sent, drain_timeout)  # if it times out, judge names what was lost
    drained.set()  # each consumer ends after half a second without a message (late copies show)
    for t in threads[producers:]:
        t.join(30)
    stop_consuming.set()
    return judge(ledger, cycles)


def judge(ledger: Ledger, cycles: int) -> Verdict:
    sent = set(ledger.read("sent-"))
    lines = ledger.read("recv-")
    counts = Counter(line.split(" ", 1)[0] for line in lines if line.endswith(" ok"))
    verdict = Verdict(cycles=cycles, receipted=len(sent), deliveries=len(lines),
                      delivered_unique=len(counts),
                      corrupt=sum(1 for line in lines if line.endswith(" corrupt")),
                      after_ack=sum(1 for line in lines if line.endswith(" after-ack")))
    verdict.lost = sorted(sent - set(counts))
    verdict.duplicates = sum(n - 1 for n in counts.values())
    verdict.unreceipted_delivered = len(set(counts) - sent)
    return verdict


def damage_files(paths: list[Path], rng: random.Random) -> tuple[str, Path, int, int]:
    """One random injury to one non-empty journal file: truncate, flip bytes, or zero a run.

    Returns (kind, path, offset, nbytes): the byte range that can no longer be trusted
    (for a truncation, everything from `offset` on).
    """
    candidates = [p for p in paths if p.stat().st_size > 0]
    path = rng.choice(candidates)
    data = bytearray(path.read_bytes())
    used = len(data.rstrip(b"\0")) or len(data)
    offset = rng.randrange(0, used)
    kind = rng.choice(("truncate", "flip", "zero", "garbage"))
    if kind == "truncate":
        os.truncate(path, offset)
        return kind, path, offset, len(data) - offset
    nbytes = rng.choice((1, 2, 16, 300, 5000))
    end = min(len(data), offset + nbytes)
    if kind == "flip":
        for i in range(offset, end):
            data[i] ^= 1 << rng.randrange(8)
    elif kind == "zero":
        data[offset:end] = bytes(end - offset)
    else:
        data[offset:end] = rng.randbytes(end - offset)
    path.write_bytes(bytes(data))
    return kind, path, offset, end - offset
