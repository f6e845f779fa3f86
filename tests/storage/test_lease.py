"""Spec of the lease on a data directory (``storage/lease.py``), on the real file system: a
standby takes over only an expired lease, a renewal that lands too late gives the lease up
instead of trusting it, and a fenced master's late write does not stop the new master.

The renewal threads are not started here: each spec drives ``renew_once`` itself, so the
interleavings that a stalled renewal thread meets in production are written out step by step.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from sluicemq.storage.lease import LEASE_NAME, LeaseLock


def record(data_dir: Path) -> dict[str, object]:
    return json.loads((data_dir / LEASE_NAME).read_text())


def acquired(data_dir: Path) -> LeaseLock:
    """A lease taken without its renewal thread (the spec renews by hand)."""
    lease = LeaseLock(data_dir, duration=10.0, renew=2.0)
    lease._stop.set()  # the thread started by try_acquire ends at its first wait
    assert lease.try_acquire()
    return lease


def expire(lease: LeaseLock) -> None:
    """What a master that stopped renewing leaves: its record past its expiry."""
    lease._write(expires=time.time() - 1)


def test_a_standby_cannot_take_a_lease_that_is_renewed(tmp_path: Path) -> None:
    master = acquired(tmp_path)
    assert master.renew_once()
    standby = LeaseLock(tmp_path)
    assert not standby.try_acquire()
    assert record(tmp_path)["owner"] == master.owner


def test_a_renewal_landing_after_the_lease_expired_gives_it_up(tmp_path: Path) -> None:
    master = acquired(tmp_path)
    valid_until = master._valid_until
    # The renewal thread passed its owner check, then stalled (a slow fsync, a pause) until
    # the lease it was renewing had expired: a standby may have taken over meanwhile.
    master._expires = time.time() - 1
    assert not master.renew_once()
    assert master._valid_until == valid_until  # not trusted any longer than before


def test_a_late_renewal_over_the_new_masters_record_does_not_stop_the_new_master(
        tmp_path: Path) -> None:
    old = acquired(tmp_path)
    expire(old)
    new = LeaseLock(tmp_path, duration=10.0, renew=2.0)
    new._stop.set()
    assert new.try_acquire()
    assert new.generation == old.generation + 1
    # The old master's stalled renewal lands now, over the new master's record ...
    old._expires = time.time() - 1
    assert not old._write(renewal=True)  # ... and the old master gives the lease up,
    assert record(tmp_path)["owner"] == old.owner
    assert new.renew_once()  # while the new one writes its record again and carries on.
    assert record(tmp_path)["owner"] == new.owner
    assert record(tmp_path)["generation"] == new.generation


def test_a_master_whose_lease_a_newer_generation_took_gives_it_up(tmp_path: Path) -> None:
    old = acquired(tmp_path)
    expire(old)
    new = LeaseLock(tmp_path)
    new._stop.set()
    assert new.try_acquire()
    assert not old.renew_once()
    assert record(tmp_path)["owner"] == new.owner  # the old master wrote nothing
