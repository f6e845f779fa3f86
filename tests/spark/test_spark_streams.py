"""File-stream mode: one row per *complete* large stream, assembled and SHA-256 checked,
with the content as bytes or written to a path."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from sluicemq.client import Client


def make_file(folder: Path, name: str, size: int) -> Path:
    path = folder / name
    path.write_bytes(os.urandom(size))
    return path


def read_streams(spark, broker, tmp: Path, name: str, **options: str) -> list:
    reader = (spark.readStream.format("sluice").option("url", broker.url)
              .option("destination", "/queue/files").option("mode", "streams"))
    for key, value in options.items():
        reader = reader.option(key, value)
    rows: list = []
    query = (reader.load().writeStream.queryName(name)
             .foreachBatch(lambda batch, _id: rows.extend(batch.collect()))
             .option("checkpointLocation", str(tmp / f"ck-{name}"))
             .trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert query.exception() is None, query.exception()
    return rows


def test_each_complete_stream_is_one_row_with_its_bytes(spark, broker, tmp_path):
    files = [make_file(tmp_path, f"f{i}.bin", size)
             for i, size in enumerate((0, 1, 100_000, 700_000))]
    with Client(broker.url) as c:
        for f in files:
            c.send_file("/queue/files", f, chunk_size=64 << 10)
        c.send("/queue/files", "not a stream")  # plain messages are skipped in this mode
    rows = read_streams(spark, broker, tmp_path, "streams_binary")
    by_name = {r.name: r for r in rows}
    assert sorted(by_name) == sorted(f.name for f in files)
    for f in files:
        row = by_name[f.name]
        data = f.read_bytes()
        assert bytes(row.content) == data and row.size == len(data) and row.path is None
        assert row.sha256 == hashlib.sha256(data).hexdigest()


def test_path_output_writes_verified_files(spark, broker, tmp_path):
    out = tmp_path / "landing"
    src = make_file(tmp_path, "big.csv", 3 << 20)
    with Client(broker.url) as c:
        c.send_file("/queue/files", src, chunk_size=256 << 10)
    rows = read_streams(spark, broker, tmp_path, "streams_path",
                        **{"streams.output": "path", "path": str(out)})
    assert len(rows) == 1
    row = rows[0]
    assert row.content is None and Path(row.path).read_bytes() == src.read_bytes()
    assert Path(row.path).name == "big.csv"
    assert not list(out.rglob("*.part"))


def test_an_unfinished_stream_waits_for_its_final_chunk(spark, broker, tmp_path):
    with Client(broker.url) as c:
        writer = c.stream_writer("/queue/files", "slow.bin", chunk_size=1024)
        writer.write(b"x" * 5000)  # chunks stored, final chunk not sent yet
        assert read_streams(spark, broker, tmp_path, "unfinished1") == []
        writer.close()
    rows = read_streams(spark, broker, tmp_path, "unfinished1b")
    assert [(r.name, r.size) for r in rows] == [("slow.bin", 5000)]
