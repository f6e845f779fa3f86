"""Spark settings shared by the suite's SparkSession and the driver processes it starts."""

from __future__ import annotations

from pathlib import Path


def spark_conf(tmp: Path) -> dict[str, str]:
    """Keep every Spark file under `tmp`, no UI, few shuffle partitions, fast polling."""
    return {
        "spark.ui.enabled": "false",
        "spark.local.dir": str(tmp / "local"),
        "spark.sql.warehouse.dir": str(tmp / "warehouse"),
        "spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={tmp}",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.streaming.pollingDelay": "20ms",
        "spark.python.worker.reuse": "true",
    }
