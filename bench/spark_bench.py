"""SluiceMQ → Spark figures: ingest rate, file pipeline throughput, end-to-end latency.

    python bench/spark_bench.py [--messages 200000] [--gib 1.0] [--latency-seconds 30]
                                [--repeat 3] [--skip ingest,reads,sink,files,latency]
                                [--json out.jsonl]

* reads: the read table (bench/spark_reads.py): our source through column batches and per
  message frames, streaming and batch, against trivial Python sources and spark.read.text.
* sink: N rows of 1 KiB written by a batch write job, Arrow writer (column batches) vs one
  SEND per row; every row checked published once.
* ingest: N persistent 1 KiB messages are queued first, then one Trigger.AvailableNow
  streaming query (local[2], `partitions` = 2, noop sink) reads them all; messages/s over the
  query's wall time (after a small warm-up query, so Python worker start-up is excluded).
* files: the examples/csv_pipeline job on ~GIB of CSV files sent with `sluice send`: MB/s of
  the send, and of the Spark job (streams assembled and SHA-checked in the tasks, parsed by
  Arrow's CSV reader, aggregated, written as Parquet), against the same aggregation reading
  the same CSV files from local disk with spark.read.csv.
* latency: a query with a 100 ms processing-time trigger (--trigger-ms) runs while one message
  is sent every 20 ms with its send time in a header; foreachBatch notes when each row became
  visible in a micro-batch; p50/p99 of the difference.
* journal (always, last): the journal's segment files on disk against the body bytes still
  unconsumed (/api/destinations: memory_bytes + paged_bytes), right after the run and again
  every 2 s for --journal-settle s while compaction catches up - issue #16's goal is at most
  2 x unconsumed + 2 segments.

It starts its own broker on a throwaway data directory; the journal fsyncs as in production.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from sluicemq.client import Client
from spark_reads import bench_reads
from streams import start_broker

ROOT = Path(__file__).resolve().parents[1]
MB = 1_000_000
SEGMENT = 64 << 20  # the broker's default [journal] segment_bytes (the bench sets no config)
LOCAL_ORDERS = ("order_id BIGINT, region STRING, product STRING, quantity INT, "
                "unit_price DECIMAL(12,2), ts BIGINT")  # the CSV files' columns


def session(tmp: Path):
    from pyspark.sql import SparkSession

    from sluicemq.spark import SluiceDataSource

    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (SparkSession.builder.master("local[2]").appName("sluice-bench")
             .config("spark.ui.enabled", "false").config("spark.local.dir", str(tmp / "local"))
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.streaming.pollingDelay", "10ms").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(SluiceDataSource)
    return spark


def fill(url: str, destination: str, count: int, size: int) -> float:
    body = os.urandom(size // 2).hex().encode()
    started = time.perf_counter()
    with Client(url) as c:
        window = []
        for _ in range(count):
            window.append(c.send_async(destination, body))
            if len(window) >= 256:
                for r in window:
                    r.result(60)
                window.clear()
        for r in window:
            r.result(60)
    return count / (time.perf_counter() - started)


def warm_up(spark, url: str, tmp: Path) -> None:
    """One small query first: Spark's Python workers start once, not inside a measurement."""
    fill(url, "/queue/bench.warm", 2000, 1024)
    query = (spark.readStream.format("sluice").option("url", url)
             .option("destination", "/queue/bench.warm").load()
             .writeStream.format("noop").option("checkpointLocation", str(tmp / "ck-warm"))
             .trigger(availableNow=True).start())
    query.awaitTermination()


