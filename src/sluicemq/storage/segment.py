"""On-disk layout of journal segments: the record header, file naming, scanning, file helpers.

A segment is a file of back-to-back records; unused space after the last record is zeros.
Each record is a 16-byte little-endian header followed by the payload:

    offset  size  field
    0       2     magic   b"\\xffS": never zero and never valid UTF-8, so neither preallocated
                          space nor text looks like a header
    2       1     rtype   1..255; 0 is reserved so that a zeroed header is never a record
    3       1     flags   bit 0 REUSED: the segment's file held earlier segments, whose
                          bytes may follow this segment's last record; bit 1 KEYED: the
                          checksums are keyed (below); other bits 0
    4       4     length  payload bytes
    8       4     pcrc    crc32(payload), seeded with the segment's payload seed
    12      4     hcrc    crc32(bytes 0..11), seeded with crc32(segment number, offset)
                          itself seeded with the segment's header seed

A segment's two seeds are (0, 0) in a journal written before keys existed (the format of
sessions before 18, bit for bit) and secret otherwise: derived from the journal's key
(``headerkey.py``, which says why a sender who chose a body cannot forge a record with them).

Why two checksums: resynchronising after corruption tests many candidate headers, and the
header checksum rejects a false candidate in O(1) before its `length` is trusted enough to
checksum a possibly huge payload. Why the position seed: a byte-exact copy of a valid record
(a journal file sent as a message body, stale bytes) only validates where it was first written,
so resynchronisation cannot surface phantom records; the key keeps a record a sender laid out
in a body from checking out anywhere.

The position seed is also what makes reusing a reclaimed segment's file safe (``recycle.py``):
the file gets a number above every one it had, so none of its old records check out under the
new one. A journal written before REUSED existed has flags 0 everywhere and recovers as it did.
"""

from __future__ import annotations

import errno
import os
import re
import struct
from collections.abc import Callable, Generator, Sequence
from pathlib import Path
from typing import NamedTuple, Protocol

from sluicemq.storage.checksum import crc32, crc32_combine

MAGIC = b"\xffS"
HEADER = struct.Struct("<2sBBIII")
HEADER_SIZE = HEADER.size
_HEAD12 = struct.Struct("<2sBBII")
REUSED = 0x01
KEYED = 0x02
Seeds = tuple[int, int]  # (header seed, payload seed) of a segment: headerkey.HeaderKey.seeds
_POSITION = struct.Struct("<QQ")
_PLACED = struct.Struct("<QQ2sBBII")  # _POSITION then _HEAD12: what a header's CRC covers
MAX_PAYLOAD = 0xFFFFFFFF
_IOV_MAX = 1024
_ZERO_CHUNK = 1 << 20
_ZEROS = bytes(_ZERO_CHUNK)
_NAME = re.compile(r"^(\d{20})\.log$")
TMP_SUFFIX = ".tmp"


class Location(NamedTuple):
    """Where a record lives: segment number, header offset in that file, payload length.

    A named tuple, not a frozen dataclass: every persistent SEND makes one and hashes it
    twice (the journal's unwritten map), and a tuple is built and hashed in C - a frozen
    dataclass's generated ``__init__`` and ``__hash__`` were ~3 % of the loop under the
    persistent 8 x 8 (py-spy). Beware that it compares equal to a plain tuple of its fields.
    """

    segment: int
    offset: int
    length: int


class Buffer(Protocol):
    """What the scanner reads: bytes or an mmap (both slice to bytes and support find)."""

    def __len__(self) -> int: ...
    def __getitem__(self, key: slice, /) -> bytes: ...
    def find(self, sub: bytes, start: int = ..., /) -> int: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...


def segment_name(segment: int) -> str:
    """Zero-padded so that lexical order of file names is log order."""
    return f"{segment:020d}.log"


def parse_segment_name(name: str) -> int | None:
    """The segment number of a file name, or None for files that are not segments."""
    match = _NAME.match(name)
    return int(match.group(1)) if match else None


def _seed(segment: int, offset: int, key: int) -> int:
    return crc32(_POSITION.pack(segment, offset), key)


