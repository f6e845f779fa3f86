"""The example pipeline: CSV files sent with `sluice send` → Spark → Parquet.

    python examples/csv_pipeline/pipeline.py --url stomp://127.0.0.1:61613 \\
        --source /queue/orders.csv --work ./pipeline-work [--once] [--master local[2]]

A structured streaming query reads *complete* file streams from the broker and the orders in
them (streams.format=csv: each file is assembled and SHA-256 checked in the task, then parsed by
Arrow's CSV reader, with no landing copy), aggregates revenue and order counts per region and
product, and writes the result as Parquet under WORK/revenue, one directory per micro-batch
(`batch=N`, overwritten if Spark replays that batch, so the output is exactly-once). The
checkpoint (WORK/checkpoint) makes a restarted job continue where it stopped: files are
removed from the broker only after their batch committed.

--once processes what is there and exits (Trigger.AvailableNow); otherwise it runs until
interrupted. --master takes any Spark master URL: local[N] (default local[2]) or a cluster
(spark://host:7077, yarn, k8s://…; WORK must then be on storage every executor can reach).

Spark's Python workers run `$PYSPARK_PYTHON`, else `python3` from PATH, which need not have
sluicemq installed; unset, it is set here to the interpreter running this script (the venv's).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

# The columns the job uses (the files also hold order_id and ts): Arrow's CSV reader converts
# only these, and only these travel from the Python workers to Spark. _offset is filled by the
# source, not parsed: the file's replay position in the broker, one value per file.
ORDERS = "region STRING, product STRING, quantity INT, unit_price DECIMAL(12,2), _offset BIGINT"


def revenue_by_region(orders):
    """Orders, units, revenue and files (distinct ``_offset``) per region and product."""
    from pyspark.sql import functions as F

    return (orders.groupBy("region", "product")
            .agg(F.count("*").alias("orders"),
                 F.sum("quantity").alias("units"),
                 F.sum(F.col("quantity") * F.col("unit_price")).alias("revenue"),
                 F.countDistinct("_offset").alias("files")))


def build_query(spark, url: str, source: str, work: Path, once: bool):
    from pyspark.sql import DataFrame

    revenue = work / "revenue"

    def aggregate(orders: DataFrame, batch_id: int) -> None:
        result = revenue_by_region(orders)
        result.write.mode("overwrite").parquet(str(revenue / f"batch={batch_id}"))

    # Each complete file stream (SHA-256 checked) is parsed as CSV by Arrow inside the source:
    # the micro-batch holds the orders themselves, with no landing copy of the files.
    streams = (spark.readStream.format("sluice").option("url", url)
               .option("destination", source).option("streams.format", "csv")
               .schema(ORDERS).option("partitions", "2").load())
    writer = (streams.writeStream.foreachBatch(aggregate)
              .option("checkpointLocation", str(work / "checkpoint")))
    writer = writer.trigger(availableNow=True) if once else writer.trigger(
        processingTime="1 second")
    return writer.start()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="CSV files from SluiceMQ to Parquet with Spark")
    p.add_argument("--url", default="stomp://127.0.0.1:61613")
    p.add_argument("--source", default="/queue/orders.csv")
    p.add_argument("--work", type=Path, default=Path("pipeline-work"))
    p.add_argument("--master", default="local[2]")
    p.add_argument("--once", action="store_true", help="process what is there, then exit")
    args = p.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers import sluicemq too
    from pyspark.sql import SparkSession

    from sluicemq.spark import SluiceDataSource

    spark = (SparkSession.builder.master(args.master).appName("sluice-csv-pipeline")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "4").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(SluiceDataSource)
    started = time.monotonic()
    query = build_query(spark, args.url, args.source, args.work.resolve(), args.once)
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    orders = sum(p["numInputRows"] for p in query.recentProgress)
    print(f"pipeline: {orders} orders in {time.monotonic() - started:.1f} s; "
          f"Parquet under {args.work / 'revenue'}", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
