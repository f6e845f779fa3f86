"""Writing DataFrames to SluiceMQ: every row becomes one persistent message, exactly once,
even when a Spark task fails and is retried or a micro-batch is replayed."""

from __future__ import annotations

import contextlib
from pathlib import Path

from sluice_testing import stored
from sluicemq.client import Client


def drain(broker, destination: str) -> list[str]:
    """Everything the broker holds for `destination`, read by a plain consumer."""
    return stored(broker.url, destination)


def test_a_dataframe_is_published_once_per_row(spark, broker):
    df = spark.createDataFrame([(f"row-{i}",) for i in range(50)], "body STRING")
    (df.repartition(3).write.format("sluice").option("url", broker.url)
     .option("destination", "/queue/out").mode("append").save())
    assert sorted(drain(broker, "/queue/out")) == sorted(f"row-{i}" for i in range(50))


def test_rows_choose_their_destination_and_headers(spark, broker):
    df = spark.createDataFrame(
        [("a", "/queue/left", {"k": "1"}), ("b", "/queue/right", {"k": "2"})],
        "body STRING, destination STRING, headers MAP<STRING, STRING>")
    df.write.format("sluice").option("url", broker.url).mode("append").save()
    with Client(broker.url) as c, c.subscribe("/queue/left") as left:
        m = left.get(timeout=5)
        assert m is not None and m.text() == "a" and m.headers["k"] == "1"
    assert drain(broker, "/queue/right") == ["b"]


def test_a_retried_task_publishes_nothing_twice(spark, broker):
    """Each partition's first attempt stages some rows and then dies; Spark retries it."""
    from pyspark import TaskContext
    from pyspark.sql.functions import udf

    @udf("string", useArrow=False)  # a row-at-a-time UDF: pandas is not a dependency
    def flaky(body):
        ctx = TaskContext.get()
        if ctx.attemptNumber() == 0 and body.endswith("-7"):
            raise RuntimeError("forced task failure")
        return body

    df = spark.createDataFrame([(f"p{p}-{i}",) for p in range(2) for i in range(10)],
                               "body STRING").repartition(2)
    (df.select(flaky("body").alias("body")).write.format("sluice").option("url", broker.url)
     .option("destination", "/queue/retried").mode("append").save())
    got = drain(broker, "/queue/retried")
    assert sorted(got) == sorted(f"p{p}-{i}" for p in range(2) for i in range(10))