def encode_header(rtype: int, payload: bytes, segment: int, offset: int,
                  tail: bytes = b"", flags: int = 0, *, seeds: Seeds,
                  tail_crc: int | None = None) -> bytes:
    """The header for `payload` (followed by `tail`: the record's payload is both, written
    from two buffers) at (segment, offset) of a segment with ``seeds``; checksums the payload.
    ``tail_crc``: ``crc32(tail)``, computed ahead (``Journal.append``; needs ``crc32_combine``).
    KEYED is set when the seeds are not (0, 0)."""
    hseed, pseed = seeds
    pcrc = crc32(payload, pseed)
    if tail_crc is not None and crc32_combine is not None:
        pcrc = crc32_combine(pcrc, tail_crc, len(tail))
    elif tail:
        pcrc = crc32(tail, pcrc)
    if hseed or pseed:
        flags |= KEYED
    # The header's CRC covers its position, then its first 12 bytes (``crc32(head,
    # _seed(...))``): packed as one and checksummed in one call (once per record written).
    placed = _PLACED.pack(segment, offset, MAGIC, rtype, flags, len(payload) + len(tail), pcrc)
    return placed[16:] + crc32(placed, hseed).to_bytes(4, "little")


def parse_header(head: bytes, segment: int, offset: int, *,
                 seeds: Seeds) -> tuple[int, int, int] | str:
    """(rtype, length, pcrc) if `head` is a valid header written at (segment, offset); the
    payload is intact if ``crc32(payload, seeds[1]) == pcrc``."""
    if len(head) < HEADER_SIZE:
        return "short header"
    magic, rtype, _flags, length, pcrc, hcrc = HEADER.unpack_from(head)
    if magic != MAGIC or rtype == 0:
        return "bad header"
    if crc32(head[:12], _seed(segment, offset, seeds[0])) != hcrc:
        return "header checksum mismatch"
    return rtype, length, pcrc


def check_record(buf: Buffer, segment: int, pos: int, *,
                 seeds: Seeds) -> tuple[int, bytes] | str:
    """(rtype, payload) of the intact record at buf[pos] (buf is a whole segment), else why
    it is not one."""
    header = parse_header(buf[pos : pos + HEADER_SIZE], segment, pos, seeds=seeds)
    if isinstance(header, str):
        return header
    rtype, length, pcrc = header
    start = pos + HEADER_SIZE
    if start + length > len(buf):
        return "truncated record"
    payload = buf[start : start + length]
    if crc32(payload, seeds[1]) != pcrc:
        return "payload checksum mismatch"
    return rtype, payload


def verify_record(head: bytes, payload: bytes | memoryview, loc: Location, *,
                  seeds: Seeds) -> int | str:
    """The rtype if (head, payload) read back from loc form the intact record, else why not."""
    header = parse_header(head, loc.segment, loc.offset, seeds=seeds)
    if isinstance(header, str):
        return header
    rtype, length, pcrc = header
    if length != loc.length or len(payload) != length:
        return "length mismatch"
    if crc32(payload, seeds[1]) != pcrc:
        return "payload checksum mismatch"
    return rtype


def intact_at(buf: bytes | memoryview, at: int, segment: int, offset: int,
             length: int, *, seeds: Seeds) -> bool:
    """Whether ``buf[at:]`` starts with the intact record of ``length`` payload bytes written
    at (segment, offset): ``verify_record`` without copies, for batched reads."""
    if len(buf) < at + HEADER_SIZE + length:
        return False
    magic, rtype, _flags, stored, pcrc, hcrc = HEADER.unpack_from(buf, at)
    crc = crc32
    return (magic == MAGIC and rtype != 0 and stored == length
            and crc(buf[at:at + 12], _seed(segment, offset, seeds[0])) == hcrc
            and crc(buf[at + HEADER_SIZE:at + HEADER_SIZE + length], seeds[1]) == pcrc)


def reused_at(buf: Buffer, pos: int) -> bool:
    """Whether the intact record at ``buf[pos]`` says its segment's file was reused."""
    return bool(buf[pos + 3 : pos + 4][0] & REUSED)


