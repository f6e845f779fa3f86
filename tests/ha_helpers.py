"""Brokers sharing one data directory (master/standby) for the HA and failover specs."""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from pathlib import Path

from sluice_testing import BrokerProcess, reserve_port
from sluicemq import Client, Message
from sluicemq.client.failover import AckInDoubt

STANDBY_RE = re.compile(r"sluice: standby: .* is held by pid (\d+)")
RETRY_RE = re.compile(r"lock still held; retrying")
TAKEOVER_RE = re.compile(r"taking over as master")


def free_port() -> int:
    """A port a broker of the cluster binds later (see ``reserve_port``)."""
    return reserve_port()


class Cluster:
    """Broker processes on one data directory, each on fixed ports known in advance."""

    def __init__(self, data_dir: Path, config_text: str | None = None) -> None:
        self.data_dir = data_dir
        self.config_text = config_text
        self.brokers: list[BrokerProcess] = []

    def master(self, *args: str) -> BrokerProcess:
        b = self._make(*args)
        b.start()
        return b

    def standby(self, *args: str) -> BrokerProcess:
        b = self._make("--lock-retry", "0.05", "--log-level", "debug", *args)
        b.start(ready=STANDBY_RE)
        return b

    def _make(self, *args: str) -> BrokerProcess:
        b = BrokerProcess(self.data_dir, list(args), self.config_text)
        b.port, b.console_port, b.ws_port = free_port(), free_port(), "off"
        self.brokers.append(b)
        return b

    def close(self) -> None:
        """Kill every broker; their logs go to the captured output, which pytest shows when
        the spec failed (who held the lock, whether the standby took over and when)."""
        for i, b in enumerate(self.brokers):
            if b.proc is not None:
                b.kill()
                print(f"--- broker {i} (pid {b.proc.pid}, port {b.port}) ---\n{b.log()[-6000:]}")


def wait_lines(broker: BrokerProcess, pattern: re.Pattern[str], count: int,
               timeout: float = 20.0) -> None:
    """Wait until the broker's output has ``count`` lines matching ``pattern``."""
    broker.wait_for_log(pattern, timeout, count=count)


def first_listening(*brokers: BrokerProcess, timeout: float = 120.0) -> BrokerProcess:
    """The broker that printed its `listening on` line first.

    A takeover replays the journal, which on a busy machine (Spark JVMs, other workers) can
    take a while: the bound is generous, and a standby that exited (say it could not bind)
    fails the wait at once with its log.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for b in brokers:
            if b.listening.wait(0.02):
                return b
        if all(b.proc is not None and b.proc.poll() is not None for b in brokers):
            break
    raise AssertionError("no standby took over:\n" + "".join(b.log() for b in brokers))


def failover_url(*brokers: BrokerProcess) -> str:
    inner = ",".join(b.url for b in brokers)
    return f"failover:({inner})?randomize=false&initialReconnectDelay=20&maxReconnectDelay=200"


class Ledger:
    """What producers had receipted and what consumers had confirmed, per message body.

    ``in_doubt``: ACKs that a failover left unconfirmed (`AckInDoubt`): either the old master
    stored them, or the message came back and a later confirmed ACK counts it.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.receipted: list[str] = []
        self.consumed: Counter[str] = Counter()
        self.in_doubt: set[str] = set()

    def receipt(self, body: str) -> None:
        with self.lock:
            self.receipted.append(body)

    def ack(self, msg: Message) -> None:
        """Acknowledge with a receipt and book the outcome."""
        try:
            msg.ack(receipt=True)
        except AckInDoubt:
            with self.lock:
                self.in_doubt.add(msg.text())
            return
        with self.lock:
            self.consumed[msg.text()] += 1

    def drain(self, url: str, destination: str) -> None:
        """Take what is left on the broker, each confirmed; then nothing may remain."""
        with Client(url) as c:
            rest = c.head(destination).count
            with c.subscribe(destination, ack="client-individual") as sub:
                for _ in range(rest):
                    msg = sub.get(timeout=10)
                    assert msg is not None
                    self.ack(msg)
            assert c.head(destination).count == 0

    def lost(self) -> set[str]:
        return set(self.receipted) - set(self.consumed) - self.in_doubt

    def duplicated(self) -> set[str]:
        return {body for body, n in self.consumed.items() if n > 1}
