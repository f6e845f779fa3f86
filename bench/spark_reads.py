"""The read table of bench/spark_bench.py: SluiceMQ's source against Spark's own ceilings.

Same rows everywhere (N x 1 KiB bodies), same SparkSession (local[2]), runs alternated and
repeated, medians reported:

* stream-pK-cols / stream-pK-frames: one Trigger.AvailableNow streaming query, K partitions,
  noop sink; column batches (the default) or one MESSAGE frame per message (bulk=false). A
  query commits (removes) what it read, so each run reads its own freshly filled queue; only
  the query is timed, and Spark's Python workers are running when it starts (as for the
  trivial sources).
* batch-cols / batch-frames: spark.read (browse, nothing consumed), noop sink.
* trivial-arrow / trivial-tuples: a Python data source that yields the same bodies from memory
  as RecordBatches / as tuples of the source's 7-column shape: what PySpark itself allows.
* trivial-stream-arrow: the same RecordBatches from a Python *streaming* source, one
  Trigger.AvailableNow query (2 partitions, noop sink): Spark's own ceiling for a streaming
  query, including its fixed cost per query (a planner process, offset and commit logs).
* stream-p2-steady / trivial-stream-steady: what a *running* query sustains - a streaming query
  (default trigger, 2 partitions, noop sink) over the same backlog in micro-batches of a
  quarter of it (maxMessagesPerTrigger for ours, the same step for the trivial source): rows
  divided by the time the micro-batches took (Spark's triggerExecution), so without the
  once-per-query start of Spark's planning process that the availableNow figures include.
* read-text: spark.read.text of the same bodies (hex, one per line) from a local file.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROWS_PER_BATCH = 4096


def _trivial_sources(n: int, size: int) -> tuple[type, type]:
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceReader,
        DataSourceStreamReader,
        InputPartition,
    )

    class _Reader(DataSourceReader):
        def __init__(self, arrow: bool) -> None:
            self.arrow = arrow

        def partitions(self) -> list[InputPartition]:
            half = n // 2
            return [InputPartition((0, half)), InputPartition((half, n))]

        def read(self, partition: InputPartition) -> Any:
            import datetime as dt

            import pyarrow as pa

            a, b = partition.value
            body = b"x" * size
            if not self.arrow:
                ts = dt.datetime.now(dt.UTC)
                for i in range(a, b):
                    yield (f"ID:sluice-{i}", "/queue/x", '{"k":"v"}', body, ts, False, i)
                return
            for start in range(a, b, ROWS_PER_BATCH):
                k = min(ROWS_PER_BATCH, b - start)
                yield pa.RecordBatch.from_arrays(
                    [pa.array([f"ID:sluice-{i}" for i in range(start, start + k)]),
                     pa.array(["/queue/x"] * k), pa.array(['{"k":"v"}'] * k),
                     pa.array([body] * k, pa.binary()),
                     pa.array([0] * k, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                     pa.array([False] * k), pa.array(range(start, start + k), pa.int64())],
                    names=["message_id", "destination", "headers", "body", "timestamp",
                           "redelivered", "offset"])

    class _StreamReader(DataSourceStreamReader):
        """Offsets 0 → n: a fresh checkpoint reads all n rows in one micro-batch, or in
        micro-batches of ``step`` rows (option ``step``)."""

        def __init__(self, step: int) -> None:
            self.step = step

        def initialOffset(self) -> dict:
            return {"seq": 0}

        def latestOffset(self, start: dict, limit: Any) -> dict:
            return {"seq": min(n, start["seq"] + self.step)}

        def partitions(self, start: dict, end: dict) -> list[InputPartition]:
            a, b = start["seq"], end["seq"]
            return [InputPartition((a, (a + b) // 2)), InputPartition(((a + b) // 2, b))]

        def read(self, partition: InputPartition) -> Any:
            return _Reader(True).read(partition)

        def commit(self, end: dict) -> None:
            pass

    schema = ("message_id STRING, destination STRING, headers STRING, body BINARY, "
              "timestamp TIMESTAMP, redelivered BOOLEAN, offset BIGINT")

    class TrivialArrow(DataSource):
        @classmethod
        def name(cls) -> str:
            return "trivial_arrow"

        def schema(self) -> str:
            return schema

        def reader(self, schema: Any) -> DataSourceReader:
            return _Reader(True)

        def streamReader(self, schema: Any) -> DataSourceStreamReader:
            return _StreamReader(int(self.options.get("step", n)))

    class TrivialTuples(TrivialArrow):
        @classmethod
        def name(cls) -> str:
            return "trivial_tuples"

        def reader(self, schema: Any) -> DataSourceReader:
            return _Reader(False)

    return TrivialArrow, TrivialTuples


def bench_reads(spark: Any, url: str, tmp: Path, count: int, repeat: int,
                fill: Any, only: set[str] | None = None) -> list[dict]:
    """The read table (or the scenarios in ``only``; trivial-arrow always runs: it is what
    every figure is compared with, and trivial-stream-arrow with any streaming scenario)."""
    destination = "/queue/bench.reads"
    wanted = only or {"batch-cols", "batch-frames", "read-text"}
    # The batch reads' queue and read-text's file are filled only for the scenarios that read
    # them (a million messages and a GiB of text are minutes of a hold otherwise).
    fill_rate = (fill(url, destination, count, 1024)
                 if wanted & {"batch-cols", "batch-frames"} else 0.0)
    text = tmp / "bodies.txt"
    if "read-text" in wanted:
        with text.open("w") as f:
            line = "ab" * 511 + "\n"  # 1 KiB a line
            for _ in range(count):
                f.write(line)
    arrow, tuples = _trivial_sources(count, 1024)
    spark.dataSource.register(arrow)
    spark.dataSource.register(tuples)
    runs = 0

    warm_queue = "/queue/bench.warm-workers"
    fill(url, warm_queue, 400, 1024)

    def fill_then_warm(queue: str) -> None:
        """Fill ``queue``, then have the Python workers run a few rows (a browse of a small
        queue, nothing consumed). Spark stops a Python worker left idle for a minute
        (PythonWorkerFactory), and filling a million messages beside the batch reads' million
        takes about that long: without this the timed query restarted its workers (~0.8 s of
        CPU each) while the trivial sources, which fill nothing, found theirs running."""
        fill(url, queue, count, 1024)
        (spark.read.format("sluice").option("url", url).option("destination", warm_queue)
         .load().write.format("noop").mode("overwrite").save())

    def stream(partitions: int, bulk: str) -> Callable[[], int]:
        nonlocal runs
        runs += 1
        queue = f"/queue/bench.stream-{runs}"
        fill_then_warm(queue)
        return lambda: _stream(queue, partitions, bulk)

    inside: list[float] = []  # the last availableNow query's seconds in its micro-batches

    def available_now(frame: Any, checkpoint: str) -> int:
        """Rows read by one Trigger.AvailableNow query of ``frame`` into the noop sink (and,
        in ``inside``, the seconds of its micro-batches: the query minus Spark starting it)."""
        query = (frame.writeStream.format("noop")
                 .option("checkpointLocation", str(tmp / checkpoint))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        progress = [p for p in query.recentProgress if p["numInputRows"]]
        inside[:] = [sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000]
        return sum(p["numInputRows"] for p in progress)

    def steady(frame: Any, checkpoint: str) -> tuple[int, float]:
        """Rows and seconds of micro-batches of a running query, once it read the backlog."""
        query = (frame.writeStream.format("noop")
                 .option("checkpointLocation", str(tmp / checkpoint)).start())
        try:
            query.processAllAvailable()
        finally:
            query.stop()
        batches = [p for p in query.recentProgress if p["numInputRows"]]
        return (sum(p["numInputRows"] for p in batches),
                sum(p["durationMs"]["triggerExecution"] for p in batches) / 1000)

    step = str(-(-count // 4))  # a steady-state micro-batch: a quarter of the backlog

    def stream_steady() -> Callable[[], tuple[int, float]]:
        nonlocal runs
        runs += 1
        queue = f"/queue/bench.steady-{runs}"
        fill_then_warm(queue)
        frame = (spark.readStream.format("sluice").option("url", url)
                 .option("destination", queue).option("partitions", "2")
                 .option("maxMessagesPerTrigger", step).load())
        return lambda: steady(frame, f"ck-{queue[7:]}")

    def trivial_steady() -> tuple[int, float]:
        nonlocal runs
        runs += 1
        return steady(spark.readStream.format("trivial_arrow").option("step", step).load(),
                      f"ck-trivial-{runs}")

    def _stream(queue: str, partitions: int, bulk: str) -> int:
        return available_now(spark.readStream.format("sluice").option("url", url)
                             .option("destination", queue)
                             .option("partitions", str(partitions))
                             .option("bulk", bulk).load(), f"ck-{queue[7:]}")

    def trivial_stream() -> int:
        nonlocal runs
        runs += 1
        return available_now(spark.readStream.format("trivial_arrow").load(),
                             f"ck-trivial-{runs}")

    def batch(bulk: str) -> int:
        (spark.read.format("sluice").option("url", url).option("destination", destination)
         .option("bulk", bulk).load().write.format("noop").mode("overwrite").save())
        return count

    def of(fmt: str) -> int:
        spark.read.format(fmt).load().write.format("noop").mode("overwrite").save()
        return count

    def read_text() -> int:
        spark.read.text(str(text)).write.format("noop").mode("overwrite").save()
        return count

    streams = {"stream-p2-cols": (2, "true"), "stream-p2-frames": (2, "false"),
               "stream-p4-cols": (4, "true")}
    # Scenarios that fill their own queue first: the fill is outside the timing.
    prepared: dict[str, Callable[[], Callable[[], Any]]] = {
        **{name: (lambda p=p, b=b: stream(p, b)) for name, (p, b) in streams.items()},
        "stream-p2-steady": stream_steady,
    }
    # The trivial source each streaming scenario is also compared with, measured the same way.
    baseline = {**{name: "trivial-stream-arrow" for name in streams},
                "stream-p2-steady": "trivial-stream-steady"}
    scenarios: dict[str, Callable[[], Any]] = {
        **{name: (lambda prepare=prepare: prepare()()) for name, prepare in prepared.items()},
        "batch-cols": lambda: batch("true"),
        "batch-frames": lambda: batch("false"),
        "trivial-arrow": lambda: of("trivial_arrow"),
        "trivial-tuples": lambda: of("trivial_tuples"),
        "trivial-stream-arrow": trivial_stream,
        "trivial-stream-steady": trivial_steady,
        "read-text": read_text,
    }
    if only:
        unknown = only - set(scenarios)
        if unknown:
            raise SystemExit(f"unknown read scenarios {sorted(unknown)}: {sorted(scenarios)}")
        always = {"trivial-arrow"} | {baseline[k] for k in only if k in baseline}
        scenarios = {k: v for k, v in scenarios.items() if k in only | always}
    for run in scenarios.values():  # warm-up: Python workers start once, outside the figures
        run()
    rates: dict[str, list[float]] = {name: [] for name in scenarios}
    in_batches: dict[str, list[float]] = {}  # availableNow: rows over its micro-batches' time
    for _ in range(repeat):
        for name, run in scenarios.items():
            if name in prepared:
                run = prepared[name]()
            started = time.perf_counter()
            inside.clear()
            rows = run()
            elapsed = time.perf_counter() - started
            if isinstance(rows, tuple):  # a steady-state run times its micro-batches itself
                rows, elapsed = rows
            assert rows == count, f"{name}: {rows} rows, expected {count}"
            rates[name].append(rows / elapsed)
            if inside:
                in_batches.setdefault(name, []).append(rows / inside[0])
    out = []
    arrow_rate = statistics.median(rates["trivial-arrow"])
    for name, values in rates.items():
        med = statistics.median(values)
        versus = {}
        if baseline.get(name) in rates:
            other = baseline[name]
            versus[f"vs_{other.replace('-', '_')}"] = round(
                med / statistics.median(rates[other]), 3)
        out.append({"scenario": f"spark-read-{name}", "messages": count, "size": 1024,
                    "msgs_per_s": round(med), "runs": [round(v) for v in values],
                    "vs_trivial_arrow": round(med / arrow_rate, 3),
                    **({"fill_msgs_per_s": round(fill_rate)} if fill_rate else {}), **versus})
        within = ""
        if name in in_batches:  # the same queries timed from their first micro-batch on
            out[-1]["in_batches_msgs_per_s"] = round(statistics.median(in_batches[name]))
            within = f"; {out[-1]['in_batches_msgs_per_s']:,} msgs/s inside its micro-batches"
        print(f"read {name:17s} {med:>12,.0f} msgs/s  (median of {len(values)}: "
              f"{', '.join(f'{v:,.0f}' for v in values)}; {med / arrow_rate:.2f}x trivial "
              f"Arrow source"
              + "".join(f", {v:.2f}x {k[3:].replace('_', ' ')}" for k, v in versus.items())
              + within + ")", flush=True)
    return out
