"""The index snapshot: what a journal replay would rebuild, as of one record of the journal.

Why: replay reads and checksums every record of every live segment (several µs a record in
Python), so a million-message backlog took 15+ s to come back after a crash. The broker writes
its stored state here, beside the journal, now and then while it runs and at a clean stop; the
next start loads it and replays only the records after the snapshot's position (the *tail*).

Why it can be trusted: a snapshot is written only once every record up to its position is
durable, and it names that last record (segment, offset, end). The journal is append-only after
it and segments are deleted oldest first, so while that record is still intact where the
snapshot says, every later record is there too, and snapshot + tail is exactly what a full scan
would give. ``check`` verifies the anchoring record; a missing or damaged one, a torn or
flipped byte in the file (CRC), an unknown version: the snapshot is ignored and the journal is
scanned, which is always correct. Records the tail removes (acks, compaction) may have let
segments named in the snapshot go: the core drops those entries while replaying the tail.

The storage layer does not interpret the queue keys, stream states or extra parts it carries;
the core (``core/persistence/capture.py``, ``core/persistence/recovery.py``) captures and
restores them. Layout (native
byte order arrays)::

    MAGIC | u32 version | u64 meta length | meta (JSON) | lanes ... | trailer
    lane: its columns | the packed block (slotpack) of each of its packed runs
    trailer: u64 bytes before it | u32 crc32 of those bytes | END

A lane's paged-out messages mostly come as *packed runs*: the cursor's own packed blocks of
slots (``storage/slotpack.py``), referenced rather than copied when the snapshot is taken; the
meta says where each goes among the lane's column slots, which of its slots count, and its size.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import sys
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sluicemq.storage import slotpack
from sluicemq.storage.checksum import crc32
from sluicemq.storage.records import DurableSub
from sluicemq.storage.segment import (
    HEADER_SIZE,
    Location,
    fsync_dir,
    parse_header,
    segment_name,
)

if TYPE_CHECKING:
    from sluicemq.storage.headerkey import HeaderKey

__all__ = ["FILE_NAME", "IndexSnapshot", "Lane", "Position", "SnapshotError", "check",
           "decode", "encode", "load", "remove", "save"]

FILE_NAME = "index.snapshot"
MAGIC = b"SLUICEIX"
END = b"XIECIULS"
VERSION = 3
_HEAD = struct.Struct("<8sIQ")
_TRAILER = struct.Struct("<QI8s")
# Column typecodes of a lane, in file order: mid, segment, offset, length, inner, size.
COLUMNS = ("Q", "I", "Q", "I", "I", "I")


class SnapshotError(ValueError):
    """The bytes are not an intact snapshot of a version we read."""


@dataclass(slots=True)
class Position:
    """The journal record the snapshot accounts for last.

    ``last``: its (segment, offset), (0, -1) when the journal was empty; ``end``: the offset
    just past it, where the next record of that segment starts; ``seq``: its journal sequence
    number in the run that took the snapshot (for log lines only).
    """

    last: tuple[int, int]
    end: int
    seq: int = 0

    @property
    def anchor(self) -> tuple[int, int, int] | None:
        """(segment, offset, end) for a journal scan that starts after it; None: from the start."""
        if self.last[1] < 0:
            return None
        return self.last[0], self.last[1], self.end


@dataclass(frozen=True, slots=True)
class PackedRun:
    """Slots ``[skip, skip + count)`` of a packed block of journal slots (``slotpack``),
    placed in the lane after its first ``at`` column slots."""

    at: int
    packed: bytes
    skip: int
    count: int

    def __len__(self) -> int:
        return self.count

    def whole(self) -> slotpack.Fields:
        """The block's columns, all of them (``skip`` not applied)."""
        fields = slotpack.unpack(self.packed)
        if self.skip + self.count > len(fields[0]):
            raise ValueError("a packed run is shorter than it says")
        return fields

    def columns(self) -> LaneColumns:
        """mid, seg, off, length, inner, size of the run's slots."""
        mid, _src, seg, off, length, inner, size = self.whole()
        a, b = self.skip, self.skip + self.count
        return mid[a:b], seg[a:b], off[a:b], length[a:b], inner[a:b], size[a:b]

    def ids(self) -> array:
        return self.columns()[0]


# A lane's six slot columns, in order: mid, seg, off, length, inner, size.
LaneColumns = tuple[array, array, array, array, array, array]


