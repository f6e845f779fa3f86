"""Print what the pipeline wrote: revenue, orders and units per region over every batch.

    python examples/csv_pipeline/show.py pipeline-work

Reads WORK/revenue (one Parquet directory per micro-batch) with pyarrow alone: no Spark and no
pandas needed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow.parquet as pq


def totals(work: Path) -> list[dict]:
    """One row per region, sums over every batch and product, largest revenue first."""
    table = pq.read_table(work / "revenue")
    summed = table.group_by("region").aggregate(
        [("revenue", "sum"), ("orders", "sum"), ("units", "sum")])
    rows = [{"region": r["region"], "revenue": r["revenue_sum"], "orders": r["orders_sum"],
             "units": r["units_sum"]} for r in summed.to_pylist()]
    return sorted(rows, key=lambda r: r["revenue"], reverse=True)


def main(argv: list[str]) -> int:
    work = Path(argv[0] if argv else "pipeline-work")
    if not (work / "revenue").is_dir():
        print(f"show: no {work / 'revenue'} yet: run pipeline.py first", file=sys.stderr)
        return 1
    rows = totals(work)
    print(f"{'region':<8} {'revenue':>16} {'orders':>10} {'units':>10}")
    for r in rows:
        print(f"{r['region']:<8} {r['revenue']:>16} {r['orders']:>10} {r['units']:>10}")
    print(f"{'total':<8} {sum(r['revenue'] for r in rows):>16} "
          f"{sum(r['orders'] for r in rows):>10} {sum(r['units'] for r in rows):>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
