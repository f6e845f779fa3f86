"""The row of blocks under a spill FIFO (``spill.py``): which block holds an array index, and
which sealed blocks are kept open.

Why apart from the FIFO: this is the storage bookkeeping every FIFO operation stands on,
and it holds its own invariants, while the FIFO adds what the slots mean (ids, runs, objects):

- ``_starts[k]`` is the array index of block ``k``'s offset 0; blocks are consecutive, so
  ``_starts[k + 1] == _starts[k] + _blocks[k].n`` and an index is found by ``bisect``.
- The live slots are array indexes ``[_start, _end)``; a block wholly before ``_start`` is
  dropped as soon as the front passes it.
- At most ``OPEN_BLOCKS`` sealed blocks are held unpacked besides the last one (least recently
  used sealed first), so a consumer draining the front unpacks each block once and memory
  stays a few open blocks whatever the backlog.
"""

from __future__ import annotations

from bisect import bisect_right

from sluicemq.core.paging.blocks import Block
from sluicemq.storage.slotpack import Fields

__all__ = ["OPEN_BLOCKS", "BlockChain"]

OPEN_BLOCKS = 4  # sealed blocks kept unpacked besides the one being appended to


class BlockChain:
    """Consecutive blocks of slots addressed by array index, with the open-block cache."""

    __slots__ = ("_blocks", "_end", "_open", "_start", "_starts")

    def __init__(self) -> None:
        self._blocks: list[Block] = []
        self._starts: list[int] = []  # array index of each block's offset 0
        self._open: list[Block] = []  # opened sealed blocks, least recently used first
        self._start = 0  # array index of the front slot
        self._end = 0  # array index just past the back slot

    def __len__(self) -> int:
        return self._end - self._start

    @property
    def end(self) -> int:
        return self._end

    def indexes(self) -> range:
        return range(self._start, self._end)

    @property
    def nbytes(self) -> int:
        """Bytes the slots take (packed and open blocks)."""
        return sum(b.nbytes for b in self._blocks)

    def _locate(self, i: int) -> tuple[int, int]:
        """(block number, offset in it) of array index ``i``."""
        k = bisect_right(self._starts, i) - 1
        return k, i - self._starts[k]

    def _fields(self, k: int) -> Fields:
        """Block ``k`` open, remembered as recently used (the last block is always open)."""
        block = self._blocks[k]
        if k == len(self._blocks) - 1 and block.packed is None:
            return block.open()
        opened = self._open
        if opened and opened[-1] is block:
            return block.open()
        if block in opened:
            opened.remove(block)
        opened.append(block)
        fields = block.open()
        while len(opened) > OPEN_BLOCKS:
            opened.pop(0).seal()
        return fields

    def _remember(self, block: Block) -> None:
        """A block stops being the last one: it joins the opened ones and may get sealed."""
        if block.fields is None or block in self._open:
            return
        self._open.append(block)
        while len(self._open) > OPEN_BLOCKS:
            self._open.pop(0).seal()

    def _forget(self, block: Block) -> None:
        if block in self._open:
            self._open.remove(block)

    def _drop_front_blocks(self) -> None:
        """Forget blocks whose slots all lie before the front."""
        starts, blocks = self._starts, self._blocks
        k = 0
        while k < len(blocks) and starts[k] + blocks[k].n <= self._start:
            k += 1
        if k:
            for block in blocks[:k]:
                self._forget(block)
            del blocks[:k], starts[:k]

    def _renumber(self, k: int) -> None:
        """Drop empty blocks from ``k`` on and recount the starts after them."""
        blocks, starts = self._blocks, self._starts
        j = k
        pos = starts[k] if k < len(starts) else self._end
        while j < len(blocks):
            block = blocks[j]
            if block.n == 0:
                self._forget(block)
                del blocks[j], starts[j]
                continue
            starts[j] = pos
            pos += block.n
            j += 1

    def _clear_blocks(self) -> None:
        """Every slot gone: the front moves to the back."""
        self._blocks.clear()
        self._starts.clear()
        self._open.clear()
        self._start = self._end
