"""Staged publishing, the bookkeeping (docs/replay-protocol.md, section 3).

Sans-IO: names and headers are parsed here, parked parts and the memory of published batches
are kept here; journal records and routing are ``stager.py``'s, frames ``frames.py``'s.

With security on, a batch belongs to the user who stages or publishes it: every key below
starts with that owner (None: security off, or data written before owners were recorded), so
one user's parts, publications and aborts never meet another's batch of the same name.
Entries without an owner stay visible to every user (``StageBook.scope``), so a data dir from
before owners keeps its exactly-once memory.

A parked part is its journal records plus, per message, just what publication needs to make the
message visible without reading it back: its destination key, priority, offset inside the
record and body size (about 11 bytes a message in arrays).
"""

from __future__ import annotations

import re
from array import array
from dataclasses import dataclass, field
from typing import Any

from sluicemq.core.routing import keys
from sluicemq.errors import ProtocolError
from sluicemq.storage import records
from sluicemq.storage.segment import Location
from sluicemq.storage.store import TicketLike

STAGE = "sluice-stage"  # BEGIN: sink/batch/part
STAGE_COMMIT = "sluice-stage-commit"  # COMMIT: sink/batch to publish
STAGE_PARTS = "sluice-stage-parts"  # with it: part,part,...
STAGE_ABORT = "sluice-stage-abort"  # ABORT: sink/batch to discard
RESULT = "sluice-stage-result"  # on RECEIPTs: staged | published | duplicate | discarded
MESSAGES = "sluice-stage-messages"  # on RECEIPTs: how many messages
DISCARDED = "sluice-stage-discarded"  # on ABORT's RECEIPT: parts discarded
TOKEN = "sluice-stage-token"  # on a publication: the publisher's token; on a duplicate: the first's
STAGED, PUBLISHED, DUPLICATE = "staged", "published", "duplicate"

_NAME = re.compile(r"[A-Za-z0-9._:-]{1,200}")


def stored_owner(owner: str | None) -> bytes:
    """A batch owner as its records name the sender and the per-user share of the store
    counts it (``records.encode_owner``; b"": nobody's, security off - the anonymous user)."""
    return records.encode_owner(owner) if owner is not None else b""


def parse_names(value: str | None, header: str, count: int) -> tuple[str, ...]:
    """``sink/batch`` (count 2) or ``sink/batch/part`` (count 3), each name checked."""
    what = "/".join(("sink", "batch", "part")[:count])
    names = tuple((value or "").split("/"))
    if len(names) != count or not all(_NAME.fullmatch(n) for n in names):
        raise ProtocolError(f"invalid {header} {str(value)[:100]!r}: expected {what}, each "
                            "1-200 characters of A-Z a-z 0-9 . _ : -", fatal=False)
    return names


def parse_token(value: str | None) -> str | None:
    """A publication's optional token: what lets a publisher tell its own retry (same token)
    from someone else's publication of the same batch (another token)."""
    if value is None:
        return None
    if not _NAME.fullmatch(value):
        raise ProtocolError(f"invalid {TOKEN} {value[:100]!r}: expected 1-200 characters of "
                            "A-Z a-z 0-9 . _ : -", fatal=False)
    return value


def parse_parts(value: str | None) -> list[str]:
    """The comma-separated part list of a publication (empty: a batch with no parts)."""
    if value is None:
        raise ProtocolError(f"a stage publication needs {STAGE_PARTS} (empty for no parts)",
                            fatal=False)
    parts = [p.strip() for p in value.split(",")] if value.strip() else []
    bad = [p for p in parts if not _NAME.fullmatch(p)]
    if bad:
        raise ProtocolError(f"invalid part name {bad[0][:100]!r} in {STAGE_PARTS}", fatal=False)
    if len(set(parts)) != len(parts):
        raise ProtocolError(f"{STAGE_PARTS} names a part twice", fatal=False)
    return parts


class StagedRecord:
    """One journal record of a parked part and the routing facts of each message in it."""

    __slots__ = ("inner", "keys", "kidx", "prio", "size", "ticket")

    def __init__(self, ticket: TicketLike) -> None:
        self.ticket = ticket
        self.keys: list[str] = []  # distinct destination keys (routing.keys: q:NAME, t:NAME)
        self.kidx = array("H")
        self.prio = array("B")
        self.inner = array("I")
        self.size = array("I")

    @property
    def loc(self) -> Location:
        """Where the record is in the journal (known from its append on; a record whose write
        failed has none, and its part cannot be published)."""
        loc = self.ticket.loc
        if loc is None:
            raise RuntimeError("a parked part's record has no journal location")
        return loc

    def add(self, key: str, priority: int, inner: int, size: int) -> None:
        try:
            k = self.keys.index(key)
        except ValueError:
            k = len(self.keys)
            self.keys.append(key)
        self.kidx.append(k)
        self.prio.append(priority)
        self.inner.append(inner)
        self.size.append(size)

    def add_rows(self, key: str, priority: bytes, inner: array, size: array) -> None:
        """``add`` for many messages of one key: column-wise appends."""
        try:
            k = self.keys.index(key)
        except ValueError:
            k = len(self.keys)
            self.keys.append(key)
        self.kidx.extend(array("H", [k]) * len(priority))
        self.prio.frombytes(priority)
        self.inner.extend(inner)
        self.size.extend(size)

    def __len__(self) -> int:
        return len(self.kidx)

    @property
    def body_bytes(self) -> int:
        return sum(self.size)