@dataclass(slots=True)
class Lane:
    """One priority lane of one queue key: stored messages in dispatch order, as columns, with
    packed runs (taken whole from the cursor) interleaved."""

    key: str
    priority: int
    mid: array
    seg: array
    off: array
    length: array
    inner: array
    size: array
    packed: list[PackedRun] = field(default_factory=list)

    def columns(self) -> LaneColumns:
        return (self.mid, self.seg, self.off, self.length, self.inner, self.size)

    def __len__(self) -> int:
        return len(self.mid) + sum(len(run) for run in self.packed)

    def add_packed(self, packed: bytes, skip: int, count: int) -> None:
        self.packed.append(PackedRun(len(self.mid), packed, skip, count))

    def unpacked(self, keep: Callable[[PackedRun], bool] = lambda run: False) -> Lane:
        """The same lane with its packed runs expanded into the columns, in order, except
        those ``keep`` says to leave packed."""
        if not self.packed:
            return self
        out = make_lane(self.key, self.priority)
        for piece in self.pieces():
            if isinstance(piece, PackedRun):
                if keep(piece):
                    out.packed.append(PackedRun(len(out.mid), piece.packed, piece.skip,
                                                piece.count))
                    continue
                piece = piece.columns()
            for dst, col in zip(out.columns(), piece, strict=True):
                dst.extend(col)
        return out

    def pieces(self) -> Iterator[LaneColumns | PackedRun]:
        """In order: the columns of each stretch of column slots, each packed run as it is."""
        prev = 0
        for run in [*self.packed, None]:
            at = len(self.mid) if run is None else run.at
            if prev < at:
                mid, seg, off, length, inner, size = (col[prev:at] for col in self.columns())
                yield mid, seg, off, length, inner, size
            if run is not None:
                yield run
            prev = at


@dataclass(slots=True)
class IndexSnapshot:
    """Everything start-up needs besides the journal itself.

    ``held``: messages kept outside the queues (chunks waiting for their stream to complete),
    as dicts; ``streams``: stream states; ``parts``: further state sections by name (see
    ``core/persistence/parts.py``), opaque to storage.
    """

    position: Position
    next_mid: int
    lanes: list[Lane] = field(default_factory=list)
    subs: list[tuple[DurableSub, Location]] = field(default_factory=list)
    held: list[dict[str, Any]] = field(default_factory=list)
    streams: list[dict[str, Any]] = field(default_factory=list)
    parts: dict[str, Any] = field(default_factory=dict)

    @property
    def messages(self) -> int:
        return sum(len(lane) for lane in self.lanes) + len(self.held)


def make_lane(key: str, priority: int) -> Lane:
    """An empty lane with columns of the right types."""
    mid, seg, off, length, inner, size = (array(code) for code in COLUMNS)
    return Lane(key, priority, mid, seg, off, length, inner, size)


# ------------------------------------------------------------------------------ encoding

def encode(snap: IndexSnapshot) -> list[bytes | memoryview]:
    """The snapshot as a list of buffers; lane columns are views, not copies (a million-message
    snapshot is tens of MiB: it is written from a worker thread without another copy)."""
    for lane in snap.lanes:
        n = len(lane.mid)
        if any(len(col) != n or col.typecode != code
               for col, code in zip(lane.columns(), COLUMNS, strict=True)):
            raise ValueError(f"lane {lane.key}/{lane.priority}: ragged or mistyped columns")
        if any(run.count <= 0 or not 0 <= run.at <= n for run in lane.packed):
            raise ValueError(f"lane {lane.key}/{lane.priority}: misplaced packed run")
    pos = snap.position
    meta = {
        "byteorder": sys.byteorder,
        "position": {"last": list(pos.last), "end": pos.end, "seq": pos.seq},
        "next_mid": snap.next_mid,
        "lanes": [[lane.key, lane.priority, len(lane.mid),
                   [[run.at, len(run), run.skip, len(run.packed)] for run in lane.packed]]
                  for lane in snap.lanes],
        "subs": [[_sub_dict(sub), [loc.segment, loc.offset, loc.length]]
                 for sub, loc in snap.subs],
        "held": snap.held,
        "streams": snap.streams,
        "parts": snap.parts,
    }
    text = json.dumps(meta, separators=(",", ":")).encode()
    parts: list[bytes | memoryview] = [_HEAD.pack(MAGIC, VERSION, len(text)), text]
    for lane in snap.lanes:
        parts.extend(memoryview(col).cast("B") for col in lane.columns() if len(col))
        parts.extend(run.packed for run in lane.packed)
    crc = 0
    total = 0
    for part in parts:
        crc = crc32(part, crc)
        total += len(part)
    parts.append(_TRAILER.pack(total, crc, END))
    return parts


