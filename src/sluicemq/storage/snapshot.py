"""The index snapshot: what a journal replay would rebuild, saved at a clean stop.

Why: replay reads and checksums every record of every live segment (about 10 µs a record in
Python), so a million-message backlog took 15+ s to come back. At a clean stop the broker
already knows the answer; it writes it here, beside the journal, after the journal is fsync'd
and closed, and the next start loads it instead of scanning.

Why it can be trusted: the file records the journal's exact shape (live segment files with
size and mtime, the last record's position, where the next append goes) and a CRC32 of its own
bytes. ``check`` compares that shape with the directory; any difference - a kill -9 after a
later start, a segment written, deleted or restored from elsewhere, a flipped byte - means a
full scan, which is always correct. A loaded snapshot is deleted (``take``) before the journal
accepts writes, so an old snapshot can never be paired with a newer journal.

The storage layer does not interpret the queue keys or stream states it carries; the core
(``core/recovery.py``) captures and restores them. Layout (native little-endian arrays)::

    MAGIC | u32 version | u64 meta length | meta (JSON) | lane columns ... | trailer
    trailer: u64 bytes before it | u32 crc32 of those bytes | END
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import sys
import zlib
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluicemq.storage.records import DurableSub
from sluicemq.storage.segment import (
    HEADER_SIZE,
    Location,
    fsync_dir,
    parse_header,
    parse_segment_name,
    segment_name,
)

__all__ = ["FILE_NAME", "IndexSnapshot", "Lane", "Position", "SnapshotError", "check",
           "decode", "encode", "save", "take"]

FILE_NAME = "index.snapshot"
MAGIC = b"SLUICEIX"
END = b"XIECIULS"
VERSION = 1
_HEAD = struct.Struct("<8sIQ")
_TRAILER = struct.Struct("<QI8s")
# Column typecodes of a lane, in file order: mid, segment, offset, length, inner, size.
COLUMNS = ("Q", "I", "Q", "I", "I", "I")


class SnapshotError(ValueError):
    """The bytes are not an intact snapshot of a version we read."""


@dataclass(slots=True)
class Position:
    """The journal's shape when the snapshot was taken.

    ``segments``: (number, size, mtime_ns) of every live segment file, oldest first;
    ``active``/``end``: where the next append goes; ``last``: (segment, offset) of the last
    record, (0, -1) for an empty log.
    """

    segments: list[tuple[int, int, int]]
    active: int
    end: int
    last: tuple[int, int]


@dataclass(slots=True)
class Lane:
    """One priority lane of one queue key: stored messages in dispatch order, as columns."""

    key: str
    priority: int
    mid: array
    seg: array
    off: array
    length: array
    inner: array
    size: array

    def columns(self) -> tuple[array, ...]:
        return (self.mid, self.seg, self.off, self.length, self.inner, self.size)

    def __len__(self) -> int:
        return len(self.mid)


@dataclass(slots=True)
class IndexSnapshot:
    """Everything start-up needs besides the journal itself.

    ``counts``: live records per segment (messages, SUB records, stream pins: what the journal
    must be told to retain); ``held``: messages kept outside the queues (chunks waiting for
    their stream to complete), as dicts; ``streams``: stream states, opaque to storage.
    """

    position: Position
    counts: dict[int, int]
    next_mid: int
    lanes: list[Lane] = field(default_factory=list)
    subs: list[tuple[DurableSub, Location]] = field(default_factory=list)
    held: list[dict[str, Any]] = field(default_factory=list)
    streams: list[dict[str, Any]] = field(default_factory=list)

    @property
    def messages(self) -> int:
        return sum(len(lane) for lane in self.lanes) + len(self.held)


def make_lane(key: str, priority: int) -> Lane:
    """An empty lane with columns of the right types."""
    return Lane(key, priority, *(array(code) for code in COLUMNS))


# ------------------------------------------------------------------------------ encoding

def encode(snap: IndexSnapshot) -> list[bytes]:
    """The snapshot as a list of buffers (the lane columns are not copied into one string)."""
    for lane in snap.lanes:
        n = len(lane.mid)
        if any(len(col) != n or col.typecode != code
               for col, code in zip(lane.columns(), COLUMNS, strict=True)):
            raise ValueError(f"lane {lane.key}/{lane.priority}: ragged or mistyped columns")
    pos = snap.position
    meta = {
        "byteorder": sys.byteorder,
        "position": {"segments": pos.segments, "active": pos.active, "end": pos.end,
                     "last": list(pos.last)},
        "counts": sorted(snap.counts.items()),
        "next_mid": snap.next_mid,
        "lanes": [[lane.key, lane.priority, len(lane)] for lane in snap.lanes],
        "subs": [[_sub_dict(sub), [loc.segment, loc.offset, loc.length]]
                 for sub, loc in snap.subs],
        "held": snap.held,
        "streams": snap.streams,
    }
    text = json.dumps(meta, separators=(",", ":")).encode()
    parts: list[bytes] = [_HEAD.pack(MAGIC, VERSION, len(text)), text]
    for lane in snap.lanes:
        parts.extend(col.tobytes() for col in lane.columns())
    crc = 0
    total = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
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
    if zlib.crc32(view[:total]) != crc:
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
        for key, priority, n in meta["lanes"]:
            lane = make_lane(key, priority)
            for col in lane.columns():
                nbytes = n * col.itemsize
                col.frombytes(view[pos:pos + nbytes])
                pos += nbytes
            lanes.append(lane)
        if pos != total:
            raise SnapshotError("lane columns do not fill the file")
        p = meta["position"]
        position = Position([(s[0], s[1], s[2]) for s in p["segments"]], p["active"], p["end"],
                            (p["last"][0], p["last"][1]))
        subs = [(DurableSub(d["key"], d["topic"], d["client_id"], d["name"], d["selector"]),
                 Location(*loc)) for d, loc in meta["subs"]]
        return IndexSnapshot(position, {seg: n for seg, n in meta["counts"]}, meta["next_mid"],
                             lanes, subs, meta["held"], meta["streams"])
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        if isinstance(exc, SnapshotError):
            raise
        raise SnapshotError(f"malformed: {exc!r}") from exc


def _sub_dict(sub: DurableSub) -> dict[str, Any]:
    return {"key": sub.key, "topic": sub.topic, "client_id": sub.client_id, "name": sub.name,
            "selector": sub.selector}


# ------------------------------------------------------------------------------ files

def describe(directory: Path, segments: list[int], active: int, end: int,
             last: tuple[int, int]) -> Position:
    """The Position of a closed journal: stats each live segment file that exists."""
    found = []
    for number in segments:
        try:
            st = (directory / segment_name(number)).stat()
        except FileNotFoundError:
            continue  # the active segment of a log nothing was ever written to
        found.append((number, st.st_size, st.st_mtime_ns))
    return Position(found, active, end, last)


def save(directory: Path, snap: IndexSnapshot) -> int:
    """Write durably and atomically (temp file, fsync, rename, directory fsync); returns bytes.

    The temp name ends in ``.tmp``, which journal recovery deletes as a leftover.
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
        os.rename(tmp, path)
        fsync_dir(directory)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return sum(len(p) for p in parts)


