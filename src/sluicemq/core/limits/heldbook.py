"""The per-user share's book of stored messages, by id, in a few bytes each.

Why not a dict of message id -> entry: ~150 bytes a stored message (a 200k backlog took +29
MiB of RSS), much of it kept by the allocator after a drain. Message ids are handed out in
order, so the messages stored at any time crowd into few ranges of ids: the book keeps one
block per 2^16 ids, each with sorted arrays - a 2-byte offset and a 4-byte size a message,
plus an owner number each only in a block two users share (else one for the block) - and the
few records held by several queues (a topic's, for each durable subscription) in a small dict
beside them. A released message leaves a hole (``HOLE``) until a block three quarters holes is
packed, and a block with no message left is dropped, so a drained
backlog gives its memory back. Lookups go to the block's oldest live entry first (a queue
releases in order) and bisect otherwise.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Iterator
from operator import lt

SHIFT = 16  # a block covers 2^16 message ids (offsets fit array("H"))
MASK = (1 << SHIFT) - 1
HOLE = 0xFFFFFFFF  # a released entry's size (a body is smaller: a record is < 4 GiB)
_PACK_AT = 256  # a block this long and three quarters holes is packed


class Block:
    """The stored messages of one range of 2^16 ids (see the module docstring)."""

    __slots__ = ("first", "holds", "live", "offs", "owner", "owners", "sizes")

    def __init__(self, owner: int) -> None:
        self.offs = array("H")  # sorted offsets in the range (mid & MASK)
        self.sizes = array("I")  # body size of each (HOLE: released)
        self.owner = owner  # the owner number of every entry, or -1: see owners
        self.owners: array | None = None  # owner number of each entry (two users or more)
        self.holds: dict[int, int] | None = None  # offset -> holders, for 2 or more
        self.live = 0
        self.first = 0  # no live entry before this index

    def find(self, off: int) -> int:
        """The index of live entry ``off``, or -1."""
        offs = self.offs
        i = self.first
        if i >= len(offs) or offs[i] != off:
            i = bisect_left(offs, off)
            if i == len(offs) or offs[i] != off:
                return -1
        return i if self.sizes[i] != HOLE else -1

    def owner_at(self, i: int) -> int:
        owners = self.owners
        return self.owner if owners is None else owners[i]

    def add(self, off: int, owner: int, size: int, holds: int) -> None:
        """A new live entry (``off`` not live in the block)."""
        offs, sizes = self.offs, self.sizes
        s1 = size
        if owner != self.owner and self.owners is None:
            self.owners = array("I", [self.owner]) * len(offs)
            self.owner = -1
        if not offs or off > offs[-1]:
            offs.append(off)
            sizes.append(s1)
            if self.owners is not None:
                self.owners.append(owner)
        else:
            i = bisect_left(offs, off)
            if i < len(offs) and offs[i] == off:  # a hole of the same id: filled again
                sizes[i] = s1
                if self.owners is not None:
                    self.owners[i] = owner
            else:
                offs.insert(i, off)
                sizes.insert(i, s1)
                if self.owners is not None:
                    self.owners.insert(i, owner)
            if i < self.first:
                self.first = i
        if holds > 1:
            if self.holds is None:
                self.holds = {}
            self.holds[off] = holds
        self.live += 1

    def drop(self, i: int) -> int:
        """Release live entry ``i`` (its last holder); returns its size."""
        size = self.sizes[i]
        self.sizes[i] = HOLE
        self.live -= 1
        if i == self.first:
            sizes, n = self.sizes, len(self.sizes)
            while i < n and sizes[i] == HOLE:
                i += 1
            self.first = i
        elif self.live * 4 < len(self.offs) and len(self.offs) >= _PACK_AT:
            self._pack()
        return size

    def _pack(self) -> None:
        """Leave out the holes (a block three quarters released, out of order)."""
        keep = [i for i, s in enumerate(self.sizes) if s != HOLE]
        self.offs = array("H", [self.offs[i] for i in keep])
        self.sizes = array("I", [self.sizes[i] for i in keep])
        if self.owners is not None:
            owners = self.owners
            self.owners = array("I", [owners[i] for i in keep])
        self.first = 0

    def live_owners(self) -> Iterator[int]:
        """The owner number of each live entry."""
        owners = self.owners
        for i, s in enumerate(self.sizes):
            if s != HOLE:
                yield self.owner if owners is None else owners[i]


class HeldBook:
    """Stored messages by id: owner number, body size and holders (see the module)."""

    __slots__ = ("blocks",)

    def __init__(self) -> None:
        self.blocks: dict[int, Block] = {}

    def add(self, mid: int, owner: int, size: int, holds: int) -> bool:
        """Charge ``mid``; a message already in the book only gains the holders (False)."""
        key, off = mid >> SHIFT, mid & MASK
        b = self.blocks.get(key)
        if b is None:
            b = self.blocks[key] = Block(owner)
        elif b.offs and off <= b.offs[-1]:  # (not past the newest: maybe in the book)
            i = b.find(off)
            if i >= 0:
                held = b.holds
                if held is None:
                    held = b.holds = {}
                held[off] = held.get(off, 1) + holds
                return False
        b.add(off, owner, size, holds)
        return True

    def add_run(self, owner: int, mids: array, sizes: array, *, ascending: bool = False
                ) -> bool:
        """``add`` of ascending ``mids`` (array "Q") of one owner, each held once, column-wise
        (start-up's recount of a paged-out lane): done only when no block they fall in has
        another owner or an id at or past theirs; False, nothing added, otherwise.
        ``ascending``: the caller checked the order (not walked again)."""
        n = len(mids)
        if not ascending and n > 1 and not all(map(lt, mids, mids[1:])):
            return False
        chunks: list[tuple[int, int, int]] = []
        i = 0
        while i < n:
            key = mids[i] >> SHIFT
            j = bisect_left(mids, (key + 1) << SHIFT, i, n)
            b = self.blocks.get(key)
            if b is not None and (b.owner != owner or (b.offs
                                                       and mids[i] & MASK <= b.offs[-1])):
                return False
            chunks.append((key, i, j))
            i = j
        raw = mids.tobytes()
        for key, i, j in chunks:
            b = self.blocks.get(key)
            if b is None:
                b = self.blocks[key] = Block(owner)
            low = bytearray(2 * (j - i))  # each id's two low bytes (little-endian u64s)
            low[0::2] = raw[8 * i:8 * j:8]
            low[1::2] = raw[8 * i + 1:8 * j:8]
            b.offs.frombytes(bytes(low))
            b.sizes.extend(sizes[i:j])
            b.live += j - i
        return True

    def remove(self, mid: int) -> tuple[int, int] | None:
        """One holder of ``mid`` let go: (owner number, size) when it was the last, else
        None (more holders, or not in the book)."""
        key = mid >> SHIFT
        b = self.blocks.get(key)
        if b is None:
            return None
        off = mid & MASK
        i = b.find(off)
        if i < 0:
            return None
        held = b.holds
        if held is not None:
            h = held.get(off)
            if h is not None:
                if h > 2:
                    held[off] = h - 1
                else:
                    del held[off]
                return None
        owner = b.owner_at(i)
        size = b.drop(i)
        if not b.live:
            del self.blocks[key]
        return owner, size

    def holders(self, mid: int) -> int:
        b = self.blocks.get(mid >> SHIFT)
        if b is None:
            return 0
        off = mid & MASK
        if b.find(off) < 0:
            return 0
        return b.holds.get(off, 1) if b.holds is not None else 1

    def owner(self, mid: int) -> int:
        """The owner number of ``mid``, or -1 when it is not in the book."""
        b = self.blocks.get(mid >> SHIFT)
        if b is None:
            return -1
        i = b.find(mid & MASK)
        return -1 if i < 0 else b.owner_at(i)

    def counts(self, owners: int) -> list[int]:
        """Messages by owner number (``owners`` of them)."""
        counts = [0] * owners
        for b in self.blocks.values():
            if b.owners is None:
                counts[b.owner] += b.live
            else:
                for n in b.live_owners():
                    counts[n] += 1
        return counts

    def nbytes(self) -> int:
        """The arrays' bytes (what a stored message costs, beside the blocks' own objects)."""
        return sum(b.offs.itemsize * len(b.offs) + b.sizes.itemsize * len(b.sizes)
                   + (0 if b.owners is None else 4 * len(b.owners))
                   for b in self.blocks.values())
