"""Writing rows as persistent messages, exactly once per batch.

Every task parks its rows on the broker as one invisible *stage part* (docs/replay-protocol.md,
section 3) and reports the part's name. The driver's commit publishes exactly the parts of the
tasks that succeeded, atomically; the broker remembers each published (sink, batch), so a
retried commit or a replayed micro-batch publishes nothing twice, and parts of failed task
attempts are discarded (or expire on the broker's timer when nobody tells it).

Rows need a `body` column (binary or string) and may have `headers` (map<string,string>) and
`destination` (string; else option `destination`). Staged messages are always persistent.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage

from sluicemq.spark.options import SinkOptions
from sluicemq.spark.ranges import connect

BATCH_ID_PROPERTY = "streaming.sql.batchId"  # set by Spark on every micro-batch's tasks


@dataclass
class StagedPart(WriterCommitMessage):
    """What a successful task tells the driver: the name of its parked part."""

    part: str
    messages: int


def _row_fields(row: Any, default_destination: str | None) -> tuple[str, bytes, dict[str, str]]:
    fields = row.asDict() if hasattr(row, "asDict") else dict(row)
    if "body" not in fields:
        raise ValueError("rows written to sluice need a `body` column")
    body = fields["body"]
    if body is None:
        body = b""
    elif isinstance(body, str):
        body = body.encode()
    else:
        body = bytes(body)
    destination = fields.get("destination") or default_destination
    if not destination:
        raise ValueError("no destination: add a `destination` column or option destination")
    headers = {str(k): str(v) for k, v in (fields.get("headers") or {}).items()}
    return destination, body, headers


def stage_rows(opts: SinkOptions, batch: str, rows: Iterator[Any]) -> StagedPart:
    """Park this task's rows as one part of (sink, batch); runs on an executor."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    where = f"p{ctx.partitionId()}-a{ctx.attemptNumber()}" if ctx is not None else "p"
    part = f"{where}-{uuid.uuid4().hex[:12]}"
    count = 0
    with connect(opts.connection) as client, client.stage(opts.sink_id, batch, part) as staged:
        for row in rows:
            destination, body, headers = _row_fields(row, opts.destination)
            staged.send(destination, body, headers)
            count += 1
    return StagedPart(part, count)


def publish(opts: SinkOptions, batch: str, messages: list[WriterCommitMessage | None]) -> None:
    """Driver side: make the successful tasks' parts visible, once."""
    parts = [m.part for m in messages if isinstance(m, StagedPart)]
    with connect(opts.connection) as client:
        client.publish_stage(opts.sink_id, batch, parts)


def discard(opts: SinkOptions, batch: str) -> None:
    with connect(opts.connection) as client:
        client.abort_stage(opts.sink_id, batch)


class SluiceBatchWriter(DataSourceWriter):
    """`df.write.format("sluice")`: one batch per write job."""

    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts
        self.batch = uuid.uuid4().hex

    def write(self, iterator: Iterator[Any]) -> StagedPart:
        return stage_rows(self.opts, self.batch, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:  # type: ignore[override]
        publish(self.opts, self.batch, messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:  # type: ignore[override]
        discard(self.opts, self.batch)


class SluiceStreamWriter(DataSourceStreamWriter):
    """`df.writeStream.format("sluice")`: one batch per micro-batch id; a replayed micro-batch
    has the same id, so the broker recognises it and publishes nothing twice."""

    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[Any]) -> StagedPart:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        batch = ctx.getLocalProperty(BATCH_ID_PROPERTY) if ctx is not None else None
        if batch is None:
            raise RuntimeError(f"Spark did not set {BATCH_ID_PROPERTY} on this task")
        return stage_rows(self.opts, f"b{batch}", iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batch_id: int) -> None:  # type: ignore[override]
        publish(self.opts, f"b{batch_id}", messages)

    def abort(self, messages: list[WriterCommitMessage | None], batch_id: int) -> None:  # type: ignore[override]
        discard(self.opts, f"b{batch_id}")
