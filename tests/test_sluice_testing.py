"""The test harness's own promises: brokers of parallel workers and runs never fight for a port."""

from __future__ import annotations

import itertools
import socket
from pathlib import Path

import pytest

from sluice_testing import BrokerProcess, RawStomp, _worker_slice


def test_each_xdist_worker_picks_ports_from_its_own_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    slices = []
    for i in range(4):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{i}")
        slices.append(_worker_slice())
    for (low_a, high_a), (low_b, _) in itertools.pairwise(slices):
        assert low_a <= high_a < low_b


def test_a_first_start_whose_port_was_taken_meanwhile_moves_to_new_ports(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data")
    taken = broker.port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        broker.start()
        try:
            assert broker.port != taken
            conn = RawStomp(broker.host, broker.port)
            assert conn.connect().command == "CONNECTED"
            conn.close()
            broker.kill()
            broker.restart()
            assert broker.port != taken
        finally:
            broker.stop()
