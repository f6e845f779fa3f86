"""What a planning process loads: Spark starts a fresh Python process to plan every streaming
query (offsets, partitions, commits), and its start is on the query's critical path - an
availableNow query of a million messages takes ~3.5 s, of which importing numpy (~85 ms) and
pyarrow (~150 ms) would be pure waiting. Only executors, which turn column batches into Arrow
record batches, need them."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("numpy", "pyarrow", "pandas", "difflib")


def test_the_data_source_and_its_readers_import_without_numpy_or_pyarrow() -> None:
    probe = ("import sys\n"
             "import sluicemq.spark.datasource, sluicemq.spark.stream_reader, "
             "sluicemq.spark.reader, sluicemq.spark.writer\n"
             f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
