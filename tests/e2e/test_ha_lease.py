"""The lease lock (`[ha] lock = "lease"`), for file systems whose locks cannot be trusted.

The master renews a lease record; a standby takes over only once it expired, and a master that
could not renew in time (here: paused with SIGSTOP while a standby took over) ends itself
before writing anything to the journal the new master owns.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from ha_helpers import RETRY_RE, Cluster, wait_lines
from sluice_testing import RawStomp, eventually
from sluicemq import Client
from sluicemq.storage.lease import FENCED_EXIT

LEASE = '[ha]\nlock = "lease"\nlease_seconds = 2.0\nlease_renew = 0.4\n'


@pytest.fixture
def cluster(tmp_path: Path):
    c = Cluster(tmp_path / "shared", LEASE)
    yield c
    for b in c.brokers:  # a paused broker must be resumed to die
        if b.proc is not None and b.proc.poll() is None:
            os.kill(b.pid, signal.SIGCONT)
    c.close()


def test_a_standby_waits_while_the_lease_is_renewed_and_takes_over_after_kill_9(
        cluster) -> None:
    master = cluster.master()
    standby = cluster.standby()
    with Client(master.url) as c:
        for i in range(10):
            c.send("/queue/lease", f"m{i}")
    wait_lines(standby, RETRY_RE, 80)  # 4 s of refused attempts: two lease durations
    assert not standby.listening.is_set()
    master.kill()
    standby.wait_listening()
    assert "taking over" in standby.log()
    with Client(standby.url) as c, c.subscribe("/queue/lease") as sub:
        assert [sub.get(timeout=10).text() for _ in range(10)] == [f"m{i}" for i in range(10)]


def test_a_paused_master_that_lost_its_lease_stops_without_writing(cluster) -> None:
    master = cluster.master()
    with Client(master.url) as c:
        c.send("/queue/fence", "before")
    late = RawStomp("127.0.0.1", master.port)
    late.connect()
    os.kill(master.pid, signal.SIGSTOP)
    standby = cluster.standby()
    standby.wait_listening()  # the lease expired while the master was paused
    # The paused master's socket still accepts bytes: a SEND it would journal on waking.
    late.send("SEND", {"destination": "/queue/fence", "persistent": "true", "receipt": "r1"},
              b"written by a fenced master?")
    os.kill(master.pid, signal.SIGCONT)
    assert master.wait_exit(30) == FENCED_EXIT
    assert "stopping without writing" in master.log()
    with pytest.raises(ConnectionError):  # closed with no RECEIPT: the SEND was not stored
        frame = late.recv(30)
        pytest.fail(f"the fenced master answered {frame.command}")
    with Client(standby.url) as c:
        c.send("/queue/fence", "after")
        with c.subscribe("/queue/fence") as sub:
            assert [sub.get(timeout=10).text() for _ in range(2)] == ["before", "after"]
        assert c.head("/queue/fence").count == 0
    assert standby.stop() == 0  # its files stay still while they are read (a .tmp renamed)
    stored = b"".join(p.read_bytes() for p in cluster.data_dir.rglob("*") if p.is_file())
    assert b"written by a fenced master?" not in stored  # not a byte of it in the journal


def test_a_master_that_finds_its_lease_taken_stops_at_once(cluster) -> None:
    """A standby whose clock ran ahead (or an operator) claimed the lease: at its next
    renewal the master sees another owner in the record and ends before writing again."""
    master = cluster.master()
    with Client(master.url) as c:
        c.send("/queue/fence", "kept")
    lease = cluster.data_dir / "lease"
    record = json.loads(lease.read_text())
    record.update(owner="intruder", generation=record["generation"] + 1, pid=1,
                  expires=record["expires"] + 3600)
    claim = json.dumps(record)
    lease.write_text(claim)

    def fenced() -> bool:
        """A renewal already past its owner check renames its own record over the claim
        (its fsync is slow on a busy machine): the claim is made again until it is read."""
        if master.proc is not None and master.proc.poll() is not None:
            return True
        if '"intruder"' not in lease.read_text():
            lease.write_text(claim)
        return False

    eventually(fenced, "the master read the claim and ended", timeout=30)
    assert master.wait_exit(30) == FENCED_EXIT
    assert "was taken by another broker" in master.log()
