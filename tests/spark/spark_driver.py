"""A Spark driver program run as its own process, so a spec can kill -9 it mid-stream.

    python spark_driver.py URL SOURCE_QUEUE SINK OUT CHECKPOINT TMP

Reads SOURCE_QUEUE in micro-batches of PER_BATCH messages (Trigger.AvailableNow) and writes
(message_id, body) either as JSON files (SINK=files, Spark's exactly-once file sink, OUT a
directory) or back to SluiceMQ (SINK=sluice, OUT a queue), then exits. A file sink is read back
by Spark at the end (what its metadata log says was committed) into TMP/read-back.json, so the
spec needs no Spark session of its own.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

PER_BATCH = 100  # 4 micro-batches of the spec's 400 messages


def main(url: str, source: str, sink: str, out: str, checkpoint: str, tmp: str) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from pyspark.sql import SparkSession
    from spark_settings import spark_conf

    from sluicemq.spark import SluiceDataSource

    os.environ["PYSPARK_PYTHON"] = sys.executable
    builder = SparkSession.builder.master("local[2]").appName("sluice-driver")
    for key, value in spark_conf(Path(tmp)).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(SluiceDataSource)
    rows = (spark.readStream.format("sluice").option("url", url).option("destination", source)
            .option("maxMessagesPerTrigger", str(PER_BATCH)).load()
            .selectExpr("message_id", "cast(body as string) as body"))
    if sink == "files":
        writer = rows.writeStream.format("json").option("path", out)
    else:
        writer = (rows.selectExpr("body", "map('source-id', message_id) as headers")
                  .writeStream.format("sluice").option("url", url).option("destination", out))
    query = (writer.option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    if sink == "files":
        bodies = [r.body for r in spark.read.json(out).select("body").collect()]
        (Path(tmp) / "read-back.json").write_text(json.dumps(bodies))
    print("driver: done", flush=True)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:7])
