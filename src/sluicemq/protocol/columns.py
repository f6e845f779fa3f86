"""Column batches: many messages packed into one MESSAGE body, laid out as columns.

Why: a range read of a million small messages as a million MESSAGE frames costs the reader a
Python step per frame (parse, unescape, an object) and the broker one per frame to encode.
Packed as columns, the reader turns a frame into Arrow arrays (or anything else) without a
loop per message, and the broker writes one frame per few MiB. docs/replay-protocol.md
(section 2b) describes it for other languages; this module is the whole format, with no I/O.

Layout, little-endian; every section starts at a multiple of 8 bytes (zero padding)::

    magic      4 bytes  b"SLC1"
    count      u32      n, the messages in this batch
    sections:  seq        u64[n]   broker sequence number (= message id)
               timestamp  i64[n]   ms since the epoch the broker accepted it (0: unknown)
               expires    i64[n]   ms since the epoch, 0: never
               priority   u8[n]    0-9
               flags      u8[n]    bit 0 redelivered, bit 1 persistent
               hoff       i32[n+1] offsets of each message's headers in ``hdata``
               boff       i32[n+1] offsets of each body in ``bdata``
               hdata      bytes    the headers of each message as one JSON object (UTF-8)
               bdata      bytes    the bodies, back to back

The offsets are Arrow's variable-size binary layout, so ``hoff``/``hdata`` and ``boff``/``bdata``
become string and binary arrays without copying. A batch is at most 2 GiB - 1 by that choice;
senders cut batches far below it (``ColumnWriter.nbytes``).
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import accumulate, islice
from operator import le

MAGIC = b"SLC1"
COLUMNS = FORMAT = "columns"  # the value of the sluice-format header that names this layout
CONTENT_TYPE = "application/x-sluice-columns"  # on each batch's MESSAGE frame
REDELIVERED = 1
PERSISTENT = 2
MAX_BATCH = (1 << 31) - 1
_HEAD = struct.Struct("<4sI")


def _pad(n: int) -> int:
    return -n & 7


class ColumnWriter:
    """Accumulates messages; ``finish`` gives the body's buffers (to write without joining)."""

    __slots__ = ("_bdata", "_blen", "_boff", "_expires", "_flags", "_hdata", "_hlen", "_hoff",
                 "_prio", "_seq", "_ts")

    def __init__(self) -> None:
        self._seq = array("Q")
        self._ts = array("q")
        self._expires = array("q")
        self._prio = bytearray()
        self._flags = bytearray()
        self._hoff = array("i", [0])
        self._boff = array("i", [0])
        self._hdata: list[bytes | memoryview] = []
        self._bdata: list[bytes | memoryview] = []
        self._hlen = 0
        self._blen = 0

    def __len__(self) -> int:
        return len(self._seq)

    @property
    def last_seq(self) -> int:
        return self._seq[-1]

    @property
    def nbytes(self) -> int:
        """The encoded size so far (within 64 bytes of padding)."""
        return 64 + 30 * len(self._seq) + self._hlen + self._blen

    def add(self, seq: int, timestamp: int, expires: int, priority: int, flags: int,
            headers_json: bytes | memoryview, body: bytes | memoryview) -> None:
        hlen = self._hlen + len(headers_json)
        blen = self._blen + len(body)
        if hlen + blen > MAX_BATCH:
            raise ValueError("a column batch must stay below 2 GiB")
        self._seq.append(seq)
        self._ts.append(timestamp)
        self._expires.append(expires)
        self._prio.append(priority)
        self._flags.append(flags)
        self._hdata.append(headers_json)
        self._bdata.append(body)
        self._hlen = hlen
        self._blen = blen
        self._hoff.append(hlen)
        self._boff.append(blen)

    def extend(self, seqs: list[int], timestamps: list[int], expires: list[int],
               priority: bytes, flags: bytes, headers: list[memoryview],
               bodies: list[memoryview]) -> None:
        """``add`` for many messages at once (equal-length columns): C-speed appends."""
        if not seqs:
            return
        hlens, blens = list(map(len, headers)), list(map(len, bodies))
        hend, bend = self._hlen + sum(hlens), self._blen + sum(blens)
        if hend + bend > MAX_BATCH:
            raise ValueError("a column batch must stay below 2 GiB")
        self._seq.extend(seqs)
        self._ts.extend(timestamps)
        self._expires.extend(expires)
        self._prio += priority
        self._flags += flags
        self._hdata += headers
        self._bdata += bodies
        self._hoff.extend(accumulate(hlens, initial=self._hlen))
        self._boff.extend(accumulate(blens, initial=self._blen))
        del self._hoff[-len(hlens) - 1], self._boff[-len(blens) - 1]  # the initial repeats
        self._hlen, self._blen = hend, bend

    def finish(self) -> list[bytes | memoryview]:
        """The batch as buffers in order; their total length is the body's length."""
        return assemble(len(self._seq), [self._seq, self._ts, self._expires, self._prio,
                                         self._flags, self._hoff, self._boff],
                        self._hdata, self._hlen, self._bdata)