def test_a_streaming_write_is_exactly_once_across_query_restarts(spark, broker, tmp_path: Path):
    """Queue → Spark → queue: a second run over the same checkpoint adds only new messages."""
    def run() -> None:
        query = (spark.readStream.format("sluice").option("url", broker.url)
                 .option("destination", "/queue/in").load()
                 .selectExpr("concat('seen-', cast(body as string)) as body")
                 .writeStream.format("sluice").option("url", broker.url)
                 .option("destination", "/queue/copied")
                 .option("checkpointLocation", str(tmp_path / "ck"))
                 .trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None, query.exception()

    with Client(broker.url) as c:
        for i in range(15):
            c.send("/queue/in", f"a{i}")
    run()
    with Client(broker.url) as c:
        for i in range(5):
            c.send("/queue/in", f"b{i}")
    run()
    expected = [f"seen-a{i}" for i in range(15)] + [f"seen-b{i}" for i in range(5)]
    assert sorted(drain(broker, "/queue/copied")) == sorted(expected)


def test_a_stream_sink_needs_a_checkpoint_to_name_the_query(spark, broker):
    import pytest

    df = spark.readStream.format("rate").load().selectExpr("cast(value as string) as body")
    with pytest.raises(Exception, match=r"checkpointLocation|sinkId"):
        df.writeStream.format("sluice").option("url", broker.url).option(
            "destination", "/queue/x").start().awaitTermination(30)


def _pipe(spark, broker, checkpoint: Path, sink_id: str | None = None):
    """queue → Spark → queue, 250 messages a micro-batch, until the input is drained."""
    writer = (spark.readStream.format("sluice").option("url", broker.url)
              .option("destination", "/queue/reset-in").option("maxMessagesPerTrigger", "250")
              .load().selectExpr("body")
              .writeStream.format("sluice").option("url", broker.url)
              .option("destination", "/queue/reset-out")
              .option("checkpointLocation", str(checkpoint)))
    if sink_id is not None:
        writer = writer.option("sinkId", sink_id)
    query = writer.trigger(availableNow=True).start()
    with contextlib.suppress(Exception):  # a failure is read from query.exception()
        query.awaitTermination(180)
    return query.exception()


def _send(broker, prefix: str, n: int) -> set[str]:
    bodies = {f"{prefix}-{i}" for i in range(n)}
    with Client(broker.url) as c:
        for r in [c.send_async("/queue/reset-in", b) for b in sorted(bodies)]:
            r.result(10)
    return bodies


def test_a_reset_checkpoint_never_loses_what_the_new_query_reads(spark, broker, tmp_path: Path):
    """1,000 messages through source → sink, the checkpoint deleted, 1,000 more: the new
    query (a new query id, so a new default sink id) writes every one of them. The broker
    still remembers batches 0-3 of the first query; they must not swallow the second's."""
    import shutil

    first = _send(broker, "first", 1000)
    assert _pipe(spark, broker, tmp_path / "ck") is None
    assert set(drain(broker, "/queue/reset-out")) == first
    shutil.rmtree(tmp_path / "ck")
    second = _send(broker, "second", 1000)
    assert _pipe(spark, broker, tmp_path / "ck") is None
    out = drain(broker, "/queue/reset-out")
    assert second <= set(out), f"lost {len(second - set(out))} of 1000"
    # What a reset does cost: the first query's last batch was not committed to the source's
    # ledger yet (Spark commits it when planning the next), so the new query reads it again.
    assert set(out) - second <= first and len(out) == len(set(out))


def test_a_kept_sink_id_after_a_checkpoint_reset_fails_the_query_loudly(spark, broker,
                                                                       tmp_path: Path):
    """With an explicit sinkId the reset query's batch 0 collides with the first query's:
    the commit fails with an error that says so and how to choose a new sinkId; the input
    stays on the broker, and a new sinkId then writes every message."""
    import shutil

    first = _send(broker, "first", 1000)
    assert _pipe(spark, broker, tmp_path / "ck", sink_id="orders-out") is None
    assert set(drain(broker, "/queue/reset-out")) == first
    shutil.rmtree(tmp_path / "ck")
    second = _send(broker, "second", 1000)
    error = _pipe(spark, broker, tmp_path / "ck", sink_id="orders-out")
    assert error is not None, "a colliding batch was silently dropped"
    text = str(error)
    assert "'orders-out': micro-batch 0 was already published" in text
    assert "another query" in text and "new option sinkId" in text
    assert drain(broker, "/queue/reset-out") == []  # nothing half-published
    assert _pipe(spark, broker, tmp_path / "ck", sink_id="orders-out-2") is None
    out = drain(broker, "/queue/reset-out")
    assert second <= set(out), f"lost {len(second - set(out))} of 1000"


def test_a_duplicate_answer_is_accepted_only_for_the_same_query_and_the_same_rows(broker):
    """The driver's commit, against the real broker without Spark: a replay of a published
    batch with the same rows - split into other tasks, in another order - is this query's own
    retry and passes; other rows from the same query, or any rows from another query, fail
    with SinkConflictError, and the broker keeps only the first publication."""
    import pytest

    from sluicemq.spark.options import SinkOptions
    from sluicemq.spark.writer import SinkConflictError, publish, stage_rows

    opts = SinkOptions.parse({"url": broker.url, "destination": "/queue/tok"}, streaming=True)
    rows = [{"body": f"r{i}", "headers": {"k": str(i)}} for i in range(6)]

    def commit(owner: str, *tasks: list[dict]) -> None:
        parts = [stage_rows(opts, "b0", iter(t), sink="q-s", owner=owner) for t in tasks]
        publish(opts, "b0", parts, label="micro-batch 0")

    commit("query-1", rows[:3], rows[3:])
    commit("query-1", rows[::-1][:2], rows[::-1][2:5], rows[::-1][5:])  # a replay: fine
    with pytest.raises(SinkConflictError, match="this same query with other content "
                                                r"\(6 rows then, 5 now\)"):
        commit("query-1", rows[:5])
    with pytest.raises(SinkConflictError, match=r"another query or write \(query-1\).*"
                                                "silently drop this batch's 6 rows"):
        commit("query-2", rows)
    assert sorted(drain(broker, "/queue/tok")) == sorted(f"r{i}" for i in range(6))
