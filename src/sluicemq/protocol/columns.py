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

The spans layout (``SpanWriter``) is what the broker reads out of its journal: the same five
fixed sections, then the values where they lie in ``data`` (whole stored records, as read)::

    magic      4 bytes  b"SLC2"
    count      u32      n
    sections:  seq, timestamp, expires, priority, flags   as above
               spans      i32[3n]  per message: headers start, body start, body end in ``data``
               data       bytes    each message's headers JSON and body, in message order,
                                   with bytes that belong to no value between them

Why a second layout: packing the values back to back costs the writer a copy and two slices
per message; here the broker sends neighbouring journal records as they were read and only
says where each value is. Spans ascend (a message's body ends at or before the next one's
headers start), so the 3n numbers are the offsets of a binary array of 3n - 1 values whose
every third value is a message's headers (then its body, then the bytes between): a reader
takes those with one gather (Arrow's ``take``), never a loop per message.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import accumulate, islice
from operator import le

MAGIC = b"SLC1"
SPANS_MAGIC = b"SLC2"
PACKED, SPANS = "packed", "spans"  # the layouts, as a range read asks for one
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

    def extend_joined(self, seqs: bytes, timestamps: bytes, expires: bytes, priority: bytes,
                      flags: bytes, header_lengths: list[int], headers: bytes,
                      body_lengths: list[int], bodies: bytes) -> None:
        """``extend`` for columns that arrive packed: the fixed columns as buffers of their
        machine types' bytes (u64, i64, i64), the headers and bodies each joined into one
        buffer and cut by their lengths."""
        n = len(header_lengths)
        if not n:
            return
        hend, bend = self._hlen + len(headers), self._blen + len(bodies)
        if hend + bend > MAX_BATCH:
            raise ValueError("a column batch must stay below 2 GiB")
        if sum(header_lengths) != len(headers) or sum(body_lengths) != len(bodies):
            raise ValueError("column lengths do not add up to the joined columns")
        if not (len(priority) == len(flags) == len(body_lengths) == n
                and len(seqs) == len(timestamps) == len(expires) == 8 * n):
            raise ValueError("columns of different lengths")
        self._seq.frombytes(seqs)
        self._ts.frombytes(timestamps)
        self._expires.frombytes(expires)
        self._prio += priority
        self._flags += flags
        self._hdata.append(headers)
        self._bdata.append(bodies)
        self._hoff.extend(accumulate(header_lengths, initial=self._hlen))
        self._boff.extend(accumulate(body_lengths, initial=self._blen))
        del self._hoff[-n - 1], self._boff[-n - 1]  # the initial repeats
        self._hlen, self._blen = hend, bend

    def finish(self) -> list[bytes | memoryview]:
        """The batch as buffers in order; their total length is the body's length."""
        return assemble(len(self._seq), [self._seq, self._ts, self._expires, self._prio,
                                         self._flags, self._hoff, self._boff],
                        self._hdata, self._hlen, self._bdata)


class SpanWriter:
    """A batch in the spans layout: values are located in ``data`` rather than copied together.
    ``add`` appends one message's headers and body; ``add_run`` takes many messages whose
    values lie in pieces of data already (journal records as read)."""

    __slots__ = ("_data", "_expires", "_flags", "_prio", "_seq", "_size", "_spans", "_ts")

    def __init__(self) -> None:
        self._seq = array("Q")
        self._ts = array("q")
        self._expires = array("q")
        self._prio = bytearray()
        self._flags = bytearray()
        self._spans = array("i")
        self._data: list[bytes | memoryview] = []
        self._size = 0

    def __len__(self) -> int:
        return len(self._seq)

    @property
    def last_seq(self) -> int:
        return self._seq[-1]

    @property
    def data_size(self) -> int:
        """Bytes of data so far: where the next piece given to ``add_run`` starts."""
        return self._size

    @property
    def nbytes(self) -> int:
        """The encoded size so far (within 64 bytes of padding)."""
        return 64 + 30 * len(self._seq) + self._size

    def add(self, seq: int, timestamp: int, expires: int, priority: int, flags: int,
            headers_json: bytes | memoryview, body: bytes | memoryview) -> None:
        start, mid = self._size, self._size + len(headers_json)
        end = mid + len(body)
        if end > MAX_BATCH:
            raise ValueError("a column batch must stay below 2 GiB")
        self._seq.append(seq)
        self._ts.append(timestamp)
        self._expires.append(expires)
        self._prio.append(priority)
        self._flags.append(flags)
        self._spans.extend((start, mid, end))
        self._data += (headers_json, body)
        self._size = end

    def add_run(self, seqs: bytes, timestamps: bytes, expires: bytes, priority: bytes,
                flags: bytes, spans: bytes, pieces: list[memoryview]) -> None:
        """Messages whose values lie in ``pieces``: the fixed columns as their machine types'
        bytes (u64, i64, i64), ``spans`` as i32 triples counted from ``data_size`` (the pieces
        are appended there), ascending and within the pieces."""
        n = len(priority)
        size = self._size + sum(map(len, pieces))
        if not (len(flags) == n and len(seqs) == len(timestamps) == len(expires) == 8 * n
                and len(spans) == 12 * n):
            raise ValueError("columns of different lengths")
        if size > MAX_BATCH:
            raise ValueError("a column batch must stay below 2 GiB")
        added = array("i")
        added.frombytes(spans)
        if n and (added[0] < self._size or added[-1] > size):
            raise ValueError("spans outside the pieces they were given with")
        self._seq.frombytes(seqs)
        self._ts.frombytes(timestamps)
        self._expires.frombytes(expires)
        self._prio += priority
        self._flags += flags
        self._spans += added
        self._data += pieces
        self._size = size

    def finish(self) -> list[bytes | memoryview]:
        """The batch as buffers in order; their total length is the body's length."""
        return [*_sections(SPANS_MAGIC, len(self._seq), [
            self._seq, self._ts, self._expires, self._prio, self._flags, self._spans]),
                *self._data]


def _sections(magic: bytes, count: int, fixed: list[array | bytes | bytearray | memoryview]
              ) -> list[bytes | memoryview]:
    """The head and the fixed-size sections, each padded to end at a multiple of 8."""
    out: list[bytes | memoryview] = [_HEAD.pack(magic, count)]
    size = _HEAD.size
    for part in fixed:
        data = part.tobytes() if isinstance(part, array) else memoryview(part)
        out += [data, bytes(_pad(size + len(data)))]
        size += len(data) + _pad(size + len(data))
    return out


def assemble(count: int, fixed: list[array | bytes | bytearray | memoryview],
             hdata: list[bytes | memoryview], hlen: int,
             bdata: list[bytes | memoryview]) -> list[bytes | memoryview]:
    """A batch's buffers from its parts: the seven fixed sections in layout order (seq,
    timestamp, expires, priority, flags, header offsets, body offsets), then the header bytes
    (``hlen`` of them) and the body bytes, each given as pieces."""
    out = _sections(MAGIC, count, fixed)
    out.append(b"".join(hdata))  # small pieces: one buffer writes cheaper than thousands
    out.append(bytes(_pad(hlen)))
    out += bdata
    return out


@dataclass(frozen=True, slots=True)
class Columns:
    """A decoded batch of either layout: views into the received body (no copies); ``*_at``
    are byte offsets of each section in ``body``, for readers that wrap the body's memory
    (Arrow). Packed batches have ``hoff_at``/``boff_at``/``hdata_at``/``bdata_at``, spans
    batches ``spans_at``/``data_at`` (the others are -1)."""

    count: int
    body: memoryview
    seq_at: int
    timestamp_at: int
    expires_at: int
    priority_at: int
    flags_at: int
    hoff_at: int = -1
    boff_at: int = -1
    hdata_at: int = -1
    bdata_at: int = -1
    spans_at: int = -1
    data_at: int = -1

    @property
    def layout(self) -> str:
        return SPANS if self.spans_at >= 0 else PACKED

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

    def bounds(self) -> tuple[list[int], list[int], list[int], list[int]]:
        """(header starts, header ends, body starts, body ends) of every message, as byte
        offsets in ``body``, whatever the layout."""
        n = self.count
        if self.layout == SPANS:
            spans = [self.data_at + x for x in self._array("i", self.spans_at, 3 * n)]
            return spans[0::3], spans[1::3], spans[1::3], spans[2::3]
        hoff = [self.hdata_at + x for x in self._array("i", self.hoff_at, n + 1)]
        boff = [self.bdata_at + x for x in self._array("i", self.boff_at, n + 1)]
        return hoff[:-1], hoff[1:], boff[:-1], boff[1:]

    def all_headers_json(self) -> list[bytes]:
        hs, he, _bs, _be = self.bounds()
        return [bytes(self.body[a:b]) for a, b in zip(hs, he, strict=True)]

    def headers_json(self, i: int) -> bytes:
        hs, he, _bs, _be = self.bounds()
        return bytes(self.body[hs[i]:he[i]])

    def body_of(self, i: int) -> bytes:
        _hs, _he, bs, be = self.bounds()
        return bytes(self.body[bs[i]:be[i]])

    def body_views(self) -> list[memoryview]:
        _hs, _he, bs, be = self.bounds()
        return [self.body[a:b] for a, b in zip(bs, be, strict=True)]

    def bodies(self) -> Iterable[bytes]:
        return (bytes(v) for v in self.body_views())

    @property
    def body_bytes(self) -> int:
        """The bodies' total length."""
        _hs, _he, bs, be = self.bounds()
        return sum(be) - sum(bs)


def decode(body: bytes | bytearray | memoryview) -> Columns:
    """The columns of a batch of either layout; ValueError if ``body`` is not a well-formed
    one."""
    view = memoryview(body).cast("B")
    if len(view) < _HEAD.size:
        raise ValueError("column batch: shorter than its header")
    magic, n = _HEAD.unpack_from(view, 0)
    if magic not in (MAGIC, SPANS_MAGIC):
        raise ValueError(f"column batch: bad magic {bytes(magic)!r}")
    spans = magic == SPANS_MAGIC
    at = _HEAD.size
    offsets: list[int] = []
    for width, count in (8, n), (8, n), (8, n), (1, n), (1, n), *(
            [(4, 3 * n)] if spans else [(4, n + 1), (4, n + 1)]):
        offsets.append(at)
        at += width * count + _pad(at + width * count)
    if at > len(view):
        raise ValueError("column batch: truncated columns")
    if spans:
        return _spans(view, n, offsets, at)
    hoff_at, boff_at = offsets[5], offsets[6]
    hoff = array("i")
    hoff.frombytes(view[hoff_at:hoff_at + 4 * (n + 1)])
    boff = array("i")
    boff.frombytes(view[boff_at:boff_at + 4 * (n + 1)])
    for name, off in (("header", hoff), ("body", boff)):
        if off[0] != 0 or not _ascending(off):
            raise ValueError(f"column batch: {name} offsets are not ascending from 0")
    hdata_at = at
    bdata_at = hdata_at + hoff[n] + _pad(hoff[n])
    if bdata_at + boff[n] != len(view):
        raise ValueError(f"column batch: {len(view)} bytes, the offsets say "
                         f"{bdata_at + boff[n]}")
    seq_at, ts_at, exp_at, prio_at, flags_at = offsets[:5]
    return Columns(n, view, seq_at, ts_at, exp_at, prio_at, flags_at, hoff_at=hoff_at,
                   boff_at=boff_at, hdata_at=hdata_at, bdata_at=bdata_at)


def _spans(view: memoryview, n: int, offsets: list[int], data_at: int) -> Columns:
    # numpy only where a spans batch is checked: importing it costs ~85 ms, which every
    # process that only names the format would pay - Spark starts a fresh planning process
    # per streaming query, and its start is on the query's critical path.
    import numpy as np

    spans = np.frombuffer(view, "<i4", 3 * n, offsets[5])
    if n and (spans[0] < 0 or spans[-1] > len(view) - data_at
              or bool((spans[1:] < spans[:-1]).any())):
        raise ValueError("column batch: spans are not ascending within the data")
    seq_at, ts_at, exp_at, prio_at, flags_at = offsets[:5]
    return Columns(n, view, seq_at, ts_at, exp_at, prio_at, flags_at, spans_at=offsets[5],
                   data_at=data_at)


def _ascending(values: array) -> bool:
    return all(map(le, values, islice(values, 1, None)))