def decode(data: bytes | memoryview) -> IndexSnapshot:
    """Parse and verify; raises SnapshotError for anything but an intact, readable snapshot."""
    view = memoryview(data)
    if len(view) < _HEAD.size + _TRAILER.size:
        raise SnapshotError("too short")
    total, crc, end = _TRAILER.unpack_from(view, len(view) - _TRAILER.size)
    if end != END or total != len(view) - _TRAILER.size:
        raise SnapshotError("bad trailer (truncated?)")
    if crc32(view[:total]) != crc:
        raise SnapshotError("checksum mismatch")
    magic, version, meta_len = _HEAD.unpack_from(view, 0)
    if magic != MAGIC or version != VERSION:
        raise SnapshotError(f"not a version {VERSION} index snapshot")
    pos = _HEAD.size
    try:
        meta = json.loads(bytes(view[pos:pos + meta_len]))
        if meta["byteorder"] != sys.byteorder:
            raise SnapshotError("written on a machine of the other byte order")
        pos += meta_len
        lanes = []
        for key, priority, n, runs in meta["lanes"]:
            lane = make_lane(key, priority)
            for col in lane.columns():
                nbytes = n * col.itemsize
                col.frombytes(view[pos:pos + nbytes])
                pos += nbytes
            for at, count, skip, plen in runs:
                lane.packed.append(PackedRun(at, bytes(view[pos:pos + plen]), skip, count))
                pos += plen
            if pos > total:
                raise SnapshotError("lanes run past the end of the file")
            lanes.append(lane)
        if pos != total:
            raise SnapshotError("lane columns do not fill the file")
        p = meta["position"]
        position = Position((p["last"][0], p["last"][1]), p["end"], p["seq"])
        subs = [(DurableSub(d["key"], d["topic"], d["client_id"], d["name"], d["selector"]),
                 Location(*loc)) for d, loc in meta["subs"]]
        return IndexSnapshot(position, meta["next_mid"], lanes, subs, meta["held"],
                             meta["streams"], meta["parts"])
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        if isinstance(exc, SnapshotError):
            raise
        raise SnapshotError(f"malformed: {exc!r}") from exc


def _sub_dict(sub: DurableSub) -> dict[str, Any]:
    return {"key": sub.key, "topic": sub.topic, "client_id": sub.client_id, "name": sub.name,
            "selector": sub.selector}


# ------------------------------------------------------------------------------ files

def save(directory: Path, snap: IndexSnapshot, fence: Callable[[], None] | None = None) -> int:
    """Write durably and atomically (temp file, fsync, rename, directory fsync); returns bytes.

    Safe to run on a worker thread as long as nobody mutates ``snap`` meanwhile. The temp name
    ends in ``.tmp``, which journal recovery deletes as a leftover. ``fence`` (a lease
    master's check) runs before the file is renamed into place.
    """
    path = directory / FILE_NAME
    tmp = path.with_name(FILE_NAME + ".tmp")
    parts = encode(snap)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        with os.fdopen(fd, "wb", closefd=True) as fh:
            for part in parts:
                fh.write(part)
            fh.flush()
            os.fsync(fh.fileno())
        if fence is not None:
            fence()
        os.rename(tmp, path)
        fsync_dir(directory)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return sum(len(p) for p in parts)


def load(directory: Path) -> tuple[IndexSnapshot | None, str | None]:
    """(snapshot, None), or (None, why not); (None, None) when there is no snapshot file."""
    path = directory / FILE_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"unreadable: {exc}"
    try:
        return decode(data), None
    except SnapshotError as exc:
        return None, str(exc)


def remove(directory: Path) -> None:
    """Delete the snapshot durably (one found unusable must not be tried again)."""
    path = directory / FILE_NAME
    if path.exists():
        path.unlink(missing_ok=True)
        fsync_dir(directory)


def check(directory: Path, position: Position, key: HeaderKey) -> str | None:
    """None if the record the snapshot ends with is intact where it says (checksums of the
    journal's ``key``), else why not."""
    anchor = position.anchor
    if anchor is None:
        return None
    segment, offset, end = anchor
    try:
        with (directory / segment_name(segment)).open("rb") as fh:
            fh.seek(offset)
            head = fh.read(HEADER_SIZE)
            seeds = key.seeds(segment)
            header = parse_header(head, segment, offset, seeds=seeds)
            if isinstance(header, str):
                return f"no record at segment {segment} offset {offset} ({header})"
            _rtype, length, pcrc = header
            if offset + HEADER_SIZE + length != end:
                return f"the record at segment {segment} offset {offset} ends elsewhere"
            if crc32(fh.read(length), seeds[1]) != pcrc:
                return f"the record at segment {segment} offset {offset} is damaged"
    except FileNotFoundError:
        return f"segment {segment} is gone"
    except OSError as exc:
        return f"cannot read the journal: {exc}"
    return None
