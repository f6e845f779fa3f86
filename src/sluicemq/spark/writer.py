"""Writing rows as persistent messages, exactly once per batch.

Every task parks its rows on the broker as one invisible *stage part* (docs/replay-protocol.md,
section 3) and reports the part's name. The driver's commit publishes exactly the parts of the
tasks that succeeded, atomically; the broker remembers each published (sink, batch), so a
retried commit or a replayed micro-batch publishes nothing twice, and parts of failed task
attempts are discarded (or expire on the broker's timer when nobody tells it).

"Already published" is only good news when it was *this* batch: the publication carries a token
`<owner>:<rows>:<digest>` (owner = the streaming query's id, kept in its checkpoint, or the batch
write's id; digest = an order-free sum of per-row hashes, so a replay with other task
boundaries or row order still matches). A duplicate answer with another token means someone
else's batch holds this (sink, batch) name - typically a query restarted on a reset checkpoint
with the same `sinkId` - and our rows would vanish: the commit fails the query instead.

The default streaming sink id is `q-<query id>`: Spark stores the query id in the checkpoint
(`metadata`) and hands it to every task, so a restart of the query keeps it and a fresh
checkpoint gets a new one. Tasks read it (the driver-side writer is built before the id is
visible to Python) and report it with their part.

Rows need a `body` column (binary or string) and may have `headers` (map<string,string>) and
`destination` (string; else option `destination`). Staged messages are always persistent.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage

from sluicemq.spark.options import SinkOptions
from sluicemq.spark.ranges import connect

BATCH_ID_PROPERTY = "streaming.sql.batchId"  # set by Spark on every micro-batch's tasks
QUERY_ID_PROPERTY = "sql.streaming.queryId"  # the query id Spark keeps in the checkpoint
_DIGEST_MASK = (1 << 128) - 1


class SinkConflictError(RuntimeError):
    """The broker already holds a different publication under this (sink, batch): writing
    on would silently drop this batch's rows."""


@dataclass
class StagedPart(WriterCommitMessage):
    """What a successful task tells the driver: its parked part, the sink it parked it under,
    and its rows' count and digest (the driver sums them into the publication's token)."""

    part: str
    messages: int
    sink: str = ""
    owner: str = ""
    digest: int = 0


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


def row_digest(destination: str, body: bytes, headers: dict[str, str]) -> int:
    """A 128-bit hash of one message; a batch's digest is the sum of its rows' (mod 2^128),
    which does not depend on how rows are split into tasks or ordered."""
    h = hashlib.blake2b(repr((destination, sorted(headers.items()))).encode(), digest_size=16)
    h.update(body)
    return int.from_bytes(h.digest(), "big")


