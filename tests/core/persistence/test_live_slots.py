"""Spec of replay's compact message bookkeeping (persistence/live.py): messages found in journal
records, and a snapshot's lanes with what the journal tail did to them."""

from __future__ import annotations

import random
from array import array
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from sluicemq.core.persistence.capture import count_runs
from sluicemq.core.persistence.live import BaseLanes, LiveSlots
from sluicemq.storage import slotpack
from sluicemq.storage.snapshot import Lane, PackedRun, make_lane


def entry(mid: int, prio: int = 4, seg: int = 1) -> tuple[int, int, int, int, int, int]:
    return (seg, mid * 10, 9, 0, 3, prio)


def lane_of(mids: list[int], prio: int = 4) -> object:
    lane = make_lane("q:x", prio)
    for mid in mids:
        for col, v in zip(lane.columns(), (mid, 1, mid * 10, 9, 0, 3), strict=True):
            col.append(v)
    return lane


def test_live_slots_keep_journal_order_and_forget_acked_ids() -> None:
    live = LiveSlots()
    for mid in range(1, 8):
        live.add(mid, entry(mid))
    assert live.remove(3) and live.remove(6)
    assert not live.remove(3), "already gone"
    assert not live.has(3) and live.has(4)
    [(prio, cols)] = list(live.lanes())
    assert prio == 4 and cols[0] == array("Q", [1, 2, 4, 5, 7])
    assert cols[2] == array("Q", [10, 20, 40, 50, 70])
    assert len(live) == 5


def test_a_rewritten_id_keeps_only_its_newest_record() -> None:
    live = LiveSlots()
    for mid in (1, 2, 3):
        live.add(mid, entry(mid))
    live.add(2, entry(2, seg=7))  # compaction copied message 2 forward
    [(_prio, cols)] = list(live.lanes())
    assert cols[0] == array("Q", [1, 2, 3]) and cols[1] == array("I", [1, 7, 1])
    assert live.remove(2) and not live.has(2)


def test_priorities_come_out_as_separate_lanes_in_id_order() -> None:
    live = LiveSlots()
    for mid, prio in ((1, 4), (2, 9), (3, 4), (4, 9)):
        live.add(mid, entry(mid, prio))
    assert [(p, list(cols[0])) for p, cols in live.lanes()] == [(4, [1, 3]), (9, [2, 4])]


def test_a_fifo_drain_after_the_snapshot_cuts_the_front_of_its_lane() -> None:
    base = BaseLanes()
    base.lanes.append(lane_of(list(range(100, 200))))
    for mid in range(100, 130):
        base.remove(mid)
    assert base.settle() == {}
    assert list(base.lanes[0].mid) == list(range(130, 200))
    assert list(base.lanes[0].off) == [mid * 10 for mid in range(130, 200)]


def test_scattered_acks_are_removed_in_one_pass() -> None:
    base = BaseLanes()
    base.lanes.append(lane_of(list(range(1000))))
    odd = set(range(1, 1000, 2))  # 500 runs: the compress path
    for mid in odd:
        base.remove(mid)
    base.settle()
    assert list(base.lanes[0].mid) == list(range(0, 1000, 2))
    assert all(len(col) == 500 for col in base.lanes[0].columns())


def test_compaction_copies_move_entries_in_place_and_new_ids_are_handed_back() -> None:
    base = BaseLanes()
    base.lanes.append(lane_of([5, 3, 8]))  # dispatch order, not id order (3 was redelivered)
    base.moved[3] = (9, 4096, 77, 0, 3, 4)
    base.moved[42] = (9, 8192, 77, 0, 3, 4)  # never in the snapshot: a new message
    leftovers = base.settle()
    lane = base.lanes[0]
    assert list(lane.mid) == [5, 3, 8]
    assert (lane.seg[1], lane.off[1], lane.length[1]) == (9, 4096, 77)
    assert leftovers == {42: (9, 8192, 77, 0, 3, 4)}


