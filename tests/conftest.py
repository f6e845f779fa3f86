"""Shared fixtures: a real `sluice broker` process on an ephemeral loopback port."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

# The suite tests the checkout it lives in, whichever environment runs it (a second git
# worktree may borrow another checkout's virtualenv): this src first, here and in every broker
# or Spark worker process a test starts.
_SRC = str(Path(__file__).resolve().parents[1] / "src")
sys.path.insert(0, _SRC)
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (_SRC, os.environ.get("PYTHONPATH")) if p)

import pytest  # noqa: E402

from sluice_testing import BrokerProcess, RawStomp  # noqa: E402

__all__ = ["BrokerProcess", "RawStomp"]


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator:
    """Make brokers with custom args/config; all are killed at teardown."""
    made: list[BrokerProcess] = []

    def make(extra_args: list[str] | None = None, config_text: str | None = None,
             name: str = "data") -> BrokerProcess:
        b = BrokerProcess(tmp_path / name, extra_args, config_text)
        made.append(b)
        return b.start()

    yield make
    for b in made:
        b.kill()


@pytest.fixture
def broker(broker_factory) -> BrokerProcess:
    """A fresh broker with its own data dir."""
    return broker_factory()


@pytest.fixture
def raw(broker):
    """Factory of raw STOMP connections to the `broker` fixture; closed at teardown."""
    conns: list[RawStomp] = []

    def make(target: BrokerProcess | None = None) -> RawStomp:
        b = target or broker
        c = RawStomp(b.host, b.port)
        conns.append(c)
        return c

    yield make
    for c in conns:
        c.close()
