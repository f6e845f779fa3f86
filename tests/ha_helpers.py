"""Brokers sharing one data directory (master/standby) for the HA and failover specs."""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

from sluice_testing import BrokerProcess

STANDBY_RE = re.compile(r"sluice: standby: .* is held by pid (\d+)")
RETRY_RE = re.compile(r"lock still held; retrying")
TAKEOVER_RE = re.compile(r"taking over as master")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
        for b in self.brokers:
            if b.proc is not None:
                b.kill()


def wait_lines(broker: BrokerProcess, pattern: re.Pattern[str], count: int,
               timeout: float = 20.0) -> None:
    """Wait until the broker's output has ``count`` lines matching ``pattern``."""
    deadline = time.monotonic() + timeout
    while sum(1 for line in list(broker.output) if pattern.search(line)) < count:
        if time.monotonic() > deadline or (broker.proc and broker.proc.poll() is not None):
            raise AssertionError(f"no {count} lines like {pattern.pattern!r}:\n" + broker.log())
        broker.listening.wait(0.02)  # woken early by nothing else; just paces the re-check


def first_listening(*brokers: BrokerProcess, timeout: float = 30.0) -> BrokerProcess:
    """The broker that printed its `listening on` line first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for b in brokers:
            if b.listening.wait(0.02):
                return b
    raise AssertionError("no standby took over:\n" + "".join(b.log() for b in brokers))


