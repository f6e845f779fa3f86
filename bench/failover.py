"""Shared-storage failover, SluiceMQ and ActiveMQ 5.17 side by side: takeover time and the
lost/duplicated ledger over many takeovers, with the same client code for both.

Two broker processes share one throwaway data directory (SluiceMQ: `sluice broker` twice on
one ``--data-dir``; ActiveMQ: two JVMs on one KahaDB directory with the shared-file locker,
bench/amq_pair.py), each on its own loopback port. Both standbys retry the lock every
``--lock-retry`` seconds. Measured per broker:

* takeover: a client with a ``failover:(...)`` URL sends one persistent message at a time; the
  master is killed with -9 (at a random phase of the standby's retry grid) and the time to the
  first RECEIPT from the new master is taken, broken down into lock taken / listening. With an
  empty store and with ``--backlog`` messages queued; ``--repeat`` kills each (the killed broker
  restarts as the next standby), medians reported.
* handover: the same with a clean stop (SIGTERM) of the master instead of kill -9.
* loop: ``--takeovers`` kill -9s under load (``--producers`` failover clients pipelining
  persistent sends, two consumers acking client-individual with receipts); after each takeover
  the killed broker restarts as the new standby. Then the queue is drained and every receipted
  message is checked against what the consumers processed: lost and duplicated counts.
* baseline: the same load on one broker without kills, for the throughput comparison.

Usage: python bench/failover.py [--brokers sluice,activemq] [--backlog 1000000] [--repeat 5]
           [--takeovers 50] [--producers 4] [--lock-retry 0.5] [--quiet-lock FILE] [--json out]

With ``--quiet-lock`` every scenario holds that file's exclusive flock (the team's quiet lock),
released between scenarios so no hold grows long.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

sys.path.insert(0, str(Path(__file__).parent))
import amq_pair
from failover_load import Load
from lognode import LoggedNode
from sluicemq import Client
from stompload import Producer, split
from stompwire import StompConnection

Row = dict[str, Any]


class Node(Protocol):
    url: str
    proc: subprocess.Popen[str] | None

    def start(self) -> None: ...
    def wait(self, pattern: re.Pattern[str], timeout: float = ...) -> float: ...
    def found(self, pattern: re.Pattern[str]) -> re.Match[str] | None: ...
    def kill(self) -> None: ...
    def stop(self) -> None: ...


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SluiceNode(LoggedNode):
    """One `sluice broker` on the shared data directory, on a fixed port."""

    def __init__(self, data_dir: Path, lock_retry: float) -> None:
        self.port = free_port()
        super().__init__(f"stomp://127.0.0.1:{self.port}")
        self.data_dir = data_dir
        self.lock_retry = lock_retry

    def start(self) -> None:
        self.spawn([sys.executable, "-m", "sluicemq", "broker", "--host", "127.0.0.1",
                    "--port", str(self.port), "--data-dir", str(self.data_dir),
                    "--console-port", "off", "--ws-port", "off",
                    "--lock-retry", str(self.lock_retry)],
                   env=dict(os.environ, PYTHONUNBUFFERED="1"))


class Flavor:
    """How to start a broker of one kind on a shared store, and the log lines that mark its
    standing by, its taking the lock, its serving and (if it says) its recovery."""

    def __init__(self, name: str, make: Callable[[Path, float], Node], standby: str,
                 taken: str, listen: str, recovered: str | None,
                 drain_idle: float | None = None) -> None:
        self.name = name
        self.drain_idle = drain_idle  # None: the broker can say how many messages are left
        self.make = make
        self.standby, self.taken, self.listen = (re.compile(p) for p in (standby, taken, listen))
        self.recovered = re.compile(recovered) if recovered else None


def _amq_node(shared: Path, lock_retry: float) -> Node:
    base = Path(tempfile.mkdtemp(prefix="amq-", dir=shared.parent))
    return amq_pair.AmqNode(shared, base, free_port(), lock_retry)


FLAVORS = {
    "sluice": Flavor("sluice", SluiceNode, r"sluice: standby:", r"lock taken after",
                     r"listening on stomp://", r"recovered (\d+) messages.* in ([\d.]+)s"),
    "activemq": Flavor("activemq", _amq_node, amq_pair.STANDBY.pattern, amq_pair.TAKEN.pattern,
                       amq_pair.LISTEN.pattern,
                       r"Recovery replayed (\d+) operations from the journal in ([\d.]+) sec",
                       drain_idle=10.0),
}


def failover_url(nodes: list[Node]) -> str:
    inner = ",".join(n.url for n in nodes)
    return f"failover:({inner})?randomize=false&initialReconnectDelay=10&maxReconnectDelay=100"


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


@contextlib.contextmanager
def quiet(path: Path | None) -> Iterator[None]:
    """Hold the team's quiet lock exclusively (benchmarks) for one scenario."""
    if path is None:
        yield
        return
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


