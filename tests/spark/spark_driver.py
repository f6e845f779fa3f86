"""A Spark driver program run as its own process, so a spec can kill -9 it mid-stream.

    python spark_driver.py URL SOURCE_QUEUE SINK OUT CHECKPOINT TMP [GATE AT]

Reads SOURCE_QUEUE in micro-batches of PER_BATCH messages (Trigger.AvailableNow) and writes
(message_id, body) either as JSON files (SINK=files, Spark's exactly-once file sink, OUT a
directory) or back to SluiceMQ (SINK=sluice, OUT a queue), then exits. A file sink is read back
by Spark at the end (what its metadata log says was committed) into TMP/read-back.json, so the
spec needs no Spark session of its own.

With GATE (a directory with the FIFOs ``held`` and ``release``, made by the spec) the first
task that meets a body ``event-N`` with N >= AT tells the spec through ``held`` and waits until
the spec opens and closes ``release``: its micro-batch is then known to be between its read
and its commit while the spec crashes something - no polling of the checkpoint for a window.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

PER_BATCH = 100  # 4 micro-batches of the spec's 400 messages
HOLD_SECONDS = 300.0  # a held task goes on by itself after this (the spec failed or left)


def gate_at(gate: str | None, at: int) -> Callable[[str], str]:
    """The identity on bodies, holding the first task that meets ``event-N``, N >= ``at``
    (module doc; no ``gate``: holds none). Runs in Spark's Python workers: stdlib only,
    pickled by value."""
    def body(text: str) -> str:
        import os
        import select

        if gate is None or int(text.rpartition("-")[2]) < at:
            return text
        try:  # the first such task holds; the others pass (one held task holds the batch)
            os.close(os.open(os.path.join(gate, "taken"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return text
        release = os.open(os.path.join(gate, "release"), os.O_RDONLY | os.O_NONBLOCK)
        held = os.open(os.path.join(gate, "held"), os.O_WRONLY | os.O_NONBLOCK)
        os.write(held, b"held\n")
        os.close(held)
        select.select([release], [], [], HOLD_SECONDS)  # the spec's open + close wakes us
        os.close(release)
        return text
    return body


def main(url: str, source: str, sink: str, out: str, checkpoint: str, tmp: str,
         gate: str | None = None, at: str = "0") -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from pyspark.sql import SparkSession
    from pyspark.sql.functions import col, udf
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
    held = udf(gate_at(gate, int(at)), "string", useArrow=False)  # a restart: the same plan
    rows = rows.withColumn("body", held(col("body")))
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
    main(*sys.argv[1:9])
