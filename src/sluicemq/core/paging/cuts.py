"""Choosing id ranges in a cursor's lanes: what a ledger commit takes (``replay/commit.py``).

A lane's head is a deque of messages in dispatch order; its tail holds ascending runs of
slots, so a range is found by bisecting each run instead of scanning. These functions only
choose (and split what was cut by where it is stored); the cursor (``cursor.py``) takes it
out and keeps its counts.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

from sluicemq.core.paging.spill import JOURNAL, Slot, SpillFifo
from sluicemq.core.routing.message import Message
from sluicemq.storage import slotpack
from sluicemq.storage.slotpack import Fields


def head_cut(head: deque[Message], wanted: Callable[[int], bool], room: int
             ) -> tuple[list[Message], deque[Message]]:
    """Up to ``room`` messages of a lane's head whose id is ``wanted``, and the head without
    them (the same deque when none is)."""
    if not head or room <= 0 or not any(wanted(m.mid) for m in head):
        return [], head
    out: list[Message] = []
    keep: deque[Message] = deque()
    for m in head:
        if wanted(m.mid) and len(out) < room:
            out.append(m)
        else:
            keep.append(m)
    return out, keep


def tail_cuts(tail: SpillFifo, lo: int, hi: int, room: int,
              only: set[int] | None = None) -> Iterator[tuple[int, int]]:
    """``[start, end)`` spans of up to ``room`` slots of ``tail`` whose id is in ``[lo, hi)``
    (and in ``only``, if given), back to front: a caller that deletes each span before taking
    the next keeps the indexes of those still to come valid."""
    for i, j in reversed(tail.runs()):
        if room <= 0:
            return
        a = tail.bisect(lo, i, j)
        b = tail.bisect(hi, a, j)
        if a >= b:
            continue
        if only is None:
            cuts = [(a, min(b, a + room))]
        else:
            cuts = spans([k for k, mid in enumerate(tail.ids(a, b), a) if mid in only][:room])
        for x, y in reversed(cuts):
            room -= y - x
            yield x, y


def split_journal(cols: Fields) -> tuple[Fields, list[Slot]]:
    """Cut slots as (the columns of those that are journal records, the other slots): a cut
    of plain journal slots - a backlog's usual case - is passed on whole, no tuple per slot."""
    if cols[1].tobytes().count(JOURNAL) == len(cols[0]):
        return cols, []
    journal = slotpack.empty()
    others: list[Slot] = []
    for slot in zip(*cols, strict=True):
        if slot[1] == JOURNAL:
            for dst, v in zip(journal, slot, strict=True):
                dst.append(v)
        else:
            others.append(slot)
    return journal, others


def spans(indexes: list[int]) -> list[tuple[int, int]]:
    """Ascending indexes as ``[start, end)`` spans of consecutive ones."""
    out: list[tuple[int, int]] = []
    for k in indexes:
        if out and out[-1][1] == k:
            out[-1] = (out[-1][0], k + 1)
        else:
            out.append((k, k + 1))
    return out
