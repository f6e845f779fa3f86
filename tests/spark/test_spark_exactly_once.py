"""Exactly-once through a driver crash: kill -9 the Spark driver (and its JVM) while a
micro-batch is between its read and its commit, restart it from the checkpoint, and every
message must come out exactly once — in Spark's file sink and in our own sink.

Each spec runs Spark driver processes of its own (spark_driver.py: 4 micro-batches of 100);
they are one xdist group, so only one of those JVMs runs at a time.
"""

from __future__ import annotations

import json
import os
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


def start_driver(broker, sink: str, out: str, tmp: Path) -> subprocess.Popen:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    return subprocess.Popen(
        [sys.executable, str(DRIVER), broker.url, "/queue/source", sink, out,
         str(tmp / "checkpoint"), str(tmp)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        start_new_session=True)  # its own process group: the JVM dies with it


def batch_in_flight(checkpoint: Path) -> tuple[int, int]:
    """(batches planned, batches committed) as the checkpoint records them."""
    def count(sub: str) -> int:
        d = checkpoint / sub
        return len([p for p in d.iterdir() if p.name.isdigit()]) if d.exists() else 0
    return count("offsets"), count("commits")


def wait_mid_batch(proc: subprocess.Popen, checkpoint: Path, after: int) -> int:
    """Wait until batch `after` or later is planned but not committed (the checkpoint's
    offsets and commits logs say so); returns how many batches were committed then."""
    deadline = time.monotonic() + 240  # JVM start and first query: slow on a busy machine
    while time.monotonic() < deadline:
        planned, committed = batch_in_flight(checkpoint)
        if committed >= after and planned > committed:
            return committed
        if proc.poll() is not None:
            pytest.fail(f"driver ended before the kill: {proc.stdout.read()[-3000:]}")
        time.sleep(0.005)  # pacing: the driver writes no other signal we could wait on
    os.killpg(proc.pid, signal.SIGKILL)
    pytest.fail("no batch was ever in flight")


def kill_mid_batch(proc: subprocess.Popen, checkpoint: Path, after: int) -> int:
    """kill -9 the driver (and its JVM) while batch `after` or later is in flight."""
    committed = wait_mid_batch(proc, checkpoint, after)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
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
    first = start_driver(broker, sink, out, tmp_path)
    committed = kill_mid_batch(first, tmp_path / "checkpoint", after=1)
    assert committed < BATCHES  # it really died mid-stream

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
    first = start_driver(broker, "sluice", "/queue/sink", tmp_path)
    wait_mid_batch(first, tmp_path / "checkpoint", after=1)
    broker.kill()
    broker.restart()
    first.communicate(timeout=300)  # failed (broker gone mid-batch) or finished: both fine
    finish(start_driver(broker, "sluice", "/queue/sink", tmp_path))
    bodies = stored(broker.url, "/queue/sink")
    assert sorted(bodies) == sorted(source), (
        f"lost {len(set(source) - set(bodies))}, duplicated {len(bodies) - len(set(bodies))}")