def stage_rows(opts: SinkOptions, batch: str, rows: Iterator[Any], *, sink: str,
               owner: str) -> StagedPart:
    """Park this task's rows as one part of (sink, batch); runs on an executor."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    where = f"p{ctx.partitionId()}-a{ctx.attemptNumber()}" if ctx is not None else "p"
    part = f"{where}-{uuid.uuid4().hex[:12]}"
    count = digest = 0
    with connect(opts.connection) as client, client.stage(sink, batch, part) as staged:
        for row in rows:
            destination, body, headers = _row_fields(row, opts.destination)
            staged.send(destination, body, headers)
            digest = (digest + row_digest(destination, body, headers)) & _DIGEST_MASK
            count += 1
    return StagedPart(part, count, sink, owner, digest)


def _staged(messages: Sequence[WriterCommitMessage | None]) -> list[StagedPart]:
    return [m for m in messages if isinstance(m, StagedPart)]


def publish(opts: SinkOptions, batch: str, messages: Sequence[WriterCommitMessage | None],
            *, label: str) -> None:
    """Driver side: make the successful tasks' parts visible, once; fail loudly when the
    broker already holds another publication under this name."""
    staged = _staged(messages)
    if not staged:
        return  # no task ran: nothing was staged, nothing to publish
    sink, owner = staged[0].sink, staged[0].owner
    rows = sum(m.messages for m in staged)
    digest = sum(m.digest for m in staged) & _DIGEST_MASK
    token = f"{owner}:{rows}:{digest:032x}"
    with connect(opts.connection) as client:
        answer = client.publish_stage(sink, batch, [m.part for m in staged], token)
    if answer.result == "duplicate" and answer.token != token:
        raise SinkConflictError(conflict_message(sink, label, token, answer.token,
                                                 explicit=opts.sink_id is not None))


def conflict_message(sink: str, label: str, ours: str, theirs: str | None, *,
                     explicit: bool) -> str:
    """Say what happened, what it would have cost, and how to get out."""
    owner, rows = ours.split(":")[:2]
    their_owner, their_rows = ([*theirs.split(":"), "?"][:2] if theirs is not None
                               else (None, "?"))
    head = f"sluice sink {sink!r}: {label} was already published on the broker by "
    new_id = ("give the query a new option sinkId" if not explicit else
              "choose a new option sinkId (or remove sinkId: the default, q-<query id>, is "
              "new for every fresh checkpoint)")
    if their_owner == owner:
        return (f"{head}this same query with other content ({their_rows} rows then, {rows} "
                f"now): the query's batches are not deterministic, so a replay cannot be told "
                f"from a different batch and the query stops. Make the batch deterministic, "
                f"or {new_id} to publish it again (its first publication stays: those rows "
                f"would then be out twice).")
    who = ("a writer that left no token (an older sluicemq, or another client)"
           if their_owner is None else f"another query or write ({their_owner})")
    return (f"{head}{who}. Publishing would silently drop this batch's {rows} rows, so the "
            f"query stops instead; its input is not marked done. Typical cause: the "
            f"checkpoint was deleted or reset but the sinkId was kept (the broker remembers "
            f"published batches for stage_memory, 7 days by default). To go on, {new_id}.")


def discard(opts: SinkOptions, batch: str, messages: Sequence[WriterCommitMessage | None]
            ) -> None:
    """Drop the batch's parked parts; without a sink id (no task reported one) they expire on
    the broker's stage_timeout instead."""
    staged = _staged(messages)
    sink = opts.sink_id or (staged[0].sink if staged else None)
    if sink is None:
        return
    with connect(opts.connection) as client:
        client.abort_stage(sink, batch)


class SluiceBatchWriter(DataSourceWriter):
    """`df.write.format("sluice")`: one batch per write job."""

    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts
        self.batch = uuid.uuid4().hex
        self.sink = opts.sink_id or f"w-{self.batch}"

    def write(self, iterator: Iterator[Any]) -> StagedPart:
        return stage_rows(self.opts, self.batch, iterator, sink=self.sink, owner=self.batch)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        publish(self.opts, self.batch, messages, label=f"write {self.batch}")

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        with connect(self.opts.connection) as client:
            client.abort_stage(self.sink, self.batch)


class SluiceStreamWriter(DataSourceStreamWriter):
    """`df.writeStream.format("sluice")`: one batch per micro-batch id; a replayed micro-batch
    has the same id, so the broker recognises it and publishes nothing twice."""

    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[Any]) -> StagedPart:
        batch, sink, owner = self.task_target()
        return stage_rows(self.opts, batch, iterator, sink=sink, owner=owner)

    def task_target(self) -> tuple[str, str, str]:
        """(batch, sink, owner) of the micro-batch this task writes, from Spark's task
        properties (runs on an executor)."""
        from pyspark import TaskContext

        ctx = TaskContext.get()
        batch = ctx.getLocalProperty(BATCH_ID_PROPERTY) if ctx is not None else None
        query = ctx.getLocalProperty(QUERY_ID_PROPERTY) if ctx is not None else None
        if batch is None or query is None:
            raise RuntimeError(f"Spark did not set {BATCH_ID_PROPERTY} and "
                               f"{QUERY_ID_PROPERTY} on this task")
        return f"b{batch}", self.opts.sink_id or f"q-{query}", query

    def commit(self, messages: list[WriterCommitMessage | None], batch_id: int) -> None:
        publish(self.opts, f"b{batch_id}", messages, label=f"micro-batch {batch_id}")

    def abort(self, messages: list[WriterCommitMessage | None], batch_id: int) -> None:
        discard(self.opts, f"b{batch_id}", messages)
