"""Spec of the range cuts a ledger commit takes from a cursor lane (core/paging/cuts.py):
they pick exactly the ids a filter over the lane would, at most ``room`` of them, without
scanning a tail - and cutting what they name, back to front, leaves the rest in order."""

from __future__ import annotations

from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from sluicemq.core.paging import cuts
from sluicemq.core.paging.spill import JOURNAL, OBJ, TEMP, SpillFifo
from sluicemq.core.routing.message import Message


def tail_of(ids: list[int]) -> SpillFifo:
    fifo = SpillFifo()
    for mid in ids:
        fifo.append(mid, JOURNAL, 1, mid * 100, 90, 0, 64)
    return fifo


def test_a_head_cut_takes_wanted_messages_up_to_room_and_keeps_the_rest_in_order() -> None:
    head = deque(Message(mid, "/queue/q", {}, b"", persistent=True) for mid in (1, 5, 2, 6, 3))
    taken, kept = cuts.head_cut(head, lambda mid: mid < 5, room=2)
    assert [m.mid for m in taken] == [1, 2]
    assert [m.mid for m in kept] == [5, 6, 3]
    untouched, same = cuts.head_cut(head, lambda mid: mid > 10, room=9)
    assert untouched == [] and same is head


def ascending_runs(ids: list[int]) -> list[range]:
    """Index windows in which ids ascend (a lane's tail after redeliveries and refills)."""
    starts = [0] + [k for k in range(1, len(ids)) if ids[k] < ids[k - 1]]
    return [range(a, b) for a, b in zip(starts, [*starts[1:], len(ids)], strict=True)]


@settings(max_examples=300, deadline=None)
@given(ids=st.lists(st.integers(0, 80), unique=True, max_size=40),
       lo=st.integers(0, 80), width=st.integers(0, 80), room=st.integers(0, 30),
       only=st.none() | st.sets(st.integers(0, 80)))
def test_tail_cuts_take_what_a_filter_would_back_run_first(
        ids: list[int], lo: int, width: int, room: int, only: set[int] | None) -> None:
    tail = tail_of(ids)
    hi = lo + width
    taken: list[int] = []
    for x, y in cuts.tail_cuts(tail, lo, hi, room, only):
        taken += [slot[0] for slot in tail.delete_range(x, y)]
    expected: list[int] = []  # when room runs out, the back runs have gone first
    for run in reversed(ascending_runs(ids)) if ids else ():
        chosen = [ids[k] for k in run if lo <= ids[k] < hi and (only is None or ids[k] in only)]
        expected += chosen[:room - len(expected)]
    assert sorted(taken) == sorted(expected)
    left = [tail.slot(i)[0] for i in tail.indexes()]
    assert left == [mid for mid in ids if mid not in set(expected)]


def test_a_cut_of_journal_slots_passes_whole_and_others_come_as_slots() -> None:
    fifo = SpillFifo()
    for mid, src in ((1, JOURNAL), (2, TEMP), (3, JOURNAL), (4, OBJ)):
        fifo.append(mid, src, 1, mid * 100, 90, 0, 64)
    cols = fifo.discard_range(fifo.indexes().start, fifo.end)
    journal, others = cuts.split_journal(cols)
    assert list(journal[0]) == [1, 3] and [s[0] for s in others] == [2, 4]
    plain = tail_of([7, 8, 9])
    whole = plain.discard_range(plain.indexes().start, plain.end)
    assert cuts.split_journal(whole) == (whole, [])


def test_spans_join_consecutive_indexes() -> None:
    assert cuts.spans([]) == []
    assert cuts.spans([3, 4, 5, 9, 11, 12]) == [(3, 6), (9, 10), (11, 13)]
