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


def test_landed_files_are_deleted_once_their_batch_committed_when_asked(spark, broker,
                                                                         tmp_path):
    """streams.deleteCommitted: the landing copy lives as long as the batch that read it.
    The batch's own code reads it; once the batch is in Spark's commit log and the next one is
    planned, the file and its folder are gone."""
    out = tmp_path / "landing"
    src = make_file(tmp_path, "a.csv", 300_000)
    with Client(broker.url) as c:
        c.send_file("/queue/files", src, chunk_size=64 << 10)
    seen: list[tuple[str, bytes]] = []

    def consume(batch, _batch_id: int) -> None:  # what a job does with a landed file
        seen.extend((r.path, Path(r.path).read_bytes()) for r in batch.collect())

    query = (spark.readStream.format("sluice").option("url", broker.url)
             .option("destination", "/queue/files").option("mode", "streams")
             .option("streams.output", "path").option("path", str(out))
             .option("streams.deleteCommitted", "true").load()
             .writeStream.foreachBatch(consume)
             .option("checkpointLocation", str(tmp_path / "ck-landing"))
             .trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert query.exception() is None, query.exception()
    [(path, content)] = seen
    assert content == src.read_bytes()
    assert not Path(path).exists() and not Path(path).parent.exists()