async def fill(port: int, dest: bytes, count: int, body: bytes) -> float:
    """Queue ``count`` persistent messages (8 producers x 32 in flight); returns msgs/s."""
    conns = [await StompConnection.open("127.0.0.1", port) for _ in range(8)]
    workers = [Producer(c, dest, n, body, window=32, persistent=True, idle_timeout=300)
               for c, n in zip(conns, split(count, 8), strict=True)]
    started = time.perf_counter()
    await asyncio.gather(*(w.run() for w in workers))
    elapsed = time.perf_counter() - started
    await asyncio.gather(*(c.close() for c in conns))
    return count / elapsed


def pair(flavor: Flavor, base: Path, lock_retry: float) -> tuple[Node, Node]:
    """Master (listening) and standby (standing by) on a fresh shared store."""
    data = Path(tempfile.mkdtemp(prefix=f"{flavor.name}-", dir=base)) / "store"
    master, standby = flavor.make(data, lock_retry), flavor.make(data, lock_retry)
    try:
        master.start()
        master.wait(flavor.listen)
        standby.start()
        standby.wait(flavor.standby)
    except BaseException:
        master.stop()
        standby.stop()
        raise
    return master, standby


def one_takeover(flavor: Flavor, master: Node, standby: Node, lock_retry: float,
                 clean: bool = False) -> Row:
    """Kill -9 (or, ``clean``, SIGTERM) the master under a one-at-a-time failover producer;
    times from the signal."""
    receipts: list[tuple[float, str]] = []
    stop = threading.Event()
    started = threading.Event()
    failed: list[BaseException] = []

    def probe() -> None:
        try:
            with Client(failover_url([master, standby]), timeout=300) as c:
                while not stop.is_set():
                    c.send("/queue/probe", b"p")
                    receipts.append((time.perf_counter(), c.address))
                    started.set()
        except BaseException as exc:
            failed.append(exc)
            started.set()

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    if not started.wait(120) or failed:
        raise RuntimeError(f"probe client did not start: {failed}")
    # The standby retries on a fixed grid; a random phase makes the lock wait typical
    # (uniform in [0, lock_retry)) instead of always the same.
    time.sleep(random.uniform(0, lock_retry))
    killed = time.perf_counter()
    if clean:
        threading.Thread(target=master.stop, daemon=True).start()
    else:
        master.kill()
    taken = standby.wait(flavor.taken)
    listening = standby.wait(flavor.listen)
    while not any(at > killed and addr == standby.url for at, addr in receipts):
        if not thread.is_alive():
            raise RuntimeError(f"probe client died: {failed}")
        time.sleep(0.01)  # a benchmark may poll its own ledger
    first = min(at for at, addr in receipts if at > killed and addr == standby.url)
    stop.set()
    thread.join(60)
    row: Row = {"lock_taken_s": round(taken - killed, 3),
                "listening_s": round(listening - killed, 3),
                "first_receipt_s": round(first - killed, 3)}
    found = standby.found(flavor.recovered) if flavor.recovered else None
    if found is not None:
        row["recovered"], row["recovery_s"] = int(found.group(1)), float(found.group(2))
    return row


def takeover(flavor: Flavor, base: Path, backlog: int, repeat: int, lock_retry: float,
             lock: Path | None, clean: bool = False) -> Row:
    """``repeat`` takeovers of one store holding ``backlog`` messages; medians and each run.
    Filling the store is not measured, so it runs before the quiet lock is taken."""
    master, standby = pair(flavor, base, lock_retry)
    try:
        fill_rate = asyncio.run(fill(_port(master), b"/queue/backlog", backlog,
                                     b"x" * 1024)) if backlog else None
        with quiet(lock):
            load = load_average()
            runs = []
            for _ in range(repeat):
                runs.append(one_takeover(flavor, master, standby, lock_retry, clean))
                print(f"{flavor.name} backlog {backlog}: {runs[-1]}", file=sys.stderr,
                      flush=True)
                if clean and master.proc is not None:
                    master.proc.wait(300)
                master.start()  # the killed broker comes back as the next standby
                master.wait(flavor.standby)
                master, standby = standby, master
    finally:
        master.stop()
        standby.stop()
    row: Row = {"broker": flavor.name, "scenario": "handover" if clean else "takeover",
                "backlog": backlog,
                "lock_retry": lock_retry, "load_1m": load,
                "fill_msgs_s": round(fill_rate) if fill_rate else None}
    for key in ("lock_taken_s", "listening_s", "first_receipt_s"):
        row[f"{key}_median"] = round(statistics.median(r[key] for r in runs), 3)
    row["runs"] = runs
    return row


def _port(node: Node) -> int:
    return int(node.url.rsplit(":", 1)[1])


