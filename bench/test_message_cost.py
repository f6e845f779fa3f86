"""Spec of the in-process per-message cost harness (bench/message_cost.py).

Run with `.venv/bin/python -m pytest bench/test_message_cost.py` (bench/ is outside testpaths).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from message_cost import run, run_persistent


def test_every_message_sent_is_delivered_and_costs_some_cpu() -> None:
    """``run`` returns only once the consumer got all of them (else it waits, bounded)."""
    assert run(300) > 0


def test_every_persistent_send_is_receipted_and_costs_some_cpu() -> None:
    """``run_persistent`` returns only once every SEND's receipt came back (each one durable),
    including a count the 8 producers do not share evenly."""
    assert run_persistent(301) > 0