@dataclass(slots=True)
class ParkedPart:
    """A committed, invisible part: one attempt at staging ``sink/batch/part``."""

    sink: str
    batch: str
    part: str
    attempt: int
    created_ms: int
    owner: str | None = None  # the user who staged it (None: security off, or older data)
    records: list[StagedRecord] = field(default_factory=list)

    @property
    def count(self) -> int:
        return sum(len(r) for r in self.records)

    @property
    def tickets(self) -> list[TicketLike]:
        return [r.ticket for r in self.records]

    @property
    def ident(self) -> tuple[str, str, str, int, str | None]:
        return (self.sink, self.batch, self.part, self.attempt, self.owner)

    @property
    def batch_key(self) -> BatchKey:
        return (self.owner, self.sink, self.batch)


BatchKey = tuple[str | None, str, str]  # (owner, sink, batch)


class StageBook:
    """Parked parts by batch, and the published batches remembered per (owner, sink)."""

    def __init__(self, max_per_sink: int = 10_000) -> None:
        self.max_per_sink = max_per_sink
        self.parked: dict[BatchKey, dict[str, ParkedPart]] = {}
        # (owner, sink) -> batch -> (published at ms, messages, token)
        self.published: dict[tuple[str | None, str], dict[str, tuple[int, int, str | None]]] = {}

    def scope(self, owner: str | None, sink: str, batch: str) -> BatchKey:
        """Whose batch ``owner`` acts on: its own, unless only an ownerless one (older data)
        of that name exists."""
        own = (owner, sink, batch)
        if owner is None or own in self.parked or self.published_count(own) is not None:
            return own
        legacy = (None, sink, batch)
        if legacy in self.parked or self.published_count(legacy) is not None:
            return legacy
        return own

    # -- parked parts ------------------------------------------------------------------------
    def park(self, part: ParkedPart) -> ParkedPart | None:
        """Add a part; returns the earlier attempt it replaces, if any."""
        batch = self.parked.setdefault(part.batch_key, {})
        old = batch.get(part.part)
        batch[part.part] = part
        return old

    def parts_of(self, key: BatchKey) -> dict[str, ParkedPart]:
        return self.parked.get(key, {})

    def destinations(self, key: BatchKey) -> set[tuple[str, str]]:
        """("queue" or "topic", name) of every destination the batch's parked parts would
        publish to."""
        return {(keys.kind_of(k), keys.name_of(k)) for part in self.parts_of(key).values()
                for rec in part.records for k in rec.keys}

    def take_batch(self, key: BatchKey) -> list[ParkedPart]:
        return list(self.parked.pop(key, {}).values())

    def take(self, found: ParkedPart) -> ParkedPart | None:
        """Remove this attempt (a newer attempt of the same part is left alone)."""
        parts = self.parked.get(found.batch_key)
        if parts is None or parts.get(found.part) is not found:
            return None
        del parts[found.part]
        if not parts:
            del self.parked[found.batch_key]
        return found

    def all_parts(self) -> list[ParkedPart]:
        return [p for parts in self.parked.values() for p in parts.values()]

    def expired(self, now_ms: int, timeout_ms: int) -> list[ParkedPart]:
        return [p for p in self.all_parts() if now_ms - p.created_ms > timeout_ms]

    # -- published batches -------------------------------------------------------------------
    def published_count(self, key: BatchKey) -> int | None:
        """How many messages the batch's publication made visible; None: not published."""
        owner, sink, batch = key
        entry = self.published.get((owner, sink), {}).get(batch)
        return entry[1] if entry is not None else None

    def published_token(self, key: BatchKey) -> str | None:
        """The token the batch was published with (None: none, or not published)."""
        owner, sink, batch = key
        entry = self.published.get((owner, sink), {}).get(batch)
        return entry[2] if entry is not None else None

    def remember(self, key: BatchKey, at_ms: int, count: int,
                 token: str | None = None) -> None:
        owner, sink, batch = key
        batches = self.published.setdefault((owner, sink), {})
        batches.pop(batch, None)
        batches[batch] = (at_ms, count, token)
        while len(batches) > self.max_per_sink:
            del batches[next(iter(batches))]

    def forget_older(self, before_ms: int) -> int:
        """Forget batches published before ``before_ms``; returns how many."""
        forgotten = 0
        for scope in list(self.published):
            batches = self.published[scope]
            for batch in [b for b, (at, _, _) in batches.items() if at < before_ms]:
                del batches[batch]
                forgotten += 1
            if not batches:
                del self.published[scope]
        return forgotten

    @property
    def remembered(self) -> int:
        return sum(len(b) for b in self.published.values())

    def dump_memory(self) -> list[list[Any]]:
        """Rows ``[sink, batch, at, n]``, then the token and the owner when there are any:
        ``[..., token]`` or ``[..., token or null, owner]`` (older rows have four)."""
        rows: list[list[Any]] = []
        for (owner, sink), batches in self.published.items():
            for batch, (at, n, token) in batches.items():
                row: list[Any] = [sink, batch, at, n]
                if token is not None or owner is not None:
                    row.append(token)
                if owner is not None:
                    row.append(owner)
                rows.append(row)
        return rows

    def load_memory(self, rows: list[list[Any]]) -> None:
        self.published = {}
        for sink, batch, at, n, *rest in rows:
            token = rest[0] if rest else None
            owner = rest[1] if len(rest) > 1 else None
            self.remember((owner, sink, batch), at, n, token)
