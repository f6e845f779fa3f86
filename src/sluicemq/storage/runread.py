"""Runs of plain MSG records read straight into columns: a backlog's range read, vectorised.

Why its own path: a column batch of a backlog is thousands of MSG records lying back to back
in the journal, and its cost is what is done per record. Here the records' locations arrive
as arrays (the cursor's slot columns), neighbouring records come from one ``pread``, and every
fixed field of every record (the journal header and the MSG head, 48 bytes) is gathered and
checked with array operations; what is left per record in Python is one checksum call and the
two slices that cut out its headers and body.

What is verified, and why that is enough: every record's magic, type, stored length (which
must be the index's) and payload checksum, and that the message id inside the checksummed
payload is the seq the index holds for it. The header checksum exists to catch a record
read from the wrong place; a checksummed payload carrying the expected id and length *is*
the record asked for. Where the ids differ (a record read under another seq) the whole
record is checked the way ``Journal.read_many`` does.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from sluicemq.errors import StorageError
from sluicemq.storage import records
from sluicemq.storage.checksum import crc32
from sluicemq.storage.segment import HEADER_SIZE, MAGIC, Location, intact_at

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from sluicemq.storage.headerkey import HeaderKey
    from sluicemq.storage.journal import Journal

# The journal's record header (segment.HEADER) and a MSG payload's fixed head
# (records.MSG_HEAD) as one packed little-endian record of 48 bytes.
_HEAD = np.dtype([("magic", "<u2"), ("rtype", "u1"), ("rflags", "u1"), ("length", "<u4"),
                  ("pcrc", "<u4"), ("hcrc", "<u4"), ("mid", "<u8"), ("ts", "<i8"),
                  ("expires", "<i8"), ("priority", "u1"), ("flags", "u1"), ("klen", "<u2"),
                  ("hlen", "<u4")])
assert _HEAD.itemsize == HEADER_SIZE + records.MSG_HEAD.size
_MAGIC = int.from_bytes(MAGIC, "little")
_PAYLOAD_AT = HEADER_SIZE + records.MSG_HEAD.size  # where the key starts in a record
GAP = 64 << 10  # other records bridged inside one read (read, never sent)
SPAN = 16 << 20  # the most one read covers


@dataclass(frozen=True, slots=True)
class RunColumns:
    """The columns of a run of messages, in the order asked for; ``headers``/``bodies`` are
    the stored header JSON and the bodies back to back, cut by the ``*_lengths``."""

    timestamps: NDArray[np.int64]
    expires: NDArray[np.int64]
    header_lengths: NDArray[np.int64]
    headers: bytes
    body_lengths: NDArray[np.int64]
    bodies: bytes


@dataclass(frozen=True, slots=True)
class RunSpans:
    """A run of messages as the records themselves: ``pieces`` are the records' bytes as read
    (neighbouring records in one piece, nothing else in any), ``spans`` the little-endian i32
    (headers start, body start, body end) of each message counted from ``base`` (the offset
    the caller's data gives the first piece)."""

    timestamps: NDArray[np.int64]
    expires: NDArray[np.int64]
    spans: bytes
    pieces: list[memoryview]


@dataclass(frozen=True, slots=True)
class _Group:
    """One read of neighbouring records, verified: ``at``/``h``/``b``/``e`` are each record's
    start, headers start, body start and end in ``buf``."""

    buf: memoryview
    head: NDArray[np.void]
    at: NDArray[np.int64]
    h: NDArray[np.int64]
    b: NDArray[np.int64]
    e: NDArray[np.int64]


def message_columns(journal: Journal, mids: NDArray[np.uint64], segs: NDArray[np.uint32],
                    offs: NDArray[np.uint64], lengths: NDArray[np.uint32]) -> RunColumns:
    """The MSG records at (``segs``, ``offs``) of payload ``lengths``, each a whole record
    (not one inside a transaction) already written to its segment file (see
    ``Journal.unwritten_from``), which the index holds under ``mids``, with their values
    copied together; raises StorageError for any record that is not intact."""
    groups = list(_read(journal, mids, segs, offs, lengths))
    if not groups:
        empty = np.zeros(0, np.int64)
        return RunColumns(empty, empty, empty, b"", empty, b"")
    heads: list[memoryview] = []
    bodies: list[memoryview] = []
    for g in groups:
        hl, bl, el = g.h.tolist(), g.b.tolist(), g.e.tolist()
        heads += [g.buf[x:y] for x, y in zip(hl, bl, strict=True)]
        bodies += [g.buf[x:y] for x, y in zip(bl, el, strict=True)]
    return RunColumns(np.concatenate([g.head["ts"] for g in groups]),
                      np.concatenate([g.head["expires"] for g in groups]),
                      np.concatenate([g.b - g.h for g in groups]), b"".join(heads),
                      np.concatenate([g.e - g.b for g in groups]), b"".join(bodies))


def message_spans(journal: Journal, mids: NDArray[np.uint64], segs: NDArray[np.uint32],
                  offs: NDArray[np.uint64], lengths: NDArray[np.uint32],
                  base: int) -> RunSpans:
    """``message_columns`` without copying the values: the records as pieces and where each
    message's headers and body lie in them (see ``RunSpans``)."""
    ts: list[NDArray[np.int64]] = []
    exp: list[NDArray[np.int64]] = []
    spans: list[NDArray[np.int64]] = []
    pieces: list[memoryview] = []
    for g in _read(journal, mids, segs, offs, lengths):
        starts_run = np.concatenate(([True], g.at[1:] != g.e[:-1]))  # not adjacent: new piece
        first = np.flatnonzero(starts_run)
        lo = g.at[first]
        hi = g.e[np.append(first[1:], len(g.at)) - 1]
        sizes = hi - lo
        starts = base + np.cumsum(sizes) - sizes  # where each piece lands in the data
        shift = (starts - lo)[np.cumsum(starts_run) - 1]
        spans.append(np.stack((g.h + shift, g.b + shift, g.e + shift), axis=1).ravel())
        pieces += [g.buf[x:y] for x, y in zip(lo.tolist(), hi.tolist(), strict=True)]
        base += int(sizes.sum())
        ts.append(g.head["ts"])
        exp.append(g.head["expires"])
    if not pieces:
        empty = np.zeros(0, np.int64)
        return RunSpans(empty, empty, b"", [])
    return RunSpans(np.concatenate(ts), np.concatenate(exp),
                    np.concatenate(spans).astype("<i4").tobytes(), pieces)


def _read(journal: Journal, mids: NDArray[np.uint64], segs: NDArray[np.uint32],
          offs: NDArray[np.uint64], lengths: NDArray[np.uint32]) -> Iterator[_Group]:
    """The records in groups read with one ``pread`` each, every record verified."""
    seg = segs.astype(np.int64)
    off = offs.astype(np.int64)
    size = lengths.astype(np.int64)
    if len(off) and int(size.min()) < records.MSG_HEAD.size:
        k = int(np.argmin(size))
        raise _bad(seg, off, size, mids, k, "not the whole MSG record")
    end = off + HEADER_SIZE + size
    for i, j in _groups(seg, off, end):
        buf = journal.read_extent(int(seg[i]), int(off[i]), int(end[j - 1]))
        at = off[i:j] - off[i]
        # each record's first 48 bytes as rows (a strided window, rows copied out whole)
        head = sliding_window_view(np.frombuffer(buf, np.uint8), _HEAD.itemsize)[at]
        head = head.reshape(-1).view(_HEAD)
        _check(buf, head, at, seg[i:j], off[i:j], size[i:j], mids[i:j], journal.header_key)
        h = at + _PAYLOAD_AT + head["klen"]
        owned = np.flatnonzero(head["flags"] & records.OWNER_FLAG)
        if len(owned):  # the sender's login before the key: u16 length + its bytes
            raw = np.frombuffer(buf, np.uint8)
            p = at[owned] + _PAYLOAD_AT
            h[owned] += 2 + raw[p].astype(np.int64) + (raw[p + 1].astype(np.int64) << 8)
        b = h + head["hlen"]
        e = at + HEADER_SIZE + size[i:j]
        if bool((b > e).any()):
            k = i + int(np.argmax(b > e))
            raise _bad(seg, off, size, mids, k, "headers run past the record")
        yield _Group(buf, head, at, h, b, e)


def _groups(seg: NDArray[np.int64], off: NDArray[np.int64], end: NDArray[np.int64]
            ) -> list[tuple[int, int]]:
    """``[i, j)`` index ranges read with one ``pread`` each: records of one segment in
    ascending order with gaps of at most ``GAP`` bytes between them, ``SPAN`` bytes at most."""
    n = len(seg)
    if n == 0:
        return []
    cut = (seg[1:] != seg[:-1]) | (off[1:] < end[:-1]) | (off[1:] - end[:-1] > GAP)
    starts = [0, *(np.flatnonzero(cut) + 1).tolist(), n]
    out: list[tuple[int, int]] = []
    for i, j in pairwise(starts):
        while i < j:  # cut a long group where its extent passes SPAN (at least one record)
            k = int(np.searchsorted(end[i:j], off[i] + SPAN, side="right")) + i
            k = max(k, i + 1)
            out.append((i, k))
            i = k
    return out


def _check(buf: memoryview, head: NDArray[np.void], at: NDArray[np.int64],
           seg: NDArray[np.int64], off: NDArray[np.int64], size: NDArray[np.int64],
           mids: NDArray[np.uint64], key: HeaderKey) -> None:
    """Raises StorageError unless every record of the group is the intact MSG record the index
    says is there (see the module's docstring for what that takes)."""
    start = at + HEADER_SIZE
    seeds = key.seeds(int(seg[0]))  # a group lies in one segment
    sums = np.array([crc32(buf[x:y], seeds[1])
                     for x, y in zip(start.tolist(), (start + size).tolist(), strict=True)],
                    np.uint32)
    bad = ((head["magic"] != _MAGIC) | (head["rtype"] != records.MSG)
           | (head["length"] != size) | (head["pcrc"] != sums))
    if bool(bad.any()):
        k = int(np.argmax(bad))
        raise _bad(seg, off, size, mids, k, "not the intact MSG record")
    other = np.flatnonzero(head["mid"] != mids)
    for k in other.tolist():
        if not intact_at(buf, int(at[k]), int(seg[k]), int(off[k]), int(size[k]), seeds=seeds):
            raise _bad(seg, off, size, mids, k, "not the intact MSG record")


def _bad(seg: NDArray[np.int64], off: NDArray[np.int64], size: NDArray[np.int64],
         mids: NDArray[np.uint64], k: int, why: str) -> StorageError:
    loc = Location(int(seg[k]), int(off[k]), int(size[k]))
    return StorageError(f"bad record at {loc}: {why} of message {int(mids[k])}")
