"""Spec of how compare.py --rounds merges a broker's rounds into the table's figures.

Run with `.venv/bin/python -m pytest bench/test_compare.py` (bench/ is outside testpaths).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import over_rounds, parse_args, table


def test_rounds_give_the_median_of_each_figure_and_keep_every_run() -> None:
    turns = [{"broker": "sluice", "name": "e2e", "msgs_per_s": v, "latency_p99_ms": p,
              "cpu_probe_ms": [8.0, 9.0], "runs": [{"msgs_per_s": v}]}
             for v, p in ((60_000, 80.0), (95_000, 55.5), (90_000, 60.0))]
    turns[1]["only_here"] = 1  # a figure not every round has is left out
    merged = over_rounds(turns)
    assert merged["msgs_per_s"] == 90_000 and merged["latency_p99_ms"] == 60.0
    assert "only_here" not in merged
    assert merged["broker"] == "sluice" and merged["name"] == "e2e" and merged["rounds"] == 3
    assert [r["msgs_per_s"] for r in merged["runs"]] == [60_000, 95_000, 90_000]
    # the table shows the merged record: the last one of its broker and scenario
    assert "| 90,000 |" in table([*turns, merged], ["sluice"])


def test_each_round_runs_a_scenario_as_often_as_a_comparison_without_rounds() -> None:
    assert parse_args(["--rounds", "3"]).repeat == parse_args([]).repeat == 3
    assert parse_args([]).rounds == 1
