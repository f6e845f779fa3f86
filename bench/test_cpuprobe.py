"""Spec of the vCPU speed probe that compare.py records before each scenario.

Run with `.venv/bin/python -m pytest bench/test_cpuprobe.py` (bench/ is outside testpaths).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpuprobe import probe


def test_one_positive_time_per_allowed_vcpu() -> None:
    times = probe(loops=1000)
    assert len(times) == len(os.sched_getaffinity(0))
    assert all(t > 0 for t in times)


def test_the_caller_may_run_where_it_could_before() -> None:
    """Children started after a probe inherit the affinity they would have had anyway."""
    before = os.sched_getaffinity(0)
    probe(loops=1000)
    assert os.sched_getaffinity(0) == before
