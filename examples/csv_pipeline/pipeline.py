"""The example pipeline: CSV files sent with `sluice send` → Spark → Parquet.

    python examples/csv_pipeline/pipeline.py --url stomp://127.0.0.1:61613 \\
        --source /queue/orders.csv --work ./pipeline-work [--once] [--master local[2]]

A structured streaming query reads *complete* file streams from the broker (mode=streams;
each file is assembled and SHA-256 checked, then written under WORK/landing), parses each
micro-batch's files as CSV, aggregates revenue and order counts per region and product, and
writes the result as Parquet under WORK/revenue, one directory per micro-batch
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


def build_query(spark, url: str, source: str, work: Path, once: bool):
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    landing = work / "landing"
    revenue = work / "revenue"

    def aggregate(files: DataFrame, batch_id: int) -> None:
        paths = [r.path for r in files.select("path").collect()]
        if not paths:
            return
        orders = spark.read.csv(paths, header=True, inferSchema=False).select(
            "region", "product", F.col("quantity").cast("int").alias("quantity"),
            F.col("unit_price").cast("decimal(12,2)").alias("unit_price"))
        result = (orders.groupBy("region", "product")
                  .agg(F.count("*").alias("orders"),
                       F.sum("quantity").alias("units"),
                       F.sum(F.col("quantity") * F.col("unit_price")).alias("revenue"))
                  .withColumn("files", F.lit(len(paths))))
        result.write.mode("overwrite").parquet(str(revenue / f"batch={batch_id}"))

    streams = (spark.readStream.format("sluice").option("url", url)
               .option("destination", source).option("mode", "streams")
               .option("streams.output", "path").option("path", str(landing))
               .option("partitions", "2").load())
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
    files = sum(p["numInputRows"] for p in query.recentProgress)
    print(f"pipeline: {files} files in {time.monotonic() - started:.1f} s; "
          f"Parquet under {args.work / 'revenue'}", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