def reuse_stamp(segment: int, *, seeds: Seeds) -> bytes:
    """What a reused file gets at offset 0 before it becomes segment ``segment``: a header of
    that position with rtype 0 (never a record) and REUSED, until the first record replaces
    it. Why: a file holding only its earlier contents is a ready spare, not damage."""
    flags = REUSED | (KEYED if seeds[0] or seeds[1] else 0)
    head = _HEAD12.pack(MAGIC, 0, flags, 0, 0)
    return head + crc32(head, _seed(segment, 0, seeds[0])).to_bytes(4, "little")


def stamped(buf: Buffer, segment: int, *, seeds: Seeds) -> bool:
    """Whether offset 0 holds a header of ``segment`` with REUSED (the stamp, or the first
    record's, intact or torn)."""
    head = buf[0:HEADER_SIZE]
    return (len(head) == HEADER_SIZE and head[:2] == MAGIC and bool(head[3] & REUSED)
            and crc32(head[:12], _seed(segment, 0, seeds[0]))
            == int.from_bytes(head[12:], "little"))


def written_at(head: bytes, segment: int, offset: int, *, seeds: Seeds) -> bool:
    """Whether ``head`` is a header written at (segment, offset) under ``seeds``: a record's,
    its payload intact or torn, or a reuse stamp. The header checksum alone, so a first
    record whose write a crash tore still shows which key wrote it."""
    return (len(head) >= HEADER_SIZE and head[:2] == MAGIC
            and crc32(head[:12], _seed(segment, offset, seeds[0]))
            == int.from_bytes(head[12:HEADER_SIZE], "little"))


def own_headers_end(buf: Buffer, segment: int, start: int, end: int, *, seeds: Seeds) -> int:
    """Where the last header in [start, end) that checks out for ``segment`` at its offset
    claims its record ends (at most ``end``); ``start`` if there is none. In a reused file, a
    range no intact record follows is the file's earlier contents (headers seeded with other
    numbers) except for what this number's headers cover: records of this segment that were
    being written when the process stopped, a torn tail."""
    last = start
    pos = buf.find(MAGIC, start)
    while 0 <= pos < end:
        header = parse_header(buf[pos : pos + HEADER_SIZE], segment, pos, seeds=seeds)
        if not isinstance(header, str):
            last = max(last, min(end, pos + HEADER_SIZE + header[1]))
        pos = buf.find(MAGIC, pos + 1)
    return last


def first_nonzero(buf: Buffer, start: int, end: int) -> int:
    """Offset of the first non-zero byte in [start, end), or -1; C-speed over zero runs."""
    pos = start
    while pos < end:
        chunk = buf[pos : min(pos + _ZERO_CHUNK, end)]
        if len(chunk) == _ZERO_CHUNK and chunk == _ZEROS:  # memcmp: preallocated space is fast
            pos += _ZERO_CHUNK
            continue
        rest = chunk.lstrip(b"\0")
        if rest:
            return pos + len(chunk) - len(rest)
        pos += len(chunk)
    return -1


def last_nonzero(buf: Buffer, start: int, end: int) -> int:
    """Offset of the last non-zero byte in [start, end), or -1."""
    stop = end
    while stop > start:
        lo = max(start, stop - _ZERO_CHUNK)
        rest = buf[lo:stop].rstrip(b"\0")
        if rest:
            return lo + len(rest) - 1
        stop = lo
    return -1


def _resync(buf: Buffer, segment: int, start: int,
            seeds: Seeds) -> tuple[int, int, bytes] | None:
    """The next intact record at or after start: (offset, rtype, payload)."""
    pos = buf.find(MAGIC, start)
    while pos >= 0:
        found = check_record(buf, segment, pos, seeds=seeds)
        if not isinstance(found, str):
            return pos, found[0], found[1]
        pos = buf.find(MAGIC, pos + 1)
    return None