def bench_ingest(spark, url: str, tmp: Path, count: int) -> dict:
    fill_rate = fill(url, "/queue/bench.ingest", count, 1024)
    warm_up(spark, url, tmp)
    started = time.perf_counter()
    query = (spark.readStream.format("sluice").option("url", url)
             .option("destination", "/queue/bench.ingest").option("partitions", "2").load()
             .writeStream.format("noop").option("checkpointLocation", str(tmp / "ck-ingest"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    rates = [p["processedRowsPerSecond"] for p in query.recentProgress if p["numInputRows"]]
    out = {"scenario": "spark-ingest", "messages": rows, "size": 1024, "seconds": round(elapsed, 2),
           "msgs_per_s": round(rows / elapsed), "batches": len(rates),
           "fill_msgs_per_s": round(fill_rate)}
    print(f"ingest: {rows:,} x 1 KiB in {elapsed:.1f} s = {rows / elapsed:,.0f} msgs/s "
          f"({len(rates)} micro-batches; queue filled at {fill_rate:,.0f}/s)", flush=True)
    return out


def bench_sink(spark, url: str, count: int, repeat: int) -> list[dict]:
    """N rows of 1 KiB written with df.write.format("sluice") (a batch write job: staged
    parts published once by the driver); Arrow writer vs one SEND per row, alternated."""
    from pyspark.sql import functions as F

    df = (spark.range(count, numPartitions=2)
          .select(F.expr("repeat('x', 1024)").cast("binary").alias("body"),
                  F.create_map(F.lit("n"), F.col("id").cast("string")).alias("headers")))
    df.cache().count()
    rates: dict[str, list[float]] = {"arrow": [], "rows": []}
    for run in range(repeat + 1):
        for mode, bulk in (("arrow", "true"), ("rows", "false")):
            dest = f"/queue/bench.sink-{mode}-{run}"
            started = time.perf_counter()
            (df.write.format("sluice").option("url", url).option("destination", dest)
             .option("bulk", bulk).mode("append").save())
            elapsed = time.perf_counter() - started
            with Client(url) as c:
                published = c.head(dest).count
            assert published == count, f"{mode}: {published} published, expected {count}"
            if run:  # the first round warms the Python workers up
                rates[mode].append(count / elapsed)
    out = []
    for mode, values in rates.items():
        med = statistics.median(values)
        out.append({"scenario": f"spark-sink-{mode}", "rows": count, "size": 1024,
                    "rows_per_s": round(med), "runs": [round(v) for v in values]})
        print(f"sink {mode:5s} {med:>10,.0f} rows/s published exactly once (median of "
              f"{len(values)}: {', '.join(f'{v:,.0f}' for v in values)})", flush=True)
    return out


def bench_files(spark, url: str, tmp: Path, gib: float, repeat: int = 3) -> dict:
    """The example pipeline (examples/csv_pipeline: files sent with `sluice send`, read as
    CSV rows by the source, aggregated, written as Parquet) against the same job reading the
    same files from local disk with spark.read.csv. Both compute the same result - counts,
    units, revenue and the number of files per region and product - after one warm-up run
    each; runs alternate, medians reported. The send is not part of the pipeline's time."""
    sys.path.insert(0, str(ROOT / "examples" / "csv_pipeline"))
    import make_orders
    import pipeline
    from pyspark.sql import functions as F

    data = tmp / "csv"
    data.mkdir()
    files = 8
    rows = int(gib * (1 << 30) / files / 52)  # ~52 bytes a row
    rng = random.Random(7)
    for n in range(files):
        make_orders.write_file(data / f"orders-{n:04d}.csv", rows, rng, n * rows)
    paths = sorted(data.glob("*.csv"))
    total = sum(p.stat().st_size for p in paths)
    runs = {"send": [], "pipeline": [], "local": []}

    def send(queue: str) -> None:
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "sluicemq", "send", "--url", url, "-q", "--to",
                        queue, *map(str, paths)], check=True)
        runs["send"].append(time.perf_counter() - started)

    def through_sluice(k: int) -> float:
        queue = f"/queue/bench.csv-{k}"
        send(queue)
        started = time.perf_counter()
        pipeline.build_query(spark, url, queue, tmp / f"work-{k}", True).awaitTermination()
        return time.perf_counter() - started

    def from_disk(k: int) -> float:
        started = time.perf_counter()
        local = (spark.read.csv([str(p) for p in paths], header=True, schema=LOCAL_ORDERS)
                 .withColumn("_offset", F.hash(F.input_file_name()).cast("bigint")))
        (pipeline.revenue_by_region(local)
         .write.mode("overwrite").parquet(str(tmp / f"local-revenue-{k}")))
        return time.perf_counter() - started

    through_sluice(0)  # warm-up: Python workers and JIT, outside the figures
    from_disk(0)
    runs["send"].clear()
    for k in range(1, repeat + 1):
        runs["pipeline"].append(through_sluice(k))
        runs["local"].append(from_disk(k))
    send_s, job_s, local_s = (statistics.median(runs[k]) for k in ("send", "pipeline", "local"))
    out = {"scenario": "spark-files", "bytes": total, "files": files,
           "send_mb_per_s": round(total / send_s / MB, 1),
           "pipeline_mb_per_s": round(total / job_s / MB, 1), "pipeline_s": round(job_s, 1),
           "local_csv_mb_per_s": round(total / local_s / MB, 1),
           "ratio_vs_local": round(local_s / job_s, 2),
           "runs_s": {k: [round(v, 2) for v in runs[k]] for k in ("pipeline", "local")}}
    print(f"files: {total / MB:,.0f} MB in {files} CSV files; sluice send {send_s:.1f} s "
          f"({out['send_mb_per_s']} MB/s); Spark pipeline {job_s:.1f} s "
          f"({out['pipeline_mb_per_s']} MB/s); the same job on the local files {local_s:.1f} s "
          f"({out['local_csv_mb_per_s']} MB/s): {out['ratio_vs_local']}x (medians of "
          f"{repeat}: {out['runs_s']})", flush=True)
    return out


def bench_latency(spark, url: str, tmp: Path, seconds: float, trigger_ms: int) -> dict:
    seen: list[float] = []

    def note(batch, _batch_id: int) -> None:
        now = time.time_ns()
        for r in batch.select("sent-ns").collect():
            seen.append((now - int(r["sent-ns"])) / 1e6)

    query = (spark.readStream.format("sluice").option("url", url)
             .option("destination", "/queue/bench.latency").option("partitions", "1")
             .option("headers", "none").option("headerColumns", "sent-ns")
             .option("startingOffsets", "latest").load()
             .writeStream.foreachBatch(note).trigger(processingTime=f"{trigger_ms} milliseconds")
             .option("checkpointLocation", str(tmp / "ck-latency")).start())
    stop = threading.Event()

    def produce() -> None:
        with Client(url) as c:
            while not stop.wait(0.02):
                c.send("/queue/bench.latency", b"x" * 1024,
                       headers={"sent-ns": str(time.time_ns())})

    time.sleep(15)  # Python workers start; the first batches are not steady state
    sender = threading.Thread(target=produce, daemon=True)
    sender.start()
    time.sleep(seconds)
    stop.set()
    sender.join()
    time.sleep(3)
    query.stop()
    lat = sorted(seen)
    p50 = statistics.median(lat)
    p99 = lat[int(len(lat) * 0.99) - 1]
    out = {"scenario": "spark-latency", "trigger_ms": trigger_ms, "rows": len(lat),
           "p50_ms": round(p50, 1),
           "p99_ms": round(p99, 1), "max_ms": round(lat[-1], 1)}
    print(f"latency SEND → row in a micro-batch ({trigger_ms} ms trigger): {len(lat)} rows, "
          f"p50 {p50:.0f} ms, "
          f"p99 {p99:.0f} ms, max {lat[-1]:.0f} ms", flush=True)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def journal_sample(console: str, data_dir: Path) -> dict:
    """Segment files (apparent size and blocks allocated) and unconsumed body bytes now."""
    segments = list((data_dir / "journal").glob("*.log"))
    with urllib.request.urlopen(f"{console}/api/destinations", timeout=60) as resp:
        rows = json.load(resp)["destinations"]
    queues = [r for r in rows if r["kind"] == "queue" and r["depth"]]
    unconsumed = sum(r["memory_bytes"] + r["paged_bytes"] for r in queues)
    return {"segments": len(segments),
            "journal_bytes": sum(p.stat().st_size for p in segments),
            "journal_allocated": sum(p.stat().st_blocks * 512 for p in segments),
            "unconsumed_bytes": unconsumed, "queues_with_messages": len(queues),
            "goal_bytes": 2 * unconsumed + 2 * SEGMENT}


def ratio(sample: dict) -> float | None:
    """Journal on disk over unconsumed bytes (None when nothing is unconsumed)."""
    if not sample["unconsumed_bytes"]:
        return None
    return round(sample["journal_bytes"] / sample["unconsumed_bytes"], 2)


def bench_journal(console: str, data_dir: Path, settle: float) -> dict:
    """Issue #16's figure after a Spark run: journal on disk vs what is unconsumed."""
    samples = [journal_sample(console, data_dir)]
    started = time.monotonic()
    while time.monotonic() - started < settle:
        time.sleep(2)  # the broker compacts on its once-a-second tick: sample, do not assert
        samples.append(journal_sample(console, data_dir))
    first, last = samples[0], samples[-1]
    out = {"scenario": "spark-journal", "segment_bytes": SEGMENT, "settle_s": settle,
           "after_run": first, "settled": last,
           "ratio_after_run": ratio(first), "ratio_settled": ratio(last),
           "within_goal": last["journal_bytes"] <= last["goal_bytes"]}
    for label, s in (("after the run", first), (f"after {settle:.0f} s", last)):
        print(f"journal {label}: {s['journal_bytes'] / MB:,.1f} MB in {s['segments']} segments "
              f"({s['journal_allocated'] / MB:,.1f} MB allocated) for "
              f"{s['unconsumed_bytes'] / MB:,.1f} MB unconsumed in "
              f"{s['queues_with_messages']} queues; goal <= {s['goal_bytes'] / MB:,.1f} MB",
              flush=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--latency-seconds", type=float, default=30)
    p.add_argument("--repeat", type=int, default=3, help="runs of each read scenario")
    p.add_argument("--trigger-ms", type=int, default=100, help="latency query's trigger")
    p.add_argument("--skip", default="",
                   help="comma list of ingest,reads,sink,files,latency")
    p.add_argument("--reads", default="",
                   help="comma list of read scenarios (default: all; see bench/spark_reads.py)")
    p.add_argument("--journal-settle", type=float, default=20,
                   help="seconds the journal figure is sampled after the run")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    load_start = os.getloadavg()[0]
    print(f"spark_bench {time.strftime('%H:%M:%S')}, 1-min load {load_start:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="sluice-spark-bench-") as t:
        tmp = Path(t)
        console = f"http://127.0.0.1:{free_port()}"
        proc, url = start_broker(tmp / "data", ["--console-port", console.rsplit(":", 1)[1]])
        try:
            spark = session(tmp)
            results = []
            if "ingest" not in skip:
                results.append(bench_ingest(spark, url, tmp, args.messages))
            if "reads" not in skip:
                results += bench_reads(spark, url, tmp, args.messages, args.repeat, fill,
                                       set(filter(None, args.reads.split(","))))
            if "sink" not in skip:
                results += bench_sink(spark, url, args.messages, args.repeat)
            if "files" not in skip:
                results.append(bench_files(spark, url, tmp, args.gib, args.repeat))
            if "latency" not in skip:
                results.append(bench_latency(spark, url, tmp, args.latency_seconds,
                                             args.trigger_ms))
            spark.stop()
            results.append(bench_journal(console, tmp / "data", args.journal_settle))
        finally:
            proc.terminate()
            proc.wait(30)
    load_end = os.getloadavg()[0]
    print(f"spark_bench done {time.strftime('%H:%M:%S')}, 1-min load {load_end:.2f}", flush=True)
    if args.json:
        with args.json.open("a") as f:
            for r in results:
                f.write(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), **r,
                                    "load_1m": [round(load_start, 2), round(load_end, 2)]})
                        + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
