"""The paged-out part of a cursor lane: a FIFO of compact slots saying where messages are stored.

Why this shape: a backlog of ten million messages must cost a few bytes each, not a Python
object each (nor the 33 bytes of plain parallel arrays). A slot is seven fields: the message
id, where its record is (``src``: the journal, the temp store, or still an object),
segment/file, offset, record length, the offset of the message inside the record (non-zero for
transaction records) and its body size.

Slots live in *blocks* of up to ``BLOCK`` consecutive ones. A full block is sealed: its columns
are joined and zlib-packed (``storage/slotpack.py``), 2-3 bytes a slot. A few blocks are kept
open (unpacked) at a time: the one being appended to, and the last ones read or changed, so a
consumer draining the front unpacks each block once (``chain.py`` keeps that row of blocks).
Packed bytes are never modified (a change unpacks the block and packs it anew later), so an
index snapshot can keep references to them instead of copying the backlog.

Callers address slots by *array index* (valid until the FIFO changes) or by *absolute position*
(``base`` + index, stable until the slot is removed). Range reads find messages by id: each
block remembers its first id, so a binary search over an ascending run unpacks one block.

A message whose record is not yet durable (or that cannot be paged: redelivered, or stored in
a record whose layout we do not know) waits in the FIFO as an object (``src == OBJ``, the
``Message`` in ``objs``) and is turned into a compact slot by ``settle`` once the journal
reports it durable: a failed batch rewinds the journal, so an undurable location may later
hold another record.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from itertools import compress, count, islice
from operator import lt
from typing import TYPE_CHECKING

from sluicemq.core.paging.blocks import JOURNAL, OBJ, TEMP, Block, Sealed
from sluicemq.core.paging.chain import BlockChain
from sluicemq.storage import slotpack
from sluicemq.storage.slotpack import Fields

if TYPE_CHECKING:
    from sluicemq.core.routing.message import Message
    from sluicemq.storage.segment import Location

__all__ = ["BLOCK", "JOURNAL", "OBJ", "TEMP", "Slot", "SpillFifo"]

Slot = tuple[int, int, int, int, int, int, int]  # mid, src, seg, off, length, inner, size
BLOCK = 4096  # slots per block: ~130 KiB open, ~10 KiB packed
MAX_RUNS = 64  # beyond this many sorted runs, forget them and rescan when next asked


class SpillFifo(BlockChain):
    """FIFO of paged-out messages in packed blocks; pops from the front in O(1) amortised.

    Ids usually ascend front to back (they are handed out in enqueue order); late arrivals such
    as held stream chunks or restored unacknowledged messages start new ascending *runs*. The
    FIFO knows where its runs start, and each run is binary-searchable (``bisect``).
    """

    __slots__ = ("_last", "_runs", "base", "objs")

    def __init__(self) -> None:
        super().__init__()
        self.objs: dict[int, Message] = {}  # OBJ slots, by message id
        self._last = -1  # id of the back slot
        self.base = 0  # slots ever popped from the front: absolute position = base + index
        self._runs: list[int] | None = []  # absolute positions where ascending runs start

    # -- the back: its block and its runs -----------------------------------------------------
    def _tail_fields(self) -> Fields:
        """The block appends go to: a new one when the last is full or sealed."""
        blocks = self._blocks
        if blocks:
            last = blocks[-1]
            if last.n < BLOCK and last.packed is None and last.fields is not None:
                return last.fields
            self._remember(last)
        fields = slotpack.empty()
        blocks.append(Block(fields))
        self._starts.append(self._end)
        return fields

    def _note_ids(self, ids: array, at: int) -> None:
        """Ids were appended at absolute position ``at``: note where ascending runs start."""
        if ids and self._runs is not None:
            self._note_runs(ids[0], len(ids), at,
                            compress(count(at + 1), map(lt, islice(ids, 1, None), ids)))

    def _note_runs(self, first: int, n: int, at: int, breaks: Iterable[int]) -> None:
        """``n`` ids from ``first`` were appended at ``at``; ``breaks``: the absolute positions
        among them where an id is lower than the one before."""
        runs = self._runs
        if runs is None:
            return
        if self._end - n == self._start:  # they are the whole FIFO
            runs[:] = [at]
        elif first < self._last:
            runs.append(at)
        runs.extend(breaks)
        if len(runs) > MAX_RUNS:
            self._runs = None

    # -- appending ---------------------------------------------------------------------------
    def append(self, mid: int, src: int, seg: int, off: int, length: int, inner: int,
               size: int) -> int:
        """Add a slot at the back; returns its absolute position (stable until removed)."""
        pos = self.base + self._end - self._start
        runs = self._runs
        if self._end == self._start:
            self._runs = [pos]
        elif runs is not None and mid < self._last:
            runs.append(pos)
            if len(runs) > MAX_RUNS:
                self._runs = None
        c_mid, c_src, c_seg, c_off, c_length, c_inner, c_size = self._tail_fields()
        c_mid.append(mid)  # column by column, unrolled: every paged-out message passes here
        c_src.append(src)
        c_seg.append(seg)
        c_off.append(off)
        c_length.append(length)
        c_inner.append(inner)
        c_size.append(size)
        block = self._blocks[-1]
        if block.n == 0:
            block.first = mid
        block.n += 1
        self._end += 1
        self._last = mid
        return pos

    def append_run(self, mid: array, seg: array, off: array, length: array, inner: array,
                   size: array) -> None:
        """``append`` of many journal slots (a staged publication): column-wise, into the
        tail block and then new ones, which fill and pack as one-by-one appends would."""
        n = len(mid)
        if not n:
            return
        at = self.base + self._end - self._start
        a = 0
        while a < n:
            fields = self._tail_fields()
            block = self._blocks[-1]
            b = min(n, a + BLOCK - len(fields[0]))
            if block.n == 0:
                block.first = mid[a]
            for col, values in zip(fields, (mid[a:b], array("B", [JOURNAL]) * (b - a), seg[a:b],
                                            off[a:b], length[a:b], inner[a:b], size[a:b]),
                                   strict=True):
                col.extend(values)
            block.n += b - a
            self._end += b - a
            a = b
        self._note_ids(mid, at)
        self._last = mid[-1]

    def extend(self, mid: array, seg: array, off: array, length: array, inner: array,
               size: array) -> None:
        """Append journal slots in bulk (index snapshot), packing full blocks as they come."""
        n = len(mid)
        if not n:
            return
        at = self.base + self._end - self._start
        for a in range(0, n, BLOCK):
            b = min(n, a + BLOCK)
            if self._blocks:
                self._remember(self._blocks[-1])
            block = Block((mid[a:b], array("B", bytes(b - a)), seg[a:b], off[a:b],
                            length[a:b], inner[a:b], size[a:b]))
            self._blocks.append(block)
            self._starts.append(self._end + a)
            if b - a == BLOCK:
                block.seal()
        self._end += n
        self._note_ids(mid, at)
        self._last = mid[-1]

    def adopt_block(self, packed: bytes, fields: Fields) -> None:
        """Append a whole packed block of journal slots as it is (index snapshot): ``fields``
        are its unpacked columns, read for the block's facts and then dropped."""
        self.adopt_sealed(Sealed(packed, fields))

    def adopt_sealed(self, sealed: Sealed) -> None:
        """``adopt_block`` with the facts learnt already (``blocks.Sealed``): no unpacking."""
        if self._blocks:
            self._remember(self._blocks[-1])
        block = sealed.block
        if not block.n:
            return
        at = self.base + self._end - self._start
        self._blocks.append(block)
        self._starts.append(self._end)
        self._end += block.n
        self._note_runs(block.first, block.n, at, [at + d for d in sealed.descents])
        self._last = sealed.last

    def append_obj(self, msg: Message) -> int:
        self.objs[msg.mid] = msg
        return self.append(msg.mid, OBJ, 0, 0, 0, 0, msg.size)

    # -- reading -----------------------------------------------------------------------------
    def slot(self, i: int) -> Slot:
        """The slot at array index ``i`` (not absolute position)."""
        k, j = self._locate(i)
        mid, src, seg, off, length, inner, size = self._fields(k)
        return (mid[j], src[j], seg[j], off[j], length[j], inner[j], size[j])

    def id_at(self, i: int) -> int:
        k, j = self._locate(i)
        return self._fields(k)[0][j]

    def src_at(self, i: int) -> int:
        k, j = self._locate(i)
        return self._fields(k)[1][j]

    def ids(self, i: int, j: int) -> array:
        """The ids at array indexes ``[i, j)``."""
        out = array("Q")
        while i < j:
            k, off = self._locate(i)
            take = min(j - i, self._blocks[k].n - off)
            out.extend(self._fields(k)[0][off:off + take])
            i += take
        return out

    def columns(self, i: int, j: int) -> Fields:
        """The seven slot columns at array indexes ``[i, j)``, as copies (C-speed slices)."""
        out = slotpack.empty()
        while i < j:
            k, off = self._locate(i)
            take = min(j - i, self._blocks[k].n - off)
            for dst, col in zip(out, self._fields(k), strict=True):
                dst.extend(col[off:off + take])
            i += take
        return out

    def bisect(self, x: int, lo: int, hi: int) -> int:
        """``bisect_left`` for id ``x`` over array indexes ``[lo, hi)`` of one ascending run:
        blocks are chosen by their first id, so one block is unpacked."""
        if lo >= hi:
            return lo
        k_lo, _ = self._locate(lo)
        k_hi, _ = self._locate(hi - 1)
        blocks = self._blocks
        a, b = k_lo + 1, k_hi + 1  # blocks after k_lo start inside the run: firsts ascend
        while a < b:
            m = (a + b) // 2
            if blocks[m].first < x:
                a = m + 1
            else:
                b = m
        k = a - 1
        first = self._starts[k]
        ids = self._fields(k)[0]
        j = bisect_left(ids, x, max(lo, first) - first, min(hi, first + blocks[k].n) - first)
        return first + j

    def index_of(self, mid: int, position: int | None = None) -> int:
        """Array index of the slot for ``mid`` (hint: its absolute position), or -1. Ids are
        message ids, unique in a FIFO: the slot found is the only one."""
        if position is not None:
            i = position - self.base + self._start
            if self._start <= i < self._end and self.id_at(i) == mid:
                return i
        if self._start < self._end:  # ids mostly ascend (a FIFO): one block is looked at
            i = self.bisect(mid, self._start, self._end)
            if i < self._end and self.id_at(i) == mid:
                return i
        for k, first in enumerate(list(self._starts)):
            ids = self._fields(k)[0]
            try:
                return first + ids.index(mid, max(0, self._start - first))
            except ValueError:
                continue
        return -1

    def runs(self) -> list[tuple[int, int]]:
        """``[lo, hi)`` array-index windows in which ids ascend, front to back."""
        start, end = self._start, self._end
        if start == end:
            return []
        if not self._runs:  # unknown (cut in the middle, or more runs than worth tracking)
            self._runs = []
            prev = None
            for i, j, _packed, fields, k in self._spans(unpack=True):
                assert fields is not None
                ids = fields[0][k:k + j - i]
                at = self.base + i - start
                if prev is None or ids[0] < prev:
                    self._runs.append(at)
                self._runs.extend(compress(count(at + 1), map(lt, islice(ids, 1, None), ids)))
                prev = ids[-1]
        runs = self._runs
        front = self.base
        while len(runs) > 1 and runs[1] <= front:
            del runs[0]
        out = []
        for k, pos in enumerate(runs):
            lo = max(pos, front) - front + start
            hi = runs[k + 1] - front + start if k + 1 < len(runs) else end
            if lo < hi:
                out.append((lo, hi))
        return out

    def _spans(self, *, unpack: bool
               ) -> Iterator[tuple[int, int, bytes | None, Fields | None, int]]:
        start, end = self._start, self._end
        for n, (block, first) in enumerate(zip(list(self._blocks), list(self._starts),
                                               strict=True)):
            i, j = max(first, start), min(first + block.n, end)
            if i >= j:
                continue
            if not unpack and block.packed is not None and block.journal_only:
                yield i, j, block.packed, None, i - first
            else:
                yield i, j, None, self._fields(n), i - first

    def pieces(self) -> Iterator[tuple[int, int, bytes | None, Fields | None, int]]:
        """``(i, j, packed, fields, k)`` for each block's live slots: array indexes ``[i, j)``
        are offsets ``[k, k + j - i)`` of the block. ``packed`` (a block of journal slots only,
        immutable bytes that may be kept) or else ``fields`` (open for one step) is given."""
        return self._spans(unpack=False)

    def journal_slots(self, segment: int) -> Iterator[tuple[int, int, int, int, int]]:
        """(mid, seg, off, length, inner) of live journal slots stored in ``segment``."""
        import numpy as np  # here, not at import: ~15 MiB of RSS a broker may not need

        out: list[tuple[int, int, int, int, int]] = []
        for n, (block, first) in enumerate(zip(self._blocks, self._starts, strict=True)):
            if not block.may_hold_segment(segment, segment):
                continue
            mid, src, seg, off, length, inner, _size = self._fields(n)
            lo = max(0, self._start - first)
            # compared in C: compaction asks this of every queue for each segment it copies
            segs = np.frombuffer(seg, dtype=np.uint32)[lo:block.n]
            srcs = np.frombuffer(src, dtype=np.uint8)[lo:block.n]
            hits = (np.flatnonzero((segs == segment) & (srcs == JOURNAL)) + lo).tolist()
            del segs, srcs  # release the arrays' buffers: they may grow later
            out.extend((mid[j], segment, off[j], length[j], inner[j]) for j in hits)
        yield from out

    # -- taking out --------------------------------------------------------------------------
    def popleft(self) -> Slot:
        i = self._start
        s = self.slot(i)
        self._start = i + 1
        self.base += 1
        if self._start >= self._starts[0] + self._blocks[0].n:
            self._drop_front_blocks()
        return s

    def settle(self, i: int, src: int, seg: int, off: int, length: int, inner: int) -> None:
        """An OBJ slot becomes a compact one in place."""
        k, j = self._locate(i)
        self._fields(k)
        self._settle_at(k, j, src, seg, off, length, inner)

    def settle_obj(self, mid: int, position: int, src: int, seg: int, off: int, length: int,
                   inner: int) -> bool:
        """``settle`` of the OBJ slot of ``mid`` (hint: its absolute ``position``), found with
        one look at its block, as each persistent message paged out before its sync is; False
        when no OBJ slot of ``mid`` is left (it was taken, or settled already)."""
        i = position - self.base + self._start
        k = j = -1
        if self._start <= i < self._end:
            k, j = self._locate(i)
            if self._fields(k)[0][j] != mid:
                k = -1
        if k < 0:
            i = self.index_of(mid)
            if i < 0:
                return False
            k, j = self._locate(i)
        if self._fields(k)[1][j] != OBJ:
            return False
        self._settle_at(k, j, src, seg, off, length, inner)
        return True

    def settle_run(self, position: int, msgs: list[Message], segs: list[int],
                   offs: list[int], lengths: list[int]) -> bool:
        """``settle_obj`` of consecutive OBJ slots from absolute ``position`` on, as journal
        slots (``msgs[n]`` at ``segs[n]``, ``offs[n]``, ``lengths[n]``, ``msgs[n].inner``):
        a slice a column a block instead of five stores and a lookup a slot. Why: a
        backlog's group commit settles the whole batch it paged out, in the order it was
        paged out (8 x 8: ~64 a commit). False, with nothing changed, unless every one is
        still an object there; the caller then settles them one by one."""
        n = len(msgs)
        i = position - self.base + self._start
        if n == 0 or i < self._start or i + n > self._end:
            return False
        objs = self.objs
        for msg in msgs:
            if objs.get(msg.mid) is not msg:
                return False
        mids = array("Q", [msg.mid for msg in msgs])
        pieces: list[tuple[int, int, int, int]] = []  # (block, offset in it, from, count)
        at = 0
        while at < n:
            k, j = self._locate(i + at)
            fields = self._fields(k)
            take = min(n - at, self._blocks[k].n - j)
            if (fields[0][j:j + take] != mids[at:at + take]
                    or fields[1][j:j + take].count(OBJ) != take):
                return False
            pieces.append((k, j, at, take))
            at += take
        journal = array("B", [JOURNAL])
        for k, j, at, take in pieces:
            _mid, c_src, c_seg, c_off, c_length, c_inner, _size = self._blocks[k].changed()
            end = at + take
            c_src[j:j + take] = journal * take
            c_seg[j:j + take] = array("I", segs[at:end])
            c_off[j:j + take] = array("Q", offs[at:end])
            c_length[j:j + take] = array("I", lengths[at:end])
            c_inner[j:j + take] = array("I", [msg.inner for msg in msgs[at:end]])
        for msg in msgs:
            del objs[msg.mid]
        return True

    def _settle_at(self, k: int, j: int, src: int, seg: int, off: int, length: int,
                   inner: int) -> None:
        """Slot ``j`` of block ``k`` (its columns unpacked) becomes compact: its packed copy is
        stale from now on."""
        c_mid, c_src, c_seg, c_off, c_length, c_inner, _size = self._blocks[k].changed()
        self.objs.pop(c_mid[j], None)
        c_src[j] = src  # unrolled: each persistent message paged out before its sync settles
        c_seg[j] = seg
        c_off[j] = off
        c_length[j] = length
        c_inner[j] = inner

    def delete(self, i: int) -> Slot:
        """Remove the slot at array index ``i`` (admin removals)."""
        return self.delete_range(i, i + 1)[0]

    def delete_range(self, i: int, j: int) -> list[Slot]:
        """Remove the slots at array indexes ``[i, j)``; from the front this is a cheap pop."""
        return list(zip(*self.discard_range(i, j), strict=True))

    def discard_range(self, i: int, j: int) -> Fields:
        """``delete_range`` returning the removed slots as columns (no tuple per slot)."""
        out = self.columns(i, j)
        if i == self._start:
            self._start = j
            self.base += j - i
            self._drop_front_blocks()
            return out
        k0, _ = self._locate(i)
        k = k0
        while k < len(self._blocks) and self._starts[k] < j:
            first = self._starts[k]
            block = self._blocks[k]
            a, b = max(i, first) - first, min(j, first + block.n) - first
            if a < b:
                self._fields(k)
                fields = block.changed()
                for col in fields:
                    del col[a:b]
                block.n -= b - a
                block.first = fields[0][0] if block.n else 0
            k += 1
        removed = j - i
        last_gone = j == self._end
        self._end -= removed
        self._renumber(k0)
        if last_gone and self._end > self._start:
            self._last = self.id_at(self._end - 1)
        self._runs = None
        return out

    def relocate(self, moved: dict[tuple[int, int, int], Location]) -> set[tuple[int, int, int]]:
        """Journal slots whose (seg, off, inner) is in ``moved`` now point at the new location:
        compaction rewrote the message as a plain record there. Returns the keys found."""
        found: set[tuple[int, int, int]] = set()
        segs = {key[0] for key in moved}
        if not segs:
            return found
        lo, hi = min(segs), max(segs)
        for n, (block, first) in enumerate(zip(self._blocks, self._starts, strict=True)):
            if not block.may_hold_segment(lo, hi):
                continue
            _mid, src, seg, off, length, inner, _size = self._fields(n)
            for j in range(max(0, self._start - first), block.n):
                if src[j] == JOURNAL and seg[j] in segs:
                    key = (seg[j], off[j], inner[j])
                    new = moved.get(key)
                    if new is not None:
                        _mid, src, seg, off, length, inner, _size = block.changed()
                        seg[j], off[j], length[j] = new.segment, new.offset, new.length
                        inner[j] = 0
                        found.add(key)
        return found

    def clear(self) -> None:
        self.objs.clear()
        self.base += self._end - self._start
        self._clear_blocks()
        self._runs = []

