"""``streams.format``: the rows inside each complete file stream, parsed by Arrow's readers in
the source (csv, json lines, parquet, text), with no landing copy; metadata columns say which
stream a row came from; a file that does not fit the schema fails the query."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sluicemq.client import Client


def send_files(broker, destination: str, files: dict[str, bytes], tmp: Path) -> None:
    with Client(broker.url) as c:
        for name, data in files.items():
            path = tmp / name
            path.write_bytes(data)
            c.send_file(destination, path, chunk_size=16 << 10)


def rows_of(spark, broker, tmp: Path, destination: str, schema: str | None,
            **options: str) -> list:
    reader = (spark.readStream.format("sluice").option("url", broker.url)
              .option("destination", destination))
    if schema is not None:
        reader = reader.schema(schema)
    for key, value in options.items():
        reader = reader.option(key, value)
    out: list = []
    query = (reader.load().writeStream
             .foreachBatch(lambda batch, _id: out.extend(batch.collect()))
             .option("checkpointLocation", str(tmp / f"ck-{destination[7:]}"))
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination(180)
    except Exception as exc:  # the query's own failure, re-raised by awaitTermination
        raise RuntimeError(str(exc)) from None
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    return out


def test_csv_files_come_out_as_their_rows_with_stream_metadata(spark, broker, tmp_path):
    files = {f"orders-{k}.csv": ("region,product,quantity,unit_price\n" + "".join(
        f"eu,p{i},{i},{i}.50\n" for i in range(k * 100, k * 100 + 100 + k))).encode()
        for k in range(3)}  # one file spans several 16 KiB chunks
    files["orders-3.csv"] = b"region,product,quantity,unit_price\n" + b"us,big,1,2.00\n" * 5000
    send_files(broker, "/queue/csv", files, tmp_path)
    rows = rows_of(spark, broker, tmp_path, "/queue/csv",
                   "region STRING, quantity INT, unit_price DECIMAL(12,2), "
                   "_stream_name STRING, _offset BIGINT", **{"streams.format": "csv"})
    by_file: dict[str, list] = {}
    for r in rows:
        by_file.setdefault(r._stream_name, []).append(r)
    assert sorted(by_file) == sorted(files)
    for k in range(3):
        got = by_file[f"orders-{k}.csv"]
        assert [r.quantity for r in got] == list(range(k * 100, k * 100 + 100 + k))
        assert str(got[0].unit_price) == f"{k * 100}.50" and got[0].region == "eu"
        assert len({r._offset for r in got}) == 1
    assert len(by_file["orders-3.csv"]) == 5000


def test_json_lines_parquet_and_text_files(spark, broker, tmp_path):
    lines = b"".join(json.dumps({"id": i, "name": f"n{i}", "extra": True}).encode() + b"\n"
                     for i in range(50))
    send_files(broker, "/queue/jsonl", {"a.jsonl": lines}, tmp_path)
    got = rows_of(spark, broker, tmp_path, "/queue/jsonl", "id BIGINT, name STRING",
                  **{"streams.format": "json"})
    assert sorted((r.id, r.name) for r in got) == [(i, f"n{i}") for i in range(50)]

    buf = io.BytesIO()
    pq.write_table(pa.table({"x": list(range(1000)), "y": [f"v{i}" for i in range(1000)]}), buf)
    send_files(broker, "/queue/pq", {"t.parquet": buf.getvalue()}, tmp_path)
    got = rows_of(spark, broker, tmp_path, "/queue/pq", "x BIGINT, y STRING",
                  **{"streams.format": "parquet"})
    assert sorted(r.x for r in got) == list(range(1000))

    send_files(broker, "/queue/text", {"log.txt": b"one\ntwo\r\nthree\n"}, tmp_path)
    got = rows_of(spark, broker, tmp_path, "/queue/text", None, **{"streams.format": "text"})
    assert sorted(r.value for r in got) == ["one", "three", "two"]


def test_a_file_that_does_not_fit_the_schema_fails_the_query(spark, broker, tmp_path):
    send_files(broker, "/queue/badcsv", {"bad.csv": b"quantity\nnot-a-number\n"}, tmp_path)
    with pytest.raises(RuntimeError, match="does not parse as csv"):
        rows_of(spark, broker, tmp_path, "/queue/badcsv", "quantity INT",
                **{"streams.format": "csv"})


def test_csv_needs_a_schema_and_a_known_format(spark, broker, tmp_path):
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    for schema, options, says in ((None, {"streams.format": "csv"}, "give their schema"),
                                  ("a INT", {"streams.format": "xml"}, "must be one of")):
        with pytest.raises((PySparkException, Py4JJavaError, RuntimeError), match=says):
            rows_of(spark, broker, tmp_path, "/queue/nothing", schema, **options)
