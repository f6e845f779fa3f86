"""The examples/csv_pipeline job, run for real: CSV files sent as streams come out as correct
Parquet aggregates, and a second run over the same checkpoint adds only the new file."""

from __future__ import annotations

import csv
import importlib.util
import random
import sys
from decimal import Decimal
from pathlib import Path

from sluicemq.client import Client

EXAMPLE = Path(__file__).parents[2] / "examples" / "csv_pipeline"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def expected_revenue(files: list[Path]) -> dict[str, Decimal]:
    totals: dict[str, Decimal] = {}
    for f in files:
        with f.open() as src:
            for row in csv.DictReader(src):
                amount = int(row["quantity"]) * Decimal(row["unit_price"])
                totals[row["region"]] = totals.get(row["region"], Decimal(0)) + amount
    return totals


def run_once(spark, broker, work: Path) -> None:
    query = load("pipeline").build_query(spark, broker.url, "/queue/orders.csv", work, True)
    query.awaitTermination(180)
    assert query.exception() is None, query.exception()


def test_the_csv_pipeline_aggregates_every_file_exactly_once(spark, broker, tmp_path):
    make = load("make_orders")
    data = tmp_path / "csv"
    data.mkdir()
    rng = random.Random(1)
    files = []
    for n in range(3):
        files.append(data / f"orders-{n}.csv")
        make.write_file(files[-1], 500, rng, n * 500)
    work = tmp_path / "work"
    with Client(broker.url) as c:
        for f in files[:2]:
            c.send_file("/queue/orders.csv", f)
    run_once(spark, broker, work)
    with Client(broker.url) as c:
        c.send_file("/queue/orders.csv", files[2])
    run_once(spark, broker, work)

    result = spark.read.parquet(str(work / "revenue"))
    got = {r.region: r.revenue for r in result.groupBy("region").sum("revenue")
           .withColumnRenamed("sum(revenue)", "revenue").collect()}
    assert got == expected_revenue(files)
    assert result.groupBy().sum("orders").collect()[0][0] == 1500
