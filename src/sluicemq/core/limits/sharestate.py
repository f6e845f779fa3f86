"""The per-user share's senders in the index snapshot, so a restart does not read them back.

Why: the book (``heldbook.py``) lives in memory, and a restart had to read every stored
message's record head for its sender (``usershare.recount``): a 200k backlog's start took
0.06 -> 0.32 s, RSS 38.8 -> 83 MiB. The snapshot now carries who sent what, as of its position
- per block of 2^16 ids one owner, or for a block two users share the live ids and their
owners - and the recount takes the sender from it for every record at or before that position
(a record the book held then: ids are not reused while a record holds them), reading only the
records appended after it (the journal tail replay walks anyway) or not in it.
"""

from __future__ import annotations

import base64
from array import array
from bisect import bisect_left
from typing import Any

from sluicemq.core.limits.heldbook import HOLE, MASK, SHIFT, HeldBook


class ShareSeed:
    """Senders by message id as of a snapshot's position (``owner``)."""

    def __init__(self, at: tuple[int, int], owners: list[bytes],
                 blocks: dict[int, int | tuple[array, array]]) -> None:
        self.at = at  # (segment, offset) of the last record the snapshot covers
        self.owners = owners
        self.blocks = blocks

    def covered(self, segs: array, offs: array, lo: int, hi: int) -> int:
        """The index of the first of slots ``[lo, hi)`` (a lane's ``segs``/``offs`` columns)
        stored after ``at``, or ``hi``: from ``lo`` up to it the snapshot may name senders."""
        seg0, off0 = self.at
        if lo >= hi:
            return hi
        top = max(segs[lo:hi])
        if top < seg0 or (top == seg0 == min(segs[lo:hi]) and max(offs[lo:hi]) <= off0):
            return hi
        for x in range(lo, hi):  # (a block astride the snapshot's position: one a lane)
            seg = segs[x]
            if seg > seg0 or (seg == seg0 and offs[x] > off0):
                return x
        return hi

    def run_owner(self, mids: array) -> bytes | None:
        """The one sender of every id of ``mids`` - ascending, each stored at or before
        ``at`` (``covered``), as the caller checks - when the snapshot says so block by
        block; else None."""
        n = len(mids)
        found, i = -1, 0
        while i < n:
            key = mids[i] >> SHIFT
            b = self.blocks.get(key)
            if not isinstance(b, int) or (found >= 0 and b != found):
                return None
            found = b
            i = bisect_left(mids, (key + 1) << SHIFT, i, n)
        return self.owners[found] if found >= 0 else None

    def owner(self, mid: int, segment: int, offset: int) -> bytes | None:
        """The sender of ``mid`` stored at ``segment``/``offset``, or None: not known here
        (appended after the snapshot, or not in its book) - read the record."""
        if (segment, offset) > self.at:
            return None
        b = self.blocks.get(mid >> SHIFT)
        if b is None:
            return None
        if isinstance(b, int):
            return self.owners[b]
        offs, owners = b
        off = mid & MASK
        i = bisect_left(offs, off)
        return self.owners[owners[i]] if i < len(offs) and offs[i] == off else None


def dump(book: HeldBook, owners: list[bytes], at: tuple[int, int]) -> dict[str, Any]:
    """The snapshot section: ``at``, the owners (base64) and the blocks ([key, owner] or
    [key, -1, live offsets, their owners] as base64 arrays)."""
    blocks: list[list[Any]] = []
    for key, b in book.blocks.items():
        if b.owners is None:
            blocks.append([key, b.owner])
            continue
        live = [i for i, s in enumerate(b.sizes) if s != HOLE]
        offs = array("H", [b.offs[i] for i in live])
        nums = array("I", [b.owners[i] for i in live])
        blocks.append([key, -1, _b64(offs), _b64(nums)])
    return {"at": list(at), "owners": [base64.b64encode(o).decode() for o in owners],
            "blocks": blocks}


def load(data: dict[str, Any]) -> ShareSeed:
    blocks: dict[int, int | tuple[array, array]] = {}
    for key, owner, *mixed in data["blocks"]:
        if owner >= 0:
            blocks[key] = owner
        else:
            offs, nums = array("H"), array("I")
            offs.frombytes(base64.b64decode(mixed[0]))
            nums.frombytes(base64.b64decode(mixed[1]))
            blocks[key] = (offs, nums)
    seg, off = data["at"]
    return ShareSeed((seg, off), [base64.b64decode(o) for o in data["owners"]], blocks)


def _b64(a: array) -> str:
    return base64.b64encode(a.tobytes()).decode()
