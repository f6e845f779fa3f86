"""Generate order CSV files for the pipeline example.

    python examples/csv_pipeline/make_orders.py OUT_DIR --files 4 --rows 100000

Columns: order_id, region, product, quantity, unit_price, ts. Deterministic per seed, so two
runs produce the same files (and the same totals to check the pipeline against).
"""

from __future__ import annotations

import argparse
import csv
import random
from pathlib import Path

REGIONS = ("emea", "amer", "apac", "latam")
PRODUCTS = tuple(f"sku-{i:03d}" for i in range(50))


def write_file(path: Path, rows: int, rng: random.Random, first_id: int) -> None:
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(("order_id", "region", "product", "quantity", "unit_price", "ts"))
        for i in range(rows):
            out.writerow((first_id + i, rng.choice(REGIONS), rng.choice(PRODUCTS),
                          rng.randint(1, 20), f"{rng.uniform(1, 500):.2f}",
                          1_760_000_000 + first_id + i))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--files", type=int, default=4)
    p.add_argument("--rows", type=int, default=100_000, help="rows per file")
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    for n in range(args.files):
        path = args.out / f"orders-{n:04d}.csv"
        write_file(path, args.rows, rng, n * args.rows)
        print(f"{path} {path.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
