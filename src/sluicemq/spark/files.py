"""``streams.format``: the rows *inside* each complete file stream, parsed by Arrow's readers.

Why: a pipeline of files (CSV exports, JSON lines, Parquet) used to land every file on disk
(a second copy) and parse it with a second Spark job. Here a task assembles each stream of its
slice in memory (chunks in order, SHA-256 checked, as ``streams.output=binary`` does) and
parses it with pyarrow's multi-threaded C++ readers straight into record batches of the
query's schema: no landing copy, no Python step per row.

The schema is the user's (``.schema("region STRING, amount DOUBLE")``; ``text`` defaults to
``value STRING``). Columns named ``_stream_id``, ``_stream_name`` and ``_offset`` (BIGINT: the
stream's final chunk seq, its replay position) are filled from the stream rather than parsed.
A file that does not parse into the schema fails the task (Spark retries, then fails the
query): rows are never silently dropped.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sluicemq.spark.rows import stream_rows

FORMATS = ("csv", "json", "parquet", "text")
METADATA: dict[str, pa.DataType] = {"_stream_id": pa.string(), "_stream_name": pa.string(),
                                    "_offset": pa.int64()}
MAX_ROWS = 65_536  # rows per record batch handed to Spark


def arrow_schema(schema_json: str) -> pa.Schema:
    """The Arrow schema of a Spark schema given as ``StructType.json()`` (runs on executors)."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    return to_arrow_schema(StructType.fromJson(json.loads(schema_json)), timezone="UTC")


def parse(content: bytes, fmt: str, target: pa.Schema, csv_header: bool = True,
          delimiter: str = ",") -> pa.Table:
    """One file's rows in ``target`` (metadata columns excluded)."""
    names = target.names
    source = pa.BufferReader(content)
    if fmt == "csv":
        from pyarrow import csv

        read = csv.ReadOptions(column_names=None if csv_header else names,
                               block_size=8 << 20)
        convert = csv.ConvertOptions(column_types=dict(zip(names, target.types, strict=True)),
                                     include_columns=names)
        table = csv.read_csv(source, read_options=read,
                             parse_options=csv.ParseOptions(delimiter=delimiter),
                             convert_options=convert)
    elif fmt == "json":
        from pyarrow import json as pajson

        table = pajson.read_json(source, parse_options=pajson.ParseOptions(
            explicit_schema=target, unexpected_field_behavior="ignore"))
    elif fmt == "parquet":
        from pyarrow import parquet

        table = parquet.read_table(source, columns=names)
    else:
        text = content.decode("utf-8")
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        table = pa.table({names[0]: pa.array([line.rstrip("\r") for line in lines],
                                             pa.string())})
    return table.select(names).cast(target)


def file_batches(messages: Iterable[Any], fmt: str, schema_json: str,
                 options: dict[str, str]) -> Iterator[pa.RecordBatch]:
    """The parsed rows of every complete stream among ``messages`` (a streams-mode range)."""
    full = arrow_schema(schema_json)
    meta = [f for f in full if f.name in METADATA]
    target = pa.schema([f for f in full if f.name not in METADATA])
    header = options.get("streams.csv.header", "true").strip().lower() != "false"
    delimiter = options.get("streams.csv.delimiter", ",")
    for row in stream_rows(messages, "binary", None):
        stream_id, name, _size, _sha, content, _path, _dest, _headers, _ts, offset = row
        try:
            table = parse(content, fmt, target, header, delimiter)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, UnicodeDecodeError) as exc:
            raise ValueError(f"stream {stream_id} ({name!r}) does not parse as {fmt} into the "
                             f"query's schema: {exc}") from None
        values = {"_stream_id": stream_id, "_stream_name": name, "_offset": offset}
        for batch in table.to_batches(max_chunksize=MAX_ROWS):
            cols = {f.name: batch.column(f.name) for f in target}
            for f in meta:
                cols[f.name] = pa.array([values[f.name]], f.type).take(
                    pc.fill_null(pa.nulls(batch.num_rows, pa.int32()), 0))
            yield pa.RecordBatch.from_arrays([cols[f.name] for f in full], schema=full)