def scan(
    buf: Buffer, segment: int, dropped: list[tuple[int, int, str]], start: int = 0, *,
    seeds: Seeds, tally: list[int] | None = None,
) -> Generator[tuple[int, bytes, int, int], None, None]:
    """Yield (rtype, payload, segment, offset) for every intact record of one segment from
    ``start`` (a record boundary), in order.

    Each damaged range is appended to `dropped` as (offset, nbytes, reason) and skipped by
    searching for the next magic whose record checks out, so one bad record costs only itself.
    Zeros up to the end of the buffer are the normal end of data, not damage.

    ``tally`` ([offset, end, count]) is set, when the scan stops, to the offset and end of the
    last record yielded and the count yielded added: a caller learns them without looking at
    each record, so it can ``yield from`` the scan (start-up reads millions of records).
    """
    size = len(buf)
    pos = start
    unpack, crc, position = HEADER.unpack_from, crc32, _POSITION.pack
    hseed, pseed = seeds
    n, last, end = 0, -1, -1
    try:
        while pos < size:
            if size - pos >= HEADER_SIZE:  # fast path: an intact record (what check_record does)
                magic, rtype, _flags, length, pcrc, hcrc = unpack(buf, pos)
                start = pos + HEADER_SIZE
                if (magic == MAGIC and rtype and start + length <= size
                        and crc(buf[pos:pos + 12], crc(position(segment, pos), hseed)) == hcrc):
                    payload = buf[start:start + length]
                    if crc(payload, pseed) == pcrc:
                        yield rtype, payload, segment, pos
                        n, last = n + 1, pos
                        pos = end = start + length
                        continue
            found = check_record(buf, segment, pos, seeds=seeds)
            if not isinstance(found, str):
                yield found[0], found[1], segment, pos
                n, last = n + 1, pos
                pos = end = pos + HEADER_SIZE + len(found[1])
                continue
            nonzero = first_nonzero(buf, pos, size)
            if nonzero < 0:
                return
            reason = found if nonzero == pos else "zero gap"
            nxt = _resync(buf, segment, max(nonzero, pos + 1), seeds)
            if nxt is None:
                dropped.append((pos, last_nonzero(buf, pos, size) + 1 - pos, reason))
                return
            dropped.append((pos, nxt[0] - pos, reason))
            yield nxt[1], nxt[2], segment, nxt[0]
            n, last = n + 1, nxt[0]
            pos = end = nxt[0] + HEADER_SIZE + len(nxt[2])
    finally:
        if tally is not None and n:
            tally[:] = [last, end, tally[2] + n]


def write_all(fd: int, buffers: Sequence[bytes | memoryview], offset: int) -> int:
    """pwritev every buffer at offset, coping with IOV_MAX and short writes; returns bytes."""
    total = 0
    pending = list(buffers)
    while pending:
        batch = pending[:_IOV_MAX]
        written = os.pwritev(fd, batch, offset + total)
        if written <= 0:
            raise OSError(errno.EIO, "pwritev wrote nothing")
        total += written
        expected = sum(map(len, batch))
        if written == expected:
            del pending[:_IOV_MAX]
            continue
        done = 0
        while pending and written >= done + len(pending[0]):
            done += len(pending.pop(0))
        pending[0] = memoryview(pending[0])[written - done :]
    return total


def fsync_dir(directory: Path) -> None:
    """Make creations, renames and deletions in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def create_segment(directory: Path, segment: int, size: int, *, zero: bool = True,
                   fence: Callable[[], None] | None = None) -> int:
    """Create segment file `segment`, zero-filled to `size` bytes, and return an O_RDWR fd.

    The zeros are written (not fallocated) and synced under a temporary name, then renamed: a
    later fdatasync after appending into the file has no block allocation or size change to
    flush, and a crash never leaves a half-prepared file under a segment name. ``zero=False``
    allocates the blocks without writing them (they read as zeros all the same): for a
    journal taking large records, where writing every byte twice would halve what the disk
    gives and one extent update per fdatasync is nothing beside a megabyte of data. ``fence``
    (a lease master's check, storage/lease.py) runs before each name is touched: a master that
    lost the journal must not put a file into it.
    """
    path = directory / segment_name(segment)
    if fence is not None:
        fence()
    if size <= 0:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        fsync_dir(directory)
        return fd
    tmp = path.with_name(path.name + TMP_SUFFIX)
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if zero:
            zeros = bytes(min(size, _ZERO_CHUNK))
            done = 0
            while done < size:
                done += os.pwrite(fd, zeros[: size - done], done)
        else:
            os.posix_fallocate(fd, 0, size)
        os.fsync(fd)
        if fence is not None:
            fence()
        os.rename(tmp, path)
        fsync_dir(directory)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    return fd
