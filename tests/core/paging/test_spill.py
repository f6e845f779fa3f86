"""Spec of SpillFifo, the paged-out part of a cursor lane: whatever mix of appends, pops,
settles, cuts and relocations happens, it answers exactly like a plain list of slots, while
full blocks of slots are kept packed (a few bytes a slot)."""

from __future__ import annotations

import random
from array import array
from bisect import bisect_left
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicemq.core.paging import chain, spill
from sluicemq.core.paging.spill import JOURNAL, OBJ, TEMP, Slot, SpillFifo
from sluicemq.core.routing.message import Message
from sluicemq.storage import slotpack
from sluicemq.storage.segment import Location


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Blocks of 8 slots and 2 open at a time, so a few dozen slots cross many blocks."""
    monkeypatch.setattr(spill, "BLOCK", 8)
    monkeypatch.setattr(chain, "OPEN_BLOCKS", 2)
    yield


def check(fifo: SpillFifo, model: list[Slot]) -> None:
    assert len(fifo) == len(model)
    assert [fifo.slot(i) for i in fifo.indexes()] == model
    assert list(fifo.ids(fifo._start, fifo.end)) == [s[0] for s in model]
    spans = [(i, j) for i, j, _packed, _fields, _k in fifo.pieces()]
    covered = [x for i, j in spans for x in range(i, j)]
    assert covered == list(fifo.indexes())
    for lo, hi in fifo.runs():
        ids = fifo.ids(lo, hi)
        assert list(ids) == sorted(ids)
        for x in (ids[0], ids[-1], ids[len(ids) // 2], ids[0] - 1, ids[-1] + 1):
            assert fifo.bisect(x, lo, hi) == lo + bisect_left(ids, x)


def journal_slot(mid: int, seg: int = 1) -> Slot:
    return (mid, JOURNAL, seg, mid * 100, 90, 0, 64)


def test_a_million_slots_take_a_few_bytes_each(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spill, "BLOCK", 4096)
    monkeypatch.setattr(chain, "OPEN_BLOCKS", 4)
    fifo = SpillFifo()
    off = 0
    for mid in range(1_000_000):
        fifo.append(10**15 + mid, JOURNAL, 3 + mid // 60_000, off, 1100, 0, 1024)
        off = 0 if mid % 60_000 == 59_999 else off + 1100
    # 33 bytes a slot unpacked; packed, about 4 (plus a few open blocks)
    assert fifo.nbytes < 6 * 1_000_000
    assert fifo.slot(fifo._start + 654_321)[0] == 10**15 + 654_321
    assert fifo.bisect(10**15 + 777_777, fifo._start, fifo.end) == fifo._start + 777_777
    assert [fifo.popleft()[0] for _ in range(5)] == [10**15 + i for i in range(5)]


def test_fifo_order_across_blocks_and_trims() -> None:
    fifo, model = SpillFifo(), []
    for mid in range(1, 200):
        fifo.append(*journal_slot(mid))
        model.append(journal_slot(mid))
    for _ in range(150):
        assert fifo.popleft() == model.pop(0)
    check(fifo, model)
    for mid in range(200, 230):
        fifo.append(*journal_slot(mid))
        model.append(journal_slot(mid))
    check(fifo, model)
    while model:
        assert fifo.popleft() == model.pop(0)
    assert len(fifo) == 0 and not fifo._blocks


def test_objects_settle_in_place_even_in_a_packed_block() -> None:
    fifo, model = SpillFifo(), []
    msgs = [Message(mid, "/queue/q", {}, b"x", persistent=True) for mid in range(1, 40)]
    for m in msgs:
        fifo.append_obj(m)
        model.append((m.mid, OBJ, 0, 0, 0, 0, m.size))
    for k in (0, 3, 17, 38):  # early ones sit in blocks that were packed since
        i = fifo.index_of(msgs[k].mid)
        fifo.settle(i, JOURNAL, 7, k * 10, 55, 0)
        model[k] = (msgs[k].mid, JOURNAL, 7, k * 10, 55, 0, msgs[k].size)
    check(fifo, model)
    assert msgs[3].mid not in fifo.objs and msgs[4].mid in fifo.objs


def test_an_object_settles_by_its_position_and_only_while_it_is_an_object_there() -> None:
    fifo, model = SpillFifo(), []
    msgs = [Message(mid, "/queue/q", {}, b"x", persistent=True) for mid in range(1, 30)]
    where = {}
    for m in msgs:
        where[m.mid] = fifo.append_obj(m)
        model.append((m.mid, OBJ, 0, 0, 0, 0, m.size))
    for _ in range(5):  # the front leaves: the others keep their positions
        slot = fifo.popleft()
        fifo.objs.pop(slot[0])
        model.pop(0)
    assert not fifo.settle_obj(msgs[2].mid, where[msgs[2].mid], JOURNAL, 7, 0, 55, 0)  # gone
    for k in (5, 12, 28):
        mid = msgs[k].mid
        assert fifo.settle_obj(mid, where[mid], JOURNAL, 7, k * 10, 55, 0)
        model[k - 5] = (mid, JOURNAL, 7, k * 10, 55, 0, msgs[k].size)
    assert not fifo.settle_obj(msgs[12].mid, where[msgs[12].mid], JOURNAL, 9, 0, 1, 0)  # settled
    assert fifo.settle_obj(msgs[20].mid, where[msgs[5].mid], JOURNAL, 7, 1, 55, 0)  # wrong hint
    model[15] = (msgs[20].mid, JOURNAL, 7, 1, 55, 0, msgs[20].size)
    check(fifo, model)
    assert msgs[12].mid not in fifo.objs and msgs[13].mid in fifo.objs


def test_bulk_extend_matches_slot_by_slot_appends() -> None:
    fifo = SpillFifo()
    fifo.append(*journal_slot(1))
    mids = array("Q", range(2, 60))
    cols = [array("I", [2] * 58), array("Q", [m * 100 for m in mids]), array("I", [90] * 58),
            array("I", [0] * 58), array("I", [64] * 58)]
    fifo.extend(mids, *cols)
    fifo.append(*journal_slot(60))
    check(fifo, [journal_slot(1)] + [journal_slot(m, 2) for m in mids] + [journal_slot(60)])


def test_cuts_in_the_middle_and_at_the_front() -> None:
    fifo, model = SpillFifo(), []
    for mid in range(1, 100):
        fifo.append(*journal_slot(mid))
        model.append(journal_slot(mid))
    i = fifo.index_of(20)
    assert fifo.delete_range(i, i + 30) == model[19:49]
    del model[19:49]
    check(fifo, model)
    assert fifo.delete(fifo.index_of(70)) == journal_slot(70)
    model.remove(journal_slot(70))
    front = fifo._start
    assert fifo.delete_range(front, front + 10) == model[:10]
    del model[:10]
    check(fifo, model)


def test_relocate_and_journal_slots_find_packed_slots_by_segment() -> None:
    fifo, model = SpillFifo(), []
    for mid in range(1, 80):
        slot = journal_slot(mid, seg=1 + mid // 20)
        fifo.append(*slot)
        model.append(slot)
    in_seg_2 = [(s[0], s[2], s[3], s[4], s[5]) for s in model if s[2] == 2]
    assert list(fifo.journal_slots(2)) == in_seg_2
    moved = {(s[2], s[3], s[5]): Location(9, s[0], 77) for s in model if s[2] == 2}
    assert fifo.relocate(moved) == set(moved)
    model = [(s[0], JOURNAL, 9, s[0], 77, 0, s[6]) if s[2] == 2 else s for s in model]
    check(fifo, model)
    assert list(fifo.journal_slots(2)) == []


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "obj", "temp", "pop", "cut", "settle",
                                           "move", "bulk"]),
                          st.integers(0, 1000)), max_size=120))
def test_any_sequence_of_operations_matches_a_plain_list(ops: list[tuple[str, int]]) -> None:
    fifo, model = SpillFifo(), []
    mid = 0
    used: set[int] = set()  # message ids are unique, as in a queue
    rnd = random.Random(0)
    for op, x in ops:
        if op in ("add", "obj", "temp"):
            for _ in range(1 + x % 7):
                mid += 1 if x % 5 else -3  # now and then an id out of order (a new run)
                mid = max(mid, 1)
                while mid in used:
                    mid += 1
                used.add(mid)
                if op == "obj":
                    m = Message(mid + 10**6, "/queue/q", {}, b"x", persistent=True)
                    fifo.append_obj(m)
                    model.append((m.mid, OBJ, 0, 0, 0, 0, m.size))
                else:
                    s = (mid, JOURNAL if op == "add" else TEMP, x % 4, x, 10, x % 2, 5)
                    fifo.append(*s)
                    model.append(s)
        elif op == "bulk":
            n = x % 20
            mid = max([mid, *used]) if used else mid
            mids = array("Q", range(mid + 1, mid + 1 + n))
            used.update(mids)
            mid += n
            fifo.extend(mids, array("I", [3] * n), array("Q", mids), array("I", [7] * n),
                        array("I", [0] * n), array("I", [1] * n))
            model.extend((m, JOURNAL, 3, m, 7, 0, 1) for m in mids)
        elif op == "pop" and model:
            for _ in range(min(len(model), 1 + x % 12)):
                slot = fifo.popleft()
                assert slot == model.pop(0)
                fifo.objs.pop(slot[0], None)  # as the pager does when it takes an object
        elif op == "cut" and model:
            a = x % len(model)
            b = min(len(model), a + 1 + rnd.randrange(12))
            i = fifo._start + a
            taken = fifo.delete_range(i, i + b - a)
            assert taken == model[a:b]
            del model[a:b]
            for slot in taken:
                fifo.objs.pop(slot[0], None)
        elif op == "settle" and fifo.objs:
            m_id = sorted(fifo.objs)[x % len(fifo.objs)]
            assert fifo.settle_obj(m_id, x, JOURNAL, 2, x, 11, 0)  # x: mostly a wrong hint
            k = [s[0] for s in model].index(m_id)
            model[k] = (m_id, JOURNAL, 2, x, 11, 0, model[k][6])
        elif op == "move" and model:
            s = model[x % len(model)]
            if s[1] == JOURNAL:
                key = (s[2], s[3], s[5])
                found = fifo.relocate({key: Location(8, x, 12)})
                assert key in found
                model = [(t[0], JOURNAL, 8, x, 12, 0, t[6])
                         if t[1] == JOURNAL and (t[2], t[3], t[5]) == key else t for t in model]
        check(fifo, model)


def test_a_packed_block_from_a_snapshot_is_adopted_as_it_is() -> None:
    fields = slotpack.empty()
    for mid in range(10, 18):
        for col, v in zip(fields, journal_slot(mid, seg=4), strict=True):
            col.append(v)
    fifo = SpillFifo()
    fifo.append(*journal_slot(9))
    fifo.adopt_block(slotpack.pack(fields), fields)
    fifo.append(*journal_slot(18))
    assert fifo._blocks[1].fields is None  # kept packed
    check(fifo, [journal_slot(m, seg=4 if 10 <= m < 18 else 1) for m in range(9, 19)])
    assert [s[0] for s in fifo.journal_slots(4)] == list(range(10, 18))
