"""Reading SluiceMQ from Spark: streaming micro-batches over broker seq ranges, batch browse.

Every spec runs a real local SparkSession against a real broker process.
"""

from __future__ import annotations

import json
from pathlib import Path

from sluice_testing import eventually
from sluicemq.client import Client


def send_many(broker, destination: str, n: int, *, prefix: str = "m") -> list[str]:
    bodies = [f"{prefix}-{i}" for i in range(n)]
    with Client(broker.url) as c:
        receipts = [c.send_async(destination, b, headers={"n": str(i)})
                    for i, b in enumerate(bodies)]
        for r in receipts:
            r.result(10)
    return bodies


def stream_once(spark, broker, tmp: Path, name: str, **options: str):
    """Run one availableNow query over `tmp`'s checkpoint; return the rows of its micro-batches
    and the query. (`name` labels the run.)"""
    rows: list = []
    reader = spark.readStream.format("sluice").option("url", broker.url)
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (reader.load().writeStream.queryName(name)
             .foreachBatch(lambda batch, _id: rows.extend(batch.collect()))
             .option("checkpointLocation", str(tmp / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    return rows, query


def retained(broker, destination: str) -> int:
    with Client(broker.url) as c:
        return c.head(destination).count


def test_a_streaming_query_reads_every_message_once_in_seq_order(spark, broker, tmp_path):
    bodies = send_many(broker, "/queue/orders", 40)
    rows, _ = stream_once(spark, broker, tmp_path, "orders1", destination="/queue/orders")
    got = sorted(rows, key=lambda r: r.offset)
    assert [bytes(r.body).decode() for r in got] == bodies
    assert all(r.destination == "/queue/orders" for r in got)
    assert [json.loads(r.headers)["n"] for r in got] == [str(i) for i in range(40)]
    assert all(r.message_id == f"ID:sluice-{r.offset}" and r.timestamp is not None
               and r.redelivered is False for r in got)
    assert len({r.offset for r in got}) == 40


def test_a_restarted_query_continues_after_its_checkpoint(spark, broker, tmp_path):
    send_many(broker, "/queue/resume", 10, prefix="first")
    first, _ = stream_once(spark, broker, tmp_path, "resume1", destination="/queue/resume")
    send_many(broker, "/queue/resume", 7, prefix="second")
    second, _ = stream_once(spark, broker, tmp_path, "resume2", destination="/queue/resume")
    assert sorted(bytes(r.body).decode() for r in first) == sorted(
        f"first-{i}" for i in range(10))
    assert sorted(bytes(r.body).decode() for r in second) == sorted(
        f"second-{i}" for i in range(7))


def test_committed_batches_are_removed_from_the_broker(spark, broker, tmp_path):
    send_many(broker, "/queue/retention", 25)
    stream_once(spark, broker, tmp_path, "ret1", destination="/queue/retention")
    # The source commits a batch when the next one is planned: a second run commits the first
    # (sent as the query ends, and carried out by the broker after it returned).
    stream_once(spark, broker, tmp_path, "ret2", destination="/queue/retention")
    eventually(lambda: retained(broker, "/queue/retention") == 0, "the commit carried out")


def test_max_messages_per_trigger_bounds_every_micro_batch(spark, broker, tmp_path):
    send_many(broker, "/queue/limited", 35)
    rows, query = stream_once(spark, broker, tmp_path, "limited", destination="/queue/limited",
                              maxMessagesPerTrigger="10")
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert len(rows) == 35
    assert max(sizes) <= 10 and sum(sizes) == 35


def test_a_durable_topic_subscription_retains_for_the_query(spark, broker, tmp_path):
    opts = {"destination": "/topic/prices", "subscription": "spark-prices"}
    rows, _ = stream_once(spark, broker, tmp_path, "prices0", **opts)  # creates the subscription
    assert rows == []
    send_many(broker, "/topic/prices", 12, prefix="tick")
    rows, _ = stream_once(spark, broker, tmp_path, "prices1", **opts)
    assert sorted(bytes(r.body).decode() for r in rows) == sorted(f"tick-{i}" for i in range(12))


def test_batch_read_browses_without_consuming(spark, broker):
    send_many(broker, "/queue/browse", 30)
    df = (spark.read.format("sluice").option("url", broker.url)
          .option("destination", "/queue/browse").option("partitions", "3").load())
    first = sorted(bytes(r.body).decode() for r in df.collect())
    again = sorted(bytes(r.body).decode() for r in df.collect())
    assert first == again == sorted(f"m-{i}" for i in range(30))
    assert retained(broker, "/queue/browse") == 30


def test_batch_read_can_consume(spark, broker):
    send_many(broker, "/queue/drain", 20)
    rows = (spark.read.format("sluice").option("url", broker.url)
            .option("destination", "/queue/drain").option("consume", "true").load().collect())
    assert len(rows) == 20
    assert retained(broker, "/queue/drain") == 0


def test_bad_options_fail_the_query_at_start(spark, broker):
    import pytest
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    for options in ({"destination": "orders"}, {"destination": "/topic/x"},
                    {"destination": "/queue/x", "mode": "files"}):
        reader = spark.read.format("sluice").option("url", broker.url)
        for k, v in options.items():
            reader = reader.option(k, v)
        with pytest.raises((PySparkException, Py4JJavaError)):
            reader.load().collect()


def batch_read(spark, broker, destination: str, **options: str) -> list:
    reader = (spark.read.format("sluice").option("url", broker.url)
              .option("destination", destination))
    for key, value in options.items():
        reader = reader.option(key, value)
    return sorted(reader.load().collect(), key=lambda r: r.offset)


def test_headers_come_as_json_a_map_named_columns_or_not_at_all(spark, broker):
    """Column batches (the default) and one frame per message (bulk=false) give the same rows
    in every header shape; a header a message lacks is null in its named column."""
    with Client(broker.url) as c:
        for i in range(30):
            extra = {"region": "eu"} if i % 3 == 0 else {}
            c.send("/queue/shapes", f"s{i}".encode(), {"n": str(i), **extra})
    for bulk in ("true", "false"):
        as_json = batch_read(spark, broker, "/queue/shapes", bulk=bulk)
        as_map = batch_read(spark, broker, "/queue/shapes", bulk=bulk, headers="map",
                            headerColumns="region,n")
        bare = batch_read(spark, broker, "/queue/shapes", bulk=bulk, headers="none")
        assert [json.loads(r.headers)["n"] for r in as_json] == [str(i) for i in range(30)]
        assert [r.headers["n"] for r in as_map] == [str(i) for i in range(30)]
        assert [r.region for r in as_map] == ["eu" if i % 3 == 0 else None for i in range(30)]
        assert [r.n for r in as_map] == [str(i) for i in range(30)]
        assert "headers" not in bare[0].asDict()
        assert [bytes(r.body) for r in bare] == [f"s{i}".encode() for i in range(30)]
        assert {json.loads(r.headers)["timestamp"] for r in as_json} == {
            str(int(r.timestamp.timestamp() * 1000)) for r in as_json}


def test_a_read_larger_than_a_column_batch_comes_whole_and_in_order(spark, broker):
    """Many batches per partition (batchBytes far below the data), a mix of small and
    large bodies, and a large one (bodies above 64 KiB live only in the journal)."""
    sizes = [10, 70_000, 5, 300_000, 1000] * 20
    with Client(broker.url) as c:
        receipts = [c.send_async("/queue/big", bytes([i % 251]) * n, headers={"i": str(i)})
                    for i, n in enumerate(sizes)]
        for r in receipts:
            r.result(30)
    rows = batch_read(spark, broker, "/queue/big", batchBytes="65536", headerColumns="i")
    assert [int(r.i) for r in rows] == list(range(len(sizes)))
    assert [bytes(r.body) for r in rows] == [bytes([i % 251]) * n for i, n in enumerate(sizes)]


def test_an_unknown_header_shape_fails_the_query_at_start(spark, broker):
    import pytest
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    for options, why in (({"headers": "xml"}, "option headers must be one of"),
                         ({"headerColumns": "offset"}, "would clash")):
        with pytest.raises((PySparkException, Py4JJavaError), match=why):
            batch_read(spark, broker, "/queue/shapes", **options)


def test_a_batch_read_of_an_empty_or_missing_queue_is_zero_rows(spark, broker):
    with Client(broker.url) as c:
        c.send("/queue/drained", "x")
        with c.subscribe("/queue/drained") as sub:
            assert sub.get(timeout=5) is not None
    for dest in ("/queue/drained", "/queue/never-sent"):
        df = spark.read.format("sluice").option("url", broker.url).option("destination", dest)
        assert df.load().count() == 0
        assert df.option("mode", "streams").load().collect() == []


def test_a_misspelt_option_fails_the_read_and_names_the_right_one(spark, broker):
    import pytest

    with pytest.raises(Exception, match=r"did you mean maxMessagesPerTrigger"):
        (spark.read.format("sluice").option("url", broker.url)
         .option("destination", "/queue/a").option("maxMessagesPerTriger", "5").load().collect())


PUSHDOWN = "spark.sql.python.filterPushdown.enabled"


def test_offset_filters_narrow_a_batch_read_when_pushdown_is_on(spark, broker):
    send_many(broker, "/queue/pushed", 30)
    with Client(broker.url) as c:
        first = c.head("/queue/pushed").first
    def df(**options: str):  # a fresh reader each time: DataFrameReader.option mutates it
        reader = spark.read.format("sluice").option("url", broker.url).option(
            "destination", "/queue/pushed").option("pushdown", "true")
        for key, value in options.items():
            reader = reader.option(key, value)
        return reader.load()

    spark.conf.set(PUSHDOWN, "true")
    try:
        some = df(consume="true").where(
            f"offset >= {first + 10} AND offset < {first + 20}").collect()
        listed = df().where(f"offset IN ({first + 1}, {first + 25})").collect()
        none = df().where(f"offset > {first + 100}").collect()
    finally:
        spark.conf.unset(PUSHDOWN)
    assert sorted(r.offset for r in some) == list(range(first + 10, first + 20))
    # only the pushed range was read, so only it was consumed: the rest is still there
    assert retained(broker, "/queue/pushed") == 20
    assert sorted(r.offset for r in listed) == [first + 1, first + 25]
    assert none == []


def test_header_equalities_go_to_the_broker_as_a_selector_when_pushdown_is_on(spark, broker):
    """Spark still checks these filters; the broker's selector only spares sending the rest
    (the selector itself is specified in tests/e2e/test_range_selectors.py)."""
    send_many(broker, "/queue/pushed-h", 30)
    with Client(broker.url) as c:
        first = c.head("/queue/pushed-h").first

    def df():
        return (spark.read.format("sluice").option("url", broker.url)
                .option("destination", "/queue/pushed-h").option("pushdown", "true")
                .option("headerColumns", "n").load())

    spark.conf.set(PUSHDOWN, "true")
    try:
        one = df().where("n = '7'").collect()
        listed = df().where(f"n IN ('1', '29', 'x''y') AND offset > {first + 1}").collect()
        quoted = df().where("n = 'it''s'").collect()
    finally:
        spark.conf.unset(PUSHDOWN)
    assert [(r.n, r.body) for r in one] == [("7", b"m-7")]
    assert sorted(r.n for r in listed) == ["29"]
    assert quoted == []
    assert retained(broker, "/queue/pushed-h") == 30, "browsing consumed nothing"