def assemble(count: int, fixed: list[array | bytes | bytearray | memoryview],
             hdata: list[bytes | memoryview], hlen: int,
             bdata: list[bytes | memoryview]) -> list[bytes | memoryview]:
    """A batch's buffers from its parts: the seven fixed sections in layout order (seq,
    timestamp, expires, priority, flags, header offsets, body offsets), then the header bytes
    (``hlen`` of them) and the body bytes, each given as pieces."""
    out: list[bytes | memoryview] = [_HEAD.pack(MAGIC, count)]
    size = _HEAD.size
    for part in fixed:
        data = part.tobytes() if isinstance(part, array) else memoryview(part)
        out += [data, bytes(_pad(size + len(data)))]
        size += len(data) + _pad(size + len(data))
    out.append(b"".join(hdata))  # small pieces: one buffer writes cheaper than thousands
    out.append(bytes(_pad(hlen)))
    out += bdata
    return out


@dataclass(frozen=True, slots=True)
class Columns:
    """A decoded batch: views into the received body (no copies); ``*_at`` are byte offsets
    of each section in ``body``, for readers that wrap the body's memory (Arrow)."""

    count: int
    body: memoryview
    seq_at: int
    timestamp_at: int
    expires_at: int
    priority_at: int
    flags_at: int
    hoff_at: int
    boff_at: int
    hdata_at: int
    bdata_at: int

    def _array(self, code: str, at: int, n: int) -> array:
        out = array(code)
        out.frombytes(self.body[at:at + n * out.itemsize])
        return out

    @property
    def seq(self) -> array:
        return self._array("Q", self.seq_at, self.count)

    @property
    def timestamp(self) -> array:
        return self._array("q", self.timestamp_at, self.count)

    @property
    def expires(self) -> array:
        return self._array("q", self.expires_at, self.count)

    @property
    def priority(self) -> bytes:
        return bytes(self.body[self.priority_at:self.priority_at + self.count])

    @property
    def flags(self) -> bytes:
        return bytes(self.body[self.flags_at:self.flags_at + self.count])

    @property
    def header_offsets(self) -> array:
        return self._array("i", self.hoff_at, self.count + 1)

    @property
    def body_offsets(self) -> array:
        return self._array("i", self.boff_at, self.count + 1)

    def headers_json(self, i: int) -> bytes:
        off = self.header_offsets
        return bytes(self.body[self.hdata_at + off[i]:self.hdata_at + off[i + 1]])

    def body_of(self, i: int) -> bytes:
        off = self.body_offsets
        return bytes(self.body[self.bdata_at + off[i]:self.bdata_at + off[i + 1]])

    def bodies(self) -> Iterable[bytes]:
        off, base = self.body_offsets, self.bdata_at
        return (bytes(self.body[base + off[i]:base + off[i + 1]]) for i in range(self.count))


def decode(body: bytes | bytearray | memoryview) -> Columns:
    """The columns of a batch; ValueError if ``body`` is not a well-formed one."""
    view = memoryview(body).cast("B")
    if len(view) < _HEAD.size:
        raise ValueError("column batch: shorter than its header")
    magic, n = _HEAD.unpack_from(view, 0)
    if magic != MAGIC:
        raise ValueError(f"column batch: bad magic {bytes(magic)!r}")
    at = _HEAD.size
    offsets: list[int] = []
    for width in (8, 8, 8, 1, 1, 4, 4):
        size = width * (n + (1 if width == 4 else 0))
        offsets.append(at)
        at += size + _pad(at + size)
    if at > len(view):
        raise ValueError("column batch: truncated columns")
    hoff_at, boff_at = offsets[5], offsets[6]
    hoff = array("i")
    hoff.frombytes(view[hoff_at:hoff_at + 4 * (n + 1)])
    boff = array("i")
    boff.frombytes(view[boff_at:boff_at + 4 * (n + 1)])
    for name, off in (("header", hoff), ("body", boff)):
        if off[0] != 0 or not all(map(le, off, islice(off, 1, None))):
            raise ValueError(f"column batch: {name} offsets are not ascending from 0")
    hdata_at = at
    bdata_at = hdata_at + hoff[n] + _pad(hoff[n])
    if bdata_at + boff[n] != len(view):
        raise ValueError(f"column batch: {len(view)} bytes, the offsets say "
                         f"{bdata_at + boff[n]}")
    seq_at, ts_at, exp_at, prio_at, flags_at, hoff_at, boff_at = offsets
    return Columns(n, view, seq_at, ts_at, exp_at, prio_at, flags_at, hoff_at, boff_at,
                   hdata_at, bdata_at)
