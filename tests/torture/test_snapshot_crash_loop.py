"""Spec: kill -9 at random moments with frequent index snapshots (taken while producers and
consumers run, then a restart from snapshot + journal tail each cycle) loses no receipted
message and corrupts none. Small segments make reclaim and compaction happen between
snapshots too.

Each kill waits, after its random up time, until that run has renamed a new snapshot into
place (the file's generation changed): on a loaded machine a short run may otherwise end
before its first checkpoint tick writes one, and the next start would scan the journal
instead. So every restart must use one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torture_engine import run

from sluice_testing import eventually
from sluicemq.storage.snapshot import FILE_NAME

CONFIG = """
[journal]
segment_bytes = 1048576
snapshot_records = 50
store_delay_ms = 0
"""
# store_delay_ms = 0: every message is written, so the journal grows enough between restarts
# for periodic snapshots; test_crash_loop.py runs the same loop with concurrent store and
# dispatch on (messages its consumers acknowledge in time are never written).
CYCLES = 8
SNAPSHOT_WAIT = 60.0  # seconds a run may take to write its first snapshot (a failing spec's bound)


def generation(path: Path) -> tuple[int, int, int] | None:
    """Which snapshot file is in place: each is written aside and renamed over the last."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_ctime_ns, st.st_size


def test_receipted_messages_survive_kill_9_after_periodic_snapshots(broker_factory: Any,
                                                                   tmp_path: Path) -> None:
    broker = broker_factory(["--console-port", "off", "--ws-port", "off"], config_text=CONFIG)
    path = broker.data_dir / "journal" / FILE_NAME
    found = [generation(path)]  # the file each run started with

    def snapshot_written(cycle: int) -> None:
        eventually(lambda: generation(path) != found[-1],
                   f"run {cycle} wrote no index snapshot", SNAPSHOT_WAIT)

    verdict = run(broker, tmp_path, cycles=CYCLES, min_up=1.2, max_up=2.5, seed=11,
                  drain_timeout=60, before_kill=snapshot_written,
                  on_cycle=lambda _cycle: found.append(generation(path)))
    print(verdict.summary())
    log = broker.log()
    assert verdict.receipted > 50, verdict.summary()
    assert verdict.corrupt == 0, verdict.summary()
    assert verdict.lost == [], verdict.summary()
    assert log.count("index snapshot used") == CYCLES, "every restart used a snapshot"
    assert "index snapshot ignored" not in log
    assert "internal error" not in log and "Traceback" not in log
