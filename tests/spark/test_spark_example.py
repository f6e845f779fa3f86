"""The examples/csv_pipeline job, run for real: CSV files sent as streams come out as correct
Parquet aggregates, and a second run over the same checkpoint adds only the new file."""

from __future__ import annotations

import csv
import importlib.util
import random
import sys
from decimal import Decimal
from pathlib import Path

import pytest

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
    shown = load("show").totals(work)  # the README's last step, without Spark or pandas
    assert {r["region"]: r["revenue"] for r in shown} == expected_revenue(files)
    assert sum(r["orders"] for r in shown) == 1500


@pytest.mark.xdist_group("spark-drivers")  # its own Spark driver: one such JVM at a time
def test_the_pipeline_script_runs_its_workers_on_its_own_interpreter(broker, tmp_path):
    """As the README runs it: `python pipeline.py --once` with no PYSPARK_PYTHON set, and a
    `python3` first on PATH that cannot run a worker - the script must not depend on it."""
    import os
    import subprocess

    make = load("make_orders")
    data = tmp_path / "csv"
    data.mkdir()
    make.write_file(data / "orders.csv", 200, random.Random(2), 0)
    with Client(broker.url) as c:
        c.send_file("/queue/orders.csv", data / "orders.csv")
    shims = tmp_path / "bin"
    shims.mkdir()
    for name in ("python3", "python"):
        (shims / name).write_text("#!/bin/sh\necho 'not this interpreter' >&2\nexit 3\n")
        (shims / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON",
                                                            "PYSPARK_DRIVER_PYTHON")}
    env["PATH"] = f"{shims}{os.pathsep}{env['PATH']}"
    work = tmp_path / "work"
    done = subprocess.run(
        [sys.executable, str(EXAMPLE / "pipeline.py"), "--once", "--url", broker.url,
         "--work", str(work), "--master", "local[1]"],
        capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "pipeline: 200 orders" in done.stdout
    assert sum(r["orders"] for r in load("show").totals(work)) == 200
