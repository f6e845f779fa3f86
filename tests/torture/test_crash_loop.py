"""Spec: kill -9 at random moments loses no receipted message and corrupts none.

The short CI version of bench/torture.py: a handful of cycles with three producers and two
consumers on two queues; the independent ledger decides (see torture_engine.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torture_engine import run


def test_receipted_messages_survive_repeated_kill_9(broker_factory: Any, tmp_path: Path) -> None:
    broker = broker_factory(["--console-port", "off", "--ws-port", "off"])
    verdict = run(broker, tmp_path, cycles=6, min_up=0.5, max_up=1.5, seed=7,
                  drain_timeout=30)
    print(verdict.summary())
    assert verdict.receipted > 50, verdict.summary()  # the run did real work
    assert verdict.corrupt == 0, verdict.summary()
    assert verdict.lost == [], verdict.summary()
    assert verdict.after_ack == 0, verdict.summary()  # none back after a receipted ACK
    assert "internal error" not in broker.log()
