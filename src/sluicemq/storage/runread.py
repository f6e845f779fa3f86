"""Runs of plain MSG records read straight into columns: a backlog's range read, per message.

Why its own path: a column batch of a backlog is thousands of MSG records lying back to back
in the journal, and its cost is what is done per record. ``Journal.read_many`` and a decode
of each payload unpack two headers, compute two checksums (one seeded with the record's
position) and make a dozen slices a record; here one unpack covers the journal header and
the MSG head together, one checksum covers the payload and two slices cut out the headers
and the body.

What is verified, and why that is enough: every record's magic, type, stored length (which
must be the index's) and payload checksum, and that the message id inside the checksummed
payload is the seq the index holds for it. The header checksum exists to catch a record
read from the wrong place; a checksummed payload carrying the expected id and length *is*
the record asked for. Where the ids differ (a record read under another seq) the whole
record is checked the way ``read_many`` does.
"""

from __future__ import annotations

import struct
import zlib
from typing import TYPE_CHECKING

from sluicemq.errors import StorageError
from sluicemq.storage import records
from sluicemq.storage.segment import HEADER, HEADER_SIZE, MAGIC, Location, intact_at

if TYPE_CHECKING:
    from sluicemq.storage.journal import Journal

# The journal's record header followed by a MSG payload's fixed head, unpacked as one.
_BOTH = struct.Struct(HEADER.format + records.MSG_HEAD.format.removeprefix("<"))
_MSG_HEAD_SIZE = records.MSG_HEAD.size

Columns = tuple[list[int], list[int], list[memoryview], list[memoryview]]


def message_columns(journal: Journal, locs: list[tuple[int, int, int]],
                    seqs: list[int]) -> Columns:
    """(timestamps, expiries, header JSON views, body views) of the MSG records at ``locs``
    ((segment, offset, length), each a whole record, not one inside a transaction), which the
    index holds under ``seqs``; raises StorageError for any record that is not intact."""
    ts: list[int] = []
    exp: list[int] = []
    heads: list[memoryview] = []
    bodies: list[memoryview] = []
    unpack, crc, msg = _BOTH.unpack_from, zlib.crc32, records.MSG
    for buf, first, i, j in journal.read_spans(locs):
        if first < 0:  # still pending in memory: never left it, nothing to verify
            t, e, _prio, h, b = records.message_columns(buf)
            ts.append(t)
            exp.append(e)
            heads.append(h)
            bodies.append(b)
            continue
        view = memoryview(buf)
        size_of = len(view)
        for (seg, off, size), seq in zip(locs[i:j], seqs[i:j], strict=True):
            at = off - first
            start = at + HEADER_SIZE
            end = start + size
            if end > size_of or size < _MSG_HEAD_SIZE:
                raise StorageError(f"bad record at {Location(seg, off, size)}: not the whole "
                                   f"MSG record of message {seq}")
            magic, rtype, _f, stored, pcrc, _hcrc, mid, t, e, _p, _mf, klen, hlen = unpack(
                view, at)
            if (magic != MAGIC or rtype != msg or stored != size
                    or crc(view[start:end]) != pcrc
                    or (mid != seq and not intact_at(view, at, seg, off, size))):
                raise StorageError(f"bad record at {Location(seg, off, size)}: not the intact "
                                   f"MSG record of message {seq}")
            h = start + _MSG_HEAD_SIZE + klen
            ts.append(t)
            exp.append(e)
            heads.append(view[h:h + hlen])
            bodies.append(view[h + hlen:end])
    return ts, exp, heads, bodies
