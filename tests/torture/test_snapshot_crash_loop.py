"""Spec: kill -9 at random moments with frequent index snapshots (taken while producers and
consumers run, then a restart from snapshot + journal tail each cycle) loses no receipted
message and corrupts none. Small segments make reclaim and compaction happen between
snapshots too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torture_engine import run

CONFIG = """
[journal]
segment_bytes = 1048576
snapshot_records = 50
store_delay_ms = 0
"""
# store_delay_ms = 0: every message is written, so the journal grows enough between restarts
# for periodic snapshots; test_crash_loop.py runs the same loop with concurrent store and
# dispatch on (messages its consumers acknowledge in time are never written).


def test_receipted_messages_survive_kill_9_after_periodic_snapshots(broker_factory: Any,
                                                                   tmp_path: Path) -> None:
    broker = broker_factory(["--console-port", "off", "--ws-port", "off"], config_text=CONFIG)
    verdict = run(broker, tmp_path, cycles=8, min_up=1.2, max_up=2.5, seed=11,
                  drain_timeout=30)
    print(verdict.summary())
    log = broker.log()
    assert verdict.receipted > 50, verdict.summary()
    assert verdict.corrupt == 0, verdict.summary()
    assert verdict.lost == [], verdict.summary()
    assert log.count("index snapshot used") >= 7, "restarts (but maybe the first) used one"
    assert "index snapshot ignored" not in log
    assert "internal error" not in log and "Traceback" not in log