def take(directory: Path) -> tuple[IndexSnapshot | None, str | None]:
    """Read the snapshot and delete it (durably) whatever it holds; (snapshot, None) or
    (None, why not). No file is (None, None): the last stop was not clean, or there was none."""
    path = directory / FILE_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        data, why = b"", f"unreadable: {exc}"
    else:
        why = None
    path.unlink(missing_ok=True)
    fsync_dir(directory)
    if why is not None:
        return None, why
    try:
        return decode(data), None
    except SnapshotError as exc:
        return None, str(exc)


def check(directory: Path, position: Position) -> str | None:
    """None if the journal in ``directory`` is exactly as ``position`` describes it, else why.

    Any append after the snapshot lands at ``end`` of the active segment or at offset 0 of the
    next one, so both places must still be empty; a record written elsewhere would have
    changed a segment's size or mtime.
    """
    try:
        return _check(directory, position)
    except OSError as exc:
        return f"cannot read the journal: {exc}"


def _check(directory: Path, position: Position) -> str | None:
    numbers = sorted(n for p in directory.iterdir()
                     if (n := parse_segment_name(p.name)) is not None)
    live = [n for n in numbers if n <= position.active]
    if live != [s[0] for s in position.segments]:
        return f"segment files {live} differ from the recorded {[s[0] for s in position.segments]}"
    newer = [n for n in numbers if n > position.active]
    if newer and newer != [position.active + 1]:
        return f"newer segments exist: {newer}"
    for number, size, mtime in position.segments:
        st = (directory / segment_name(number)).stat()
        if (st.st_size, st.st_mtime_ns) != (size, mtime):
            return f"segment {number} changed since the snapshot"
    active = directory / segment_name(position.active)
    seg, off = position.last
    if off >= 0:
        if seg != position.active:
            return "the last record is not in the active segment"
        head = _read(active, off, HEADER_SIZE)
        header = parse_header(head, seg, off)
        if isinstance(header, str):
            return f"no record at the recorded end ({header})"
        if off + HEADER_SIZE + header[1] != position.end:
            return "the last record does not end where recorded"
    if active.exists() and _read(active, position.end, HEADER_SIZE).strip(b"\0"):
        return "data follows the recorded end"
    if newer and _read(directory / segment_name(newer[0]), 0, HEADER_SIZE).strip(b"\0"):
        return "the next segment has data"
    return None


def _read(path: Path, offset: int, n: int) -> bytes:
    with path.open("rb") as fh:
        fh.seek(offset)
        return fh.read(n)