def loop(flavor: Flavor, base: Path, takeovers: int, producers: int, window: int,
         lock_retry: float, settle: float, lock: Path | None) -> Row:
    """``takeovers`` kill -9s under load; the killed broker comes back as the next standby."""
    with quiet(lock):
        load_1m = load_average()
        nodes = list(pair(flavor, base, lock_retry))
        load = Load(failover_url(nodes), producers, window, consumers=2)
        load.start()
        started = time.perf_counter()
        master, standby = nodes
        times = []
        try:
            for _ in range(takeovers):
                target = load.receipted_count() + int(settle * 1000)
                while load.receipted_count() < target and not load.errors:
                    time.sleep(0.01)  # a benchmark may poll its own ledger
                killed = time.perf_counter()
                master.kill()
                times.append(standby.wait(flavor.listen) - killed)
                master.start()
                master.wait(flavor.standby)
                master, standby = standby, master
            load.finish()
            elapsed = time.perf_counter() - started
            load.drain(master.url, idle=flavor.drain_idle)
        finally:
            for n in nodes:
                n.stop()
    ledger = load.ledger()
    return {"broker": flavor.name, "scenario": "loop", "load_1m": load_1m,
            "takeovers": takeovers, "producers": producers, "consumers": 2, "window": window,
            **ledger, "errors": [repr(e) for e in load.errors],
            "resent": sum(e.resent for e in load.events),
            "producer_msgs_s": round(ledger["receipted"] / elapsed),
            "takeover_listening_s_median": round(statistics.median(times), 3) if times else None,
            "takeover_listening_s_max": round(max(times), 3) if times else None}


def baseline(flavor: Flavor, base: Path, producers: int, window: int, seconds: float,
             lock: Path | None) -> Row:
    """The same load without kills (a lone master), for the throughput comparison."""
    with quiet(lock):
        load_1m = load_average()
        data = Path(tempfile.mkdtemp(prefix=f"{flavor.name}-base-", dir=base)) / "store"
        node = flavor.make(data, 0.5)
        node.start()
        try:
            node.wait(flavor.listen)
            load = Load(failover_url([node]), producers, window, consumers=2)
            load.start()
            started = time.perf_counter()
            time.sleep(seconds)  # the measurement interval itself
            load.finish()
            elapsed = time.perf_counter() - started
        finally:
            node.stop()
    return {"broker": flavor.name, "scenario": "baseline", "load_1m": load_1m,
            "producers": producers, "window": window,
            "producer_msgs_s": round(load.receipted_count() / elapsed)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", default="sluice,activemq")
    parser.add_argument("--backlog", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5, help="takeovers per store")
    parser.add_argument("--takeovers", type=int, default=50)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--window", type=int, default=8)
    parser.add_argument("--settle", type=float, default=2.0,
                        help="thousands of receipts between two kills")
    parser.add_argument("--baseline-seconds", type=float, default=20.0)
    parser.add_argument("--lock-retry", type=float, default=0.5)
    parser.add_argument("--skip", default="",
                        help="comma list: takeover,handover,backlog,loop,baseline")
    parser.add_argument("--quiet-lock", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    opts = parser.parse_args(argv)
    # SIGTERM (a `timeout` around the run) unwinds through the scenarios' finally blocks,
    # which stop the brokers this run started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    skip = set(filter(None, opts.skip.split(",")))
    names = [n for n in opts.brokers.split(",") if n]
    if "activemq" in names and not amq_pair.available():
        parser.error("ActiveMQ is not installed (apt-get install activemq)")
    base = Path(tempfile.mkdtemp(prefix="sluice-failover-"))
    lock = opts.quiet_lock

    def report(row: Row) -> None:
        print(json.dumps(row), flush=True)
        if opts.json is not None:
            with opts.json.open("a") as fh:
                fh.write(json.dumps(row) + "\n")

    def scenarios(flavor: Flavor) -> Iterator[tuple[str, Callable[[], Row]]]:
        yield "takeover", lambda: takeover(flavor, base, 0, opts.repeat, opts.lock_retry, lock)
        yield "handover", lambda: takeover(flavor, base, 0, opts.repeat, opts.lock_retry,
                                           lock, clean=True)
        if opts.backlog:
            yield "backlog", lambda: takeover(flavor, base, opts.backlog, opts.repeat,
                                              opts.lock_retry, lock)
        yield "loop", lambda: loop(flavor, base, opts.takeovers, opts.producers, opts.window,
                                   opts.lock_retry, opts.settle, lock)
        yield "baseline", lambda: baseline(flavor, base, opts.producers, opts.window,
                                           opts.baseline_seconds, lock)

    failed = 0
    for name in names:
        flavor = FLAVORS[name]
        for scenario, run in scenarios(flavor):
            if scenario in skip:
                continue
            try:  # one broker's failure must not cost the other's figures
                report(run())
            except Exception as exc:
                failed += 1
                report({"broker": name, "scenario": scenario, "error": repr(exc)[:2000]})
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
