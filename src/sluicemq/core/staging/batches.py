"""A staged column batch turned into ready-made STAGE record operations, with array steps.

Why its own path: a sink's part arrives as column batches of thousands of rows a frame. Taken
one row at a time - decode the headers, encode a MSG payload, spool it, read it back at COMMIT,
parse its head, note its place - it cost the broker ~15 us a row. Here a batch is checked and
encoded once: each row's headers are validated by a typed C decoder (msgspec), the rows' fixed
heads are one array, the operations are joined in one call, and the spool holds one entry
per batch (``writer.py`` journals it as one record at once). The journal format is unchanged:
the block is exactly the record ``records.encode_tx`` would have written.

What a row's stored headers are: its own JSON object as sent, with the frame's headers (and
``persistent``) spliced in before its closing brace - no re-encoding. A row whose keys clash
with the frame's headers (or transport headers, or a producer id), or whose text has white
space around the object, is re-encoded from the merged dictionary, as a plain SEND would be.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import msgspec

from sluicemq.core.routing.message import MAX_PRIORITY, TRANSPORT_HEADERS
from sluicemq.errors import ProtocolError
from sluicemq.protocol.columns import Columns
from sluicemq.storage import records

# A MSG operation's fixed part: the transaction op head (records._OP_HEAD) and the MSG head
# (records.MSG_HEAD), 37 packed little-endian bytes (a numpy dtype, built by the first batch).
_FIXED_FIELDS = [("rtype", "u1"), ("length", "<u4"), ("mid", "<u8"), ("ts", "<i8"),
                 ("expires", "<i8"), ("priority", "u1"), ("flags", "u1"), ("klen", "<u2"),
                 ("hlen", "<u4")]
_DECODE = msgspec.json.Decoder(dict[str, str]).decode


@dataclass(frozen=True, slots=True)
class Rows:
    """A batch's rows as MSG operations: ``block`` is a prefix and ``count`` ops back to back
    (op head and payload each), ``inner`` each op's payload start within the block, ``size``
    each body's length, all for the one journal ``key``."""

    key: str
    priority: bytes
    inner: array
    size: array
    block: bytes

    @property
    def count(self) -> int:
        return len(self.priority)


def encode_rows(batch: Columns, key: str, common: dict[str, str], now_ms: int,
                prefix: bytes = b"", owner: bytes = b"") -> Rows:
    """The rows of ``batch`` for journal ``key`` (its seq and timestamp columns are ignored;
    each row's headers are ``common`` plus its own), the block starting with ``prefix`` (a
    record's head: the block is then the whole record), each row naming ``owner`` as its sender
    (``records.encode_owner``; b"": none); ProtocolError names the first bad row."""
    n = batch.count
    hs, he, bs, be = batch.bounds()
    body = batch.body
    texts = [body[a:b] for a, b in zip(hs, he, strict=True)]
    try:
        own = list(map(_DECODE, texts))
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise ProtocolError(f"bad column batch: the headers of message {_first_bad(texts)} "
                            "are not a JSON object of strings", fatal=False) from None
    priority = batch.priority
    if n and max(priority) > MAX_PRIORITY:
        raise ProtocolError(f"bad column batch: a priority above {MAX_PRIORITY}", fatal=False)
    common = {**common, "persistent": "true"}
    tail = records.encode_headers(common)[1:]  # '"k":"v",...}': spliced before each row's '}'
    comma_tail = b"," + tail
    taken = frozenset(common) | TRANSPORT_HEADERS | {records.PRODUCER_HEADER}
    import numpy as np  # here, not at import: ~15 MiB of RSS a broker may not need

    fixed_dtype = np.dtype(_FIXED_FIELDS)
    raw = np.frombuffer(body, np.uint8)
    starts, ends = np.array(hs, np.int64), np.array(he, np.int64)
    braced = (ends - starts >= 2) & (raw[starts] == ord("{")) & (raw[np.maximum(ends - 1, 0)]
                                                                    == ord("}"))
    fast = braced & np.fromiter(map(taken.isdisjoint, own), bool, n)
    for i in np.flatnonzero(~fast).tolist():  # the few rows re-encoded whole
        merged = {**common, **{a: v for a, v in own[i].items() if a not in TRANSPORT_HEADERS},
                  "persistent": "true"}
        texts[i] = memoryview(records.encode_headers(merged))
    as_sent = fast.tolist()
    heads = [t[:-1] if f else t for t, f in zip(texts, as_sent, strict=True)]
    tails = [(comma_tail if h else tail) if f else b""
             for h, f in zip(own, as_sent, strict=True)]
    k = key.encode()
    ok = owner + k  # the owner field sits between the fixed head and the key
    hlen = np.fromiter(map(len, heads), np.int64, n) + np.fromiter(map(len, tails), np.int64, n)
    blen = np.array(be, np.int64) - np.array(bs, np.int64)
    fixed = np.zeros(n, fixed_dtype)
    fixed["rtype"] = records.MSG
    fixed["length"] = records.MSG_HEAD.size + len(ok) + hlen + blen
    fixed["ts"] = now_ms
    fixed["expires"] = np.frombuffer(batch.expires.tobytes(), np.int64)
    fixed["priority"] = np.frombuffer(priority, np.uint8)
    fixed["flags"] = records.OWNER_FLAG if owner else 0
    fixed["klen"] = len(k)
    fixed["hlen"] = hlen
    heads_fixed = memoryview(fixed.tobytes())
    w = fixed_dtype.itemsize
    assert w == records.OP_HEAD_SIZE + records.MSG_HEAD.size
    parts: list[bytes | memoryview] = [prefix, *[b""] * (5 * n)]
    parts[1::5] = [heads_fixed[i:i + w] for i in range(0, n * w, w)]
    parts[2::5] = [ok] * n
    parts[3::5] = heads
    parts[4::5] = tails
    parts[5::5] = [body[a:b] for a, b in zip(bs, be, strict=True)]
    op_size = w + len(ok) + hlen + blen
    inner = np.cumsum(op_size) - op_size + (len(prefix) + records.OP_HEAD_SIZE)
    return Rows(key, bytes(priority), array("I", inner.astype(np.uint32).tobytes()),
                array("I", blen.astype(np.uint32).tobytes()), b"".join(parts))


def _first_bad(texts: list[memoryview]) -> int:
    for i, text in enumerate(texts):
        try:
            _DECODE(text)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return i
    return -1
