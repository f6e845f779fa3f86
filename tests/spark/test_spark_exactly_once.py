"""Exactly-once through a driver crash: kill -9 the Spark driver (and its JVM) while a
micro-batch is between its read and its commit (held there by a gate in the driver, so the
crash lands in the batch for certain), restart it from the checkpoint, and every message must
come out exactly once — in Spark's file sink and in our own sink.

Each spec runs Spark driver processes of its own (spark_driver.py: 4 micro-batches of 100);
they are one xdist group, so only one of those JVMs runs at a time.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from spark_driver import PER_BATCH

from sluice_testing import stored
from sluicemq.client import Client

pytestmark = pytest.mark.xdist_group("spark-drivers")

DRIVER = Path(__file__).with_name("spark_driver.py")
TOTAL = 400
BATCHES = TOTAL // PER_BATCH


class Gate:
    """Holds a driver's micro-batch ``batch`` between its read and its commit, until
    ``release`` (spark_driver.py: a task waits on FIFOs under ``tmp/gate``)."""

    def __init__(self, tmp: Path, batch: int) -> None:
        self.dir = tmp / "gate"
        self.dir.mkdir()
        os.mkfifo(self.dir / "held")
        os.mkfifo(self.dir / "release")
        self.args = [str(self.dir), str(batch * PER_BATCH)]  # the batch's first message
        # open before the driver starts: the held task's signal needs a reader to go to
        self._held = os.open(self.dir / "held", os.O_RDONLY | os.O_NONBLOCK)

    def wait(self, proc: subprocess.Popen) -> None:
        """Until a task of the batch is held; fails if the driver ends first."""
        deadline = time.monotonic() + 240  # JVM start and first query: slow on a busy machine
        while not select.select([self._held], [], [], 1.0)[0]:
            if proc.poll() is not None:
                pytest.fail(f"driver ended before the kill: {proc.stdout.read()[-3000:]}")
            if time.monotonic() > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
                pytest.fail("no batch was ever held")
        assert os.read(self._held, 64) == b"held\n"

    def release(self) -> None:
        """Let the held task go on (nothing to do once its driver was killed)."""
        with contextlib.suppress(OSError):  # no reader: the held task is gone
            os.close(os.open(self.dir / "release", os.O_WRONLY | os.O_NONBLOCK))
        os.close(self._held)


def start_driver(broker, sink: str, out: str, tmp: Path,
                 gate: Gate | None = None) -> subprocess.Popen:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    return subprocess.Popen(
        [sys.executable, str(DRIVER), broker.url, "/queue/source", sink, out,
         str(tmp / "checkpoint"), str(tmp), *(gate.args if gate is not None else [])],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        start_new_session=True)  # its own process group: the JVM dies with it


def batch_in_flight(checkpoint: Path) -> tuple[int, int]:
    """(batches planned, batches committed) as the checkpoint records them."""
    def count(sub: str) -> int:
        d = checkpoint / sub
        return len([p for p in d.iterdir() if p.name.isdigit()]) if d.exists() else 0
    return count("offsets"), count("commits")


def wait_mid_batch(proc: subprocess.Popen, checkpoint: Path, gate: Gate) -> int:
    """Wait until the gate holds its batch, planned but not committed (the checkpoint's
    offsets and commits logs say so); returns how many batches were committed then."""
    gate.wait(proc)
    planned, committed = batch_in_flight(checkpoint)
    assert planned > committed, (planned, committed)
    return committed


def kill_mid_batch(proc: subprocess.Popen, checkpoint: Path, gate: Gate) -> int:
    """kill -9 the driver (and its JVM) while the gate holds its batch."""
    committed = wait_mid_batch(proc, checkpoint, gate)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    gate.release()
    return committed


def finish(proc: subprocess.Popen) -> None:
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0 and "driver: done" in out, out[-3000:]


@pytest.fixture
def source(broker) -> list[str]:
    bodies = [f"event-{i}" for i in range(TOTAL)]
    with Client(broker.url) as c:
        for r in [c.send_async("/queue/source", b) for b in bodies]:
            r.result(10)
    return bodies


@pytest.mark.slow
@pytest.mark.parametrize("sink", ["files", "sluice"])
def test_kill_9_of_the_driver_between_read_and_commit(broker, source, tmp_path, sink):
    out = str(tmp_path / "out") if sink == "files" else "/queue/sink"
    first = start_driver(broker, sink, out, tmp_path, gate := Gate(tmp_path, batch=1))
    committed = kill_mid_batch(first, tmp_path / "checkpoint", gate)
    assert 1 <= committed < BATCHES  # it really died mid-stream

    finish(start_driver(broker, sink, out, tmp_path))

    if sink == "files":
        rows = [json.loads(line) for f in Path(out).glob("part-*.json")
                for line in f.read_text().splitlines()]
        # Files of the killed batch may exist on disk; Spark's metadata log excludes them
        # (the restarted driver read the sink back with Spark).
        bodies = sorted(json.loads((tmp_path / "read-back.json").read_text()))
        assert len(rows) >= len(bodies)
    else:
        bodies = sorted(stored(broker.url, "/queue/sink"))
    assert bodies == sorted(source), (
        f"lost {len(set(source) - set(bodies))}, duplicated {len(bodies) - len(set(bodies))}")


@pytest.mark.slow
def test_kill_9_of_the_broker_mid_query(broker, source, tmp_path):
    """The broker dies under a running query (column-batch reads, Arrow sink, publication
    tokens) while a batch is in flight: the query fails or finishes, a restart from its
    checkpoint completes it, and the sink holds every source message exactly once."""
    first = start_driver(broker, "sluice", "/queue/sink", tmp_path, gate := Gate(tmp_path, 1))
    wait_mid_batch(first, tmp_path / "checkpoint", gate)
    broker.kill()
    gate.release()  # the batch goes on against a broker that is gone
    broker.restart()
    first.communicate(timeout=300)  # failed (broker gone mid-batch) or finished: both fine
    finish(start_driver(broker, "sluice", "/queue/sink", tmp_path))
    bodies = stored(broker.url, "/queue/sink")
    assert sorted(bodies) == sorted(source), (
        f"lost {len(set(source) - set(bodies))}, duplicated {len(bodies) - len(set(bodies))}")
