"""Payload encodings of the journal's record types; the journal itself sees opaque bytes.

Every record names its queue by *key*: ``q:NAME`` for a queue, ``t:NAME`` for a topic message
(fanned out to durable subscriptions on replay), ``d:CLIENT:SUB`` for a durable subscription.
Layouts are little-endian and versionless on purpose: a new layout gets a new record type.
A MSG record may name the login that sent it (``OWNER_FLAG``): a u16 length and the UTF-8
name right after the fixed head, before the key; a record without one (security off, or
written before owners were stored) is the anonymous user's (docs/user-store-share.md).
"""

from __future__ import annotations

import json
import struct
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import msgspec

MSG = 1  # one message stored for a queue key (or a topic key: fanned out on replay)
ACK = 2  # messages removed from queue keys: consumed, expired or moved
TX = 3  # several MSG/ACK operations applied atomically (transactions, DLQ moves)
SUB = 4  # a durable subscription created (or replaced)
UNSUB = 5  # a durable subscription removed, with everything it held
# 16-19: staged publishing and memo tables, laid out in storage/staging_records.py.

PRODUCER_HEADER = "sluice-producer-id"
PRODUCER_FLAG = 1  # MSG flags bit: the headers name a producer (replay reads them for dedup)
OWNER_FLAG = 2  # MSG flags bit: the sender's login follows the fixed head (``encode_owner``)

MSG_HEAD = struct.Struct("<QqqBBHI")  # mid, timestamp, expires, priority, flags, keylen, hdrlen
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_TX_HEAD = struct.Struct("<BH")  # final flag, txid length
_OP_HEAD = struct.Struct("<BI")  # op type, op length
OP_HEAD_SIZE = _OP_HEAD.size


@dataclass(slots=True)
class StoredMessage:
    """A decoded MSG record."""

    key: str
    mid: int
    timestamp: int
    expires: int
    priority: int
    headers: dict[str, str]
    body: bytes
    owner: bytes = b""  # the sender as ``encode_owner`` wrote it; b"": anonymous


def encode_owner(login: str) -> bytes:
    """A login as MSG records carry it (u16 length, UTF-8): encoded once per connection."""
    b = login.encode()
    if len(b) > 0xFFFF:
        raise ValueError("a login of more than 65,535 bytes cannot own stored messages")
    return _U16.pack(len(b)) + b


def owner_name(owner: bytes) -> str:
    """The login of an ``encode_owner`` value; "anonymous" for b"" (no owner stored)."""
    return owner[2:].decode() if owner else "anonymous"


def owner_prefix(payload: bytes | memoryview, flags: int) -> int:
    """Bytes of the owner field after the fixed head (0 without ``OWNER_FLAG``)."""
    if flags & OWNER_FLAG:
        n: int = _U16.unpack_from(payload, MSG_HEAD.size)[0]
        return 2 + n
    return 0


def encode_message(key: str, mid: int, timestamp: int, expires: int, priority: int,
                   headers: dict[str, str], body: bytes | memoryview,
                   owner: bytes = b"") -> bytes:
    k = key.encode()  # inline, not encode_message_head + body: every persistent SEND pays
    h = encode_headers(headers)
    flags = PRODUCER_FLAG if PRODUCER_HEADER in headers else 0
    if owner:
        return b"".join((MSG_HEAD.pack(mid, timestamp, expires, priority, flags | OWNER_FLAG,
                                       len(k), len(h)), owner, k, h, body))
    return b"".join((MSG_HEAD.pack(mid, timestamp, expires, priority, flags, len(k), len(h)),
                     k, h, body))


def encode_message_head(key: str, mid: int, timestamp: int, expires: int, priority: int,
                        headers: dict[str, str], owner: bytes = b"") -> bytes:
    """A MSG record up to its body: ``encode_message`` is this followed by the body."""
    k = key.encode()
    h = encode_headers(headers)
    flags = PRODUCER_FLAG if PRODUCER_HEADER in headers else 0
    if owner:
        flags |= OWNER_FLAG
    return b"".join((MSG_HEAD.pack(mid, timestamp, expires, priority, flags, len(k), len(h)),
                     owner, k, h))


def encode_message_json(key: str, mid: int, timestamp: int, expires: int, priority: int,
                        headers_json: bytes, body: bytes | memoryview) -> bytes:
    """``encode_message`` with the headers already encoded (a JSON object of strings without
    a producer id: staged column batches splice each row's JSON instead of re-encoding it)."""
    k = key.encode()
    return b"".join((MSG_HEAD.pack(mid, timestamp, expires, priority, 0, len(k),
                                    len(headers_json)), k, headers_json, body))


