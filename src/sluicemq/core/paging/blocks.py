"""One block of consecutive paged-out slots (see ``spill.py``): open, sealed, or both.

A sealed block is its slot columns zlib-packed (``storage/slotpack.py``); it still answers
its first id and which journal segments it touches without unpacking, which is what range
reads and compaction ask of most blocks.
"""

from __future__ import annotations

from itertools import compress, count, islice
from operator import lt

from sluicemq.storage import slotpack
from sluicemq.storage.slotpack import SLOT_BYTES, Fields

JOURNAL, TEMP, OBJ = 0, 1, 2  # where a slot's message is: journal, temp store, or an object


class Block:
    """Consecutive slots: open (``fields``), sealed (``packed``), or both while a sealed block
    is being read (``packed`` still valid: dropping ``fields`` is free). ``packed is None``
    means the open fields changed since they were last packed."""

    __slots__ = ("fields", "first", "journal_only", "n", "packed", "segs")

    def __init__(self, fields: Fields) -> None:
        self.fields: Fields | None = fields
        self.packed: bytes | None = None
        self.n = len(fields[0])
        self.first = fields[0][0] if self.n else 0  # the id at offset 0
        self.segs = (0, -1)  # lowest and highest journal segment, known while sealed
        self.journal_only = False  # every slot a journal slot, known while sealed

    def open(self) -> Fields:
        if self.fields is None:
            assert self.packed is not None
            self.fields = slotpack.unpack(self.packed)
        return self.fields

    def seal(self) -> None:
        """Drop the open fields, packing them first if they changed."""
        fields = self.fields
        if fields is None:
            return
        if self.packed is None:
            self.learn(fields)
            self.packed = slotpack.pack(fields)
        self.fields = None

    def learn(self, fields: Fields, segs: tuple[int, int] | None = None) -> None:
        """Note the facts a sealed block answers without unpacking; ``segs``: the lowest and
        highest segment, when the caller already knows them."""
        self.n = len(fields[0])
        self.first = fields[0][0] if self.n else 0
        seg = fields[2]
        if not self.n:
            self.segs = (0, -1)
        else:
            self.segs = segs if segs is not None else (min(seg), max(seg))
        self.journal_only = fields[1].tobytes().count(JOURNAL) == self.n

    def changed(self) -> Fields:
        """The open fields, about to be modified: the packed copy is stale from now on."""
        fields = self.open()
        self.packed = None
        return fields

    def may_hold_segment(self, lo: int, hi: int) -> bool:
        """Could a journal slot here be in a segment within ``[lo, hi]``? (cheap skip)"""
        if self.fields is not None:
            return True
        return self.segs[0] <= hi and lo <= self.segs[1]

    @property
    def nbytes(self) -> int:
        packed = len(self.packed) if self.packed is not None else 0
        return packed + (self.n * SLOT_BYTES if self.fields is not None else 0)


class Sealed:
    """A whole packed block ready to be appended to a FIFO unopened, with what the FIFO notes
    about its ids (``SpillFifo.adopt_sealed``). Why: an index snapshot's start unpacks each
    block once, to count the segments it points into, and learns these facts in that pass;
    the cursor then takes the block without unpacking it a second time."""

    __slots__ = ("block", "descents", "last", "stored_bytes")

    def __init__(self, packed: bytes, fields: Fields, segs: tuple[int, int] | None = None
                 ) -> None:
        block = Block(fields)
        block.learn(fields, segs)
        block.packed, block.fields = packed, None
        self.block = block
        ids = fields[0]
        # offsets where an id is lower than the one before it: where new ascending runs start
        self.descents: list[int] = list(compress(count(1), map(lt, islice(ids, 1, None), ids)))
        self.last: int = ids[-1] if len(ids) else -1
        self.stored_bytes: int = sum(fields[6])
