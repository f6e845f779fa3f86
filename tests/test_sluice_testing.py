"""The test harness's own promises: brokers of parallel workers and runs never fight for a port,
and a spec reading the broker's log never misses a line the process already wrote."""

from __future__ import annotations

import itertools
import signal
import socket
import time
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


def test_a_line_printed_later_is_waited_for_and_an_exit_leaves_the_whole_log(
        tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        mark = broker.mark()
        assert broker.proc is not None
        broker.proc.send_signal(signal.SIGTERM)  # its goodbye line comes after this returns
        assert "sluice: stopped" in broker.wait_for_log("sluice: stopped", since=mark)
        assert broker.wait_exit() == 0
        assert broker.read_all.is_set()  # read to EOF: nothing the process wrote is missing
        assert broker.log(since=mark).endswith(broker.output[-1])
        began = time.monotonic()
        with pytest.raises(AssertionError, match="output ended"):
            broker.wait_for_log("never printed", timeout=60)  # cannot come any more
        assert time.monotonic() - began < 5
    finally:
        broker.stop()


def test_stop_and_kill_read_the_output_to_its_end(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        assert broker.stop() == 0
        assert broker.read_all.is_set() and "sluice: stopped" in broker.log()
        mark = broker.mark()
        broker.restart()
        assert "sluice: stopped" not in broker.log(since=mark)  # none trails in
        broker.kill()
        assert broker.read_all.is_set()
    finally:
        broker.stop()
