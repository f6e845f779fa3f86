"""The packed form of a run of paged-out slots, shared by the cursor and the index snapshot.

Why here: a cursor keeps full blocks of slots zlib-packed in memory (``paging/spill.py``) and an
index snapshot stores those very bytes, not an unpacked copy, so a snapshot of ten million
paged-out messages neither doubles the broker's memory while it is taken nor has to be packed
again when it is loaded. Layout: the seven columns of a slot one after the other, native byte
order::

    message id (u64) | src (u8) | segment (u32) | offset (u64) | record length (u32)
    | inner offset (u32) | body size (u32)

Consecutive slots differ by little (ids one apart, the same segment, offsets one record apart,
equal sizes), so a block packs to 2-3 bytes a slot.
"""

from __future__ import annotations

import zlib
from array import array

FIELD_CODES = ("Q", "B", "I", "Q", "I", "I", "I")
SLOT_BYTES = sum(array(code).itemsize for code in FIELD_CODES)
# mid, src, seg, off, length, inner, size
Fields = tuple[array, array, array, array, array, array, array]


def empty() -> Fields:
    mid, src, seg, off, length, inner, size = (array(code) for code in FIELD_CODES)
    return mid, src, seg, off, length, inner, size


def pack(fields: Fields) -> bytes:
    return zlib.compress(b"".join(col.tobytes() for col in fields), 1)


def unpack(packed: bytes) -> Fields:
    """The columns back; raises ValueError for bytes that are not a packed run."""
    try:
        raw = zlib.decompress(packed)
    except zlib.error as exc:
        raise ValueError(f"not a packed run of slots: {exc}") from exc
    n, rest = divmod(len(raw), SLOT_BYTES)
    if rest:
        raise ValueError("a packed run of slots has a partial slot")
    fields = empty()
    view = memoryview(raw)  # each column straight from the unpacked bytes, no slice copies
    pos = 0
    for col in fields:
        end = pos + n * col.itemsize
        col.frombytes(view[pos:end])
        pos = end
    return fields
