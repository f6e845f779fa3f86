"""Payload layouts of the staged-publishing and memo records (record types 16-20).

Why a separate module: ``records.py`` holds the message store's own layouts; these belong to
staged publishing (docs/replay-protocol.md, section 3) and to the tables that must outlive the
records they were learnt from (published batches, producer sequence numbers).

* ``STAGE``: one record of a staged part. Same layout as a ``TX`` record (``records.encode_tx``),
  so a published message can point into it with an ``inner`` offset exactly like a transaction's
  message; the "transaction id" is a JSON list ``[sink, batch, part, attempt, created_ms]``,
  plus the owner (the user who staged it) when security is on.
  A big part is several records, the last one ``final``; the message ids inside are 0: a staged
  message gets its id when it is published.
* ``STAGE_PUBLISH``: a batch published: which part records (and how many messages each holds),
  in order, and the first message id (``base``); message ``i`` of the publication has id
  ``base + i``, even when some of those records were deleted since (all their messages consumed).
  ``token``, the publisher's token, is there only when it gave one (older records lack it).
* ``STAGE_DISCARD``: parked parts dropped (abort, timeout): ``[sink, batch, part, attempt]``,
  plus the owner when there is one.

Owners were added later as optional trailing fields (a key ``owner`` in STAGE_PUBLISH): records
without one are read as ownerless, so older data dirs replay unchanged. Tokens and owners are
independent optional keys of STAGE_PUBLISH.
* ``MEMO_PUBLISHED``, ``MEMO_PRODUCERS``: a whole table as of that point of the log
  (``core/persistence/anchor.py``): the published batches, the producers' highest sequence numbers.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sluicemq.storage import records
from sluicemq.storage.segment import Location

STAGE = 16
STAGE_PUBLISH = 17
STAGE_DISCARD = 18
MEMO_PUBLISHED = 19
MEMO_PRODUCERS = 20


@dataclass(frozen=True, slots=True)
class StageMeta:
    """Which part (and which attempt at staging it) a STAGE record belongs to."""

    sink: str
    batch: str
    part: str
    attempt: int
    created_ms: int
    owner: str | None = None

    def txid(self) -> str:
        fields: list[Any] = [self.sink, self.batch, self.part, self.attempt, self.created_ms]
        if self.owner is not None:
            fields.append(self.owner)
        return json.dumps(fields, separators=(",", ":"))


def encode_stage(meta: StageMeta, ops: Iterable[tuple[int, bytes]], *, final: bool) -> bytes:
    return records.encode_tx(meta.txid(), ops, final=final)


def encode_stage_ops(meta: StageMeta, encoded: Iterable[bytes | memoryview], *,
                     final: bool) -> bytes:
    """``encode_stage`` of operations already laid out (``records.encode_op`` or blocks)."""
    return records.encode_tx_ops(meta.txid(), encoded, final=final)


def decode_stage(payload: bytes | memoryview
                 ) -> tuple[StageMeta, str, bool, list[tuple[int, memoryview]]]:
    """(meta, the raw txid for ``records.tx_op_offsets``, final, ops)."""
    txid, final, ops = records.decode_tx(payload)
    sink, batch, part, attempt, created, *owner = json.loads(txid)
    return (StageMeta(sink, batch, part, attempt, created, owner[0] if owner else None), txid,
            final, ops)


@dataclass(frozen=True, slots=True)
class Publication:
    """A STAGE_PUBLISH record: ``parts`` are (name, [(record location, messages in it)]) in
    publication order."""

    sink: str
    batch: str
    base: int
    count: int
    at_ms: int
    parts: list[tuple[str, list[tuple[Location, int]]]]
    token: str | None = None
    owner: str | None = None


def encode_publish(p: Publication) -> bytes:
    d: dict[str, Any] = {
        "sink": p.sink, "batch": p.batch, "base": p.base, "count": p.count, "at": p.at_ms,
        "parts": [[name, [[loc.segment, loc.offset, loc.length, n] for loc, n in recs]]
                  for name, recs in p.parts],
    }
    if p.token is not None:
        d["token"] = p.token
    if p.owner is not None:
        d["owner"] = p.owner
    return json.dumps(d, separators=(",", ":")).encode()


def decode_publish(payload: bytes | memoryview) -> Publication:
    d = json.loads(bytes(payload))
    return Publication(d["sink"], d["batch"], d["base"], d["count"], d["at"],
                       [(name, [(Location(s, o, n), c) for s, o, n, c in recs])
                        for name, recs in d["parts"]], d.get("token"), d.get("owner"))


Discarded = tuple[str, str, str, int, str | None]  # sink, batch, part, attempt, owner


def encode_discard(parts: Iterable[Discarded]) -> bytes:
    return json.dumps([list(p) if p[4] is not None else list(p[:4]) for p in parts],
                      separators=(",", ":")).encode()


def decode_discard(payload: bytes | memoryview) -> list[Discarded]:
    return [(s, b, p, a, o[0] if o else None) for s, b, p, a, *o in json.loads(bytes(payload))]


def encode_memo(table: str, entries: Any) -> bytes:
    return json.dumps({"table": table, "entries": entries}, separators=(",", ":")).encode()


def decode_memo(payload: bytes | memoryview) -> tuple[str, Any]:
    d = json.loads(bytes(payload))
    return d["table"], d["entries"]