def decode_message(payload: bytes | memoryview) -> StoredMessage:
    mid, ts, expires, priority, flags, klen, hlen = MSG_HEAD.unpack_from(payload, 0)
    pos = MSG_HEAD.size
    owner = b""
    if flags & OWNER_FLAG:
        n = owner_prefix(payload, flags)
        owner = bytes(payload[pos:pos + n])
        pos += n
    key = bytes(payload[pos:pos + klen]).decode()
    pos += klen
    headers = _decode_json(payload[pos:pos + hlen])
    pos += hlen
    return StoredMessage(key, mid, ts, expires, priority, headers, bytes(payload[pos:]), owner)


def message_owner(payload: bytes | memoryview) -> bytes:
    """The owner field of a MSG record (``encode_owner``'s form; b"" when it has none), from
    a prefix holding at least the fixed head and the owner."""
    flags = MSG_HEAD.unpack_from(payload, 0)[4]
    n = owner_prefix(payload, flags)
    return bytes(payload[MSG_HEAD.size:MSG_HEAD.size + n])


def rekey_message(payload: bytes | memoryview, key: str, mid: int) -> bytes:
    """The MSG payload ``payload`` stored under ``key`` and ``mid`` instead, headers and body
    spliced as they are: compaction copies records forward without decoding their headers
    (a message with megabytes of headers costs a copy, not a JSON round trip)."""
    _mid, ts, expires, priority, flags, klen, hlen = MSG_HEAD.unpack_from(payload, 0)
    k = key.encode()
    view = memoryview(payload)
    o = MSG_HEAD.size + owner_prefix(payload, flags)
    return b"".join((MSG_HEAD.pack(mid, ts, expires, priority, flags, len(k), hlen),
                     view[MSG_HEAD.size:o], k, view[o + klen:]))


def message_body(payload: bytes | memoryview) -> memoryview:
    """Just the body of a MSG record, without decoding its headers (delivery of large bodies)."""
    _mid, _ts, _exp, _prio, flags, klen, hlen = MSG_HEAD.unpack_from(payload, 0)
    return memoryview(payload)[MSG_HEAD.size + owner_prefix(payload, flags) + klen + hlen:]


def message_columns(payload: bytes | memoryview
                    ) -> tuple[int, int, int, memoryview, memoryview]:
    """(timestamp, expires, priority, headers as stored JSON, body) of a MSG record, as views
    and without decoding the headers: a column batch carries the JSON as it is."""
    _mid, ts, expires, priority, flags, klen, hlen = MSG_HEAD.unpack_from(payload, 0)
    view = memoryview(payload)
    pos = MSG_HEAD.size + owner_prefix(payload, flags) + klen
    return ts, expires, priority, view[pos:pos + hlen], view[pos + hlen:]


_encode_json = msgspec.json.Encoder().encode
_decode_json = msgspec.json.decode


def encode_headers(headers: dict[str, str]) -> bytes:
    """Headers as a MSG record stores them (compact JSON, UTF-8; the same bytes as
    ``json.dumps(headers, separators=(",", ":"), ensure_ascii=False).encode()``). msgspec,
    because every persistent message pays for this on the event loop: ~0.3 us instead of
    ~3.4 us (and ~0.5 instead of ~2.8 us to read them back)."""
    return _encode_json(headers)


def message_prefix_size(payload: bytes | memoryview) -> int:
    """Bytes of a MSG record before its body: fixed head, owner, key and headers (from a
    prefix holding at least the fixed head and the owner's length)."""
    _mid, _ts, _exp, _prio, flags, klen, hlen = MSG_HEAD.unpack_from(payload, 0)
    return MSG_HEAD.size + owner_prefix(payload, flags) + klen + hlen


def message_headers(prefix: bytes | memoryview) -> dict[str, str]:
    """The headers of a MSG record from a prefix holding at least ``message_prefix_size``."""
    _mid, _ts, _exp, _prio, flags, klen, hlen = MSG_HEAD.unpack_from(prefix, 0)
    pos = MSG_HEAD.size + owner_prefix(prefix, flags) + klen
    headers: dict[str, str] = _decode_json(prefix[pos:pos + hlen])
    return headers


def encode_acks(acks: Iterable[tuple[str, int]]) -> bytes:
    """Group (key, mid) pairs by key: a batch of auto-acks costs ~8 bytes a message."""
    by_key: dict[str, array] = {}
    for key, mid in acks:
        by_key.setdefault(key, array("Q")).append(mid)
    parts = [_U16.pack(len(by_key))]
    for key, mids in by_key.items():
        k = key.encode()
        parts += [_U16.pack(len(k)), k, _U32.pack(len(mids)), mids.tobytes()]
    return b"".join(parts)