def test_an_ack_after_a_move_removes_the_message() -> None:
    base = BaseLanes()
    base.lanes.append(lane_of([1, 2]))
    base.moved[2] = (9, 0, 77, 0, 3, 4)
    base.remove(2)
    assert base.settle() == {}
    assert list(base.lanes[0].mid) == [1]
    assert not base.has(2) and base.has(1)


def test_lanes_emptied_by_the_tail_disappear_and_held_chunks_follow_the_tail() -> None:
    base = BaseLanes()
    base.lanes.append(lane_of([1]))
    base.held = [{"mid": 7, "loc": [1, 70, 9], "inner": 0}, {"mid": 8, "loc": [1, 80, 9],
                                                               "inner": 0}]
    base.remove(1)
    base.remove(7)
    base.moved[8] = (3, 300, 9, 0, 3, 4)
    base.settle()
    assert base.lanes == []
    assert base.held == [{"mid": 8, "loc": [3, 300, 9], "inner": 0}]


def test_snapshot_self_check_counts_segment_runs_exactly() -> None:
    rng = random.Random(7)
    for trial in range(100):
        values = rng.choices(range(1, 6), k=rng.randint(0, 3000))
        seg = array("I", sorted(values) if trial % 2 else values)  # runs, or scattered
        counts: Counter[int] = Counter()
        count_runs(seg, counts)
        assert counts == Counter(seg)


def packed_block(mids: list[int]) -> bytes:
    """A cursor block of journal slots for ``mids``, packed as the cursor packs it."""
    fields = slotpack.empty()
    for mid in mids:
        for col, v in zip(fields, (mid, 0, 1, mid * 10, 9, 0, 3), strict=True):
            col.append(v)
    return slotpack.pack(fields)


def dispatch_order(lane: Lane) -> list[int]:
    out: list[int] = []
    for piece in lane.pieces():
        out.extend(piece.ids() if isinstance(piece, PackedRun) else piece[0])
    return out


def test_acks_in_columns_before_a_packed_run_keep_the_run_in_its_place() -> None:
    """The FIFO regression of a restart from a snapshot: the tail acked the in-memory head
    (columns) and the front block; the untouched packed block after them must still come
    before the open block that followed it, not after (its place is a column count)."""
    base = BaseLanes()
    lane = lane_of(list(range(0, 20)))  # the in-memory head
    lane.add_packed(packed_block(list(range(20, 30))), 0, 10)  # front block, acked below
    lane.add_packed(packed_block(list(range(30, 40))), 0, 10)  # untouched: stays packed
    for col, v in zip(lane.columns(), (40, 1, 400, 9, 0, 3), strict=True):  # open block
        col.append(v)
    base.lanes.append(lane)
    for mid in range(0, 25):
        base.remove(mid)
    base.settle()
    [after] = base.lanes
    assert [len(run) for run in after.packed] == [10], "the untouched block stays packed"
    assert dispatch_order(after) == list(range(25, 41))


@given(st.lists(st.tuples(st.booleans(), st.integers(1, 6)), min_size=1, max_size=12),
       st.sets(st.integers(0, 80)), st.sets(st.integers(0, 80)))
def test_settling_any_lane_keeps_dispatch_order(shape: list[tuple[bool, int]],
                                               acked: set[int], moved: set[int]) -> None:
    """Whatever mix of column stretches and packed runs a lane has, and whatever the tail
    acked or moved, the lane after settling is the lane before minus the acked ids, in order."""
    lane = make_lane("q:x", 4)
    mid = 0
    for is_packed, n in shape:
        mids = list(range(mid, mid + n))
        mid += n
        if is_packed:
            lane.add_packed(packed_block(mids), 0, n)
        else:
            for m in mids:
                for col, v in zip(lane.columns(), (m, 1, m * 10, 9, 0, 3), strict=True):
                    col.append(v)
    base = BaseLanes()
    base.lanes.append(lane)
    for m in acked:
        base.remove(m)
    for m in moved - acked:
        base.moved[m] = (9, m, 9, 0, 3, 4)
    leftovers = base.settle()
    assert set(leftovers) == {m for m in moved - acked if m >= mid}
    expect = [m for m in range(mid) if m not in acked]
    got = [m for lane in base.lanes for m in dispatch_order(lane)]
    assert got == expect