def encode_ack_run(key: str, mids: array) -> bytes:
    """``encode_acks`` of many ids of one key, from an array (the same layout)."""
    k = key.encode()
    return b"".join((_U16.pack(1), _U16.pack(len(k)), k, _U32.pack(len(mids)),
                     array("Q", mids).tobytes()))


def decode_acks(payload: bytes | memoryview) -> Iterator[tuple[str, int]]:
    (nkeys,) = _U16.unpack_from(payload, 0)
    pos = 2
    for _ in range(nkeys):
        (klen,) = _U16.unpack_from(payload, pos)
        pos += 2
        key = bytes(payload[pos:pos + klen]).decode()
        pos += klen
        (n,) = _U32.unpack_from(payload, pos)
        pos += 4
        mids = array("Q")
        mids.frombytes(bytes(payload[pos:pos + 8 * n]))
        pos += 8 * n
        for mid in mids:
            yield key, mid


def encode_tx(txid: str, ops: Iterable[tuple[int, bytes]], *, final: bool = True) -> bytes:
    """A transaction's operations (MSG or ACK payloads) in one record."""
    t = txid.encode()
    parts = [_TX_HEAD.pack(1 if final else 0, len(t)), t]
    for rtype, payload in ops:
        parts += [_OP_HEAD.pack(rtype, len(payload)), payload]
    return b"".join(parts)


def encode_op(rtype: int, payload: bytes | memoryview) -> list[bytes | memoryview]:
    """One transaction operation as ``encode_tx`` lays it out (head, payload)."""
    return [_OP_HEAD.pack(rtype, len(payload)), payload]


def encode_tx_ops(txid: str, encoded: Iterable[bytes | memoryview], *,
                  final: bool = True) -> bytes:
    """``encode_tx`` of operations already laid out (``encode_op``, or blocks of them)."""
    t = txid.encode()
    return b"".join((_TX_HEAD.pack(1 if final else 0, len(t)), t, *encoded))


def decode_tx(payload: bytes | memoryview) -> tuple[str, bool, list[tuple[int, memoryview]]]:
    view = memoryview(payload)
    final, tlen = _TX_HEAD.unpack_from(view, 0)
    pos = _TX_HEAD.size
    txid = bytes(view[pos:pos + tlen]).decode()
    pos += tlen
    ops = []
    while pos < len(view):
        rtype, length = _OP_HEAD.unpack_from(view, pos)
        pos += _OP_HEAD.size
        ops.append((rtype, view[pos:pos + length]))
        pos += length
    return txid, bool(final), ops


def tx_op_offsets(txid: str, ops: Iterable[tuple[int, bytes | memoryview]]) -> list[int]:
    """Where each op's payload starts inside ``encode_tx(txid, ops)`` (for ``tx_op_at``)."""
    pos = _TX_HEAD.size + len(txid.encode())
    out = []
    for _rtype, payload in ops:
        pos += _OP_HEAD.size
        out.append(pos)
        pos += len(payload)
    return out


def tx_op_at(payload: bytes | memoryview, offset: int) -> memoryview:
    """The op payload starting at ``offset`` of a TX record (a message inside a transaction)."""
    _rtype, length = _OP_HEAD.unpack_from(payload, offset - _OP_HEAD.size)
    return memoryview(payload)[offset:offset + length]


def message_head(payload: bytes | memoryview) -> tuple[int, int, int, str, int, int]:
    """(mid, priority, flags, key, header bytes offset, header length) without decoding the
    headers: replay needs no more for most records."""
    mid, _ts, _exp, priority, flags, klen, hlen = MSG_HEAD.unpack_from(payload, 0)
    pos = MSG_HEAD.size + owner_prefix(payload, flags)
    return mid, priority, flags, bytes(payload[pos:pos + klen]).decode(), pos + klen, hlen


@dataclass(slots=True)
class DurableSub:
    """A durable topic subscription as the journal remembers it."""

    key: str
    topic: str
    client_id: str
    name: str
    selector: str | None


def encode_sub(sub: DurableSub) -> bytes:
    return json.dumps({"key": sub.key, "topic": sub.topic, "client_id": sub.client_id,
                       "name": sub.name, "selector": sub.selector}).encode()


def decode_sub(payload: bytes | memoryview) -> DurableSub:
    d = json.loads(bytes(payload))
    return DurableSub(d["key"], d["topic"], d["client_id"], d["name"], d.get("selector"))


def encode_unsub(key: str) -> bytes:
    return key.encode()


def decode_unsub(payload: bytes | memoryview) -> str:
    return bytes(payload).decode()
