"""Spec of the index snapshot file and of the journal side of using one: an exact, checksummed
file anchored at one journal record; trusted only while that record is intact where it says;
start-up then reads only the journal after it."""

from __future__ import annotations

import shutil
from array import array
from pathlib import Path

import pytest

from sluicemq.storage import slotpack, snapshot
from sluicemq.storage.headerkey import HeaderKey, open_key
from sluicemq.storage.journal import Journal
from sluicemq.storage.records import DurableSub
from sluicemq.storage.segment import HEADER_SIZE, Location, segment_name
from sluicemq.storage.snapshot import IndexSnapshot, Position, SnapshotError

SEG = 4096


def sample(position: Position | None = None) -> IndexSnapshot:
    lane = snapshot.make_lane("q:orders", 4)
    for i in range(5):
        for col, v in zip(lane.columns(), (100 + i, 1, 40 * i, 20, 0, 7), strict=True):
            col.append(v)
    urgent = snapshot.make_lane("q:orders", 9)
    for col, v in zip(urgent.columns(), (99, 1, 400, 30, 12, 9), strict=True):
        col.append(v)
    sub = DurableSub("d:svc:books", "ledger", "svc", "books", "n > 2")
    return IndexSnapshot(
        position or Position((1, 400), 420, 17), 1234,
        [lane, urgent], [(sub, Location(1, 0, 40))],
        [{"key": "q:files", "stream": "s", "mid": 7, "priority": 4, "loc": [1, 300, 9],
          "inner": 0, "size": 3}],
        [{"id": "s", "next_seq": 2, "open": True, "pin": [1, 300, 9]}],
        {"stages": {"parked": [1, 2]}})


def journal_with(directory: Path, payloads: list[bytes]) -> tuple[Journal, list[Location]]:
    """A started journal holding ``payloads`` (closed by the caller)."""
    journal = Journal(directory, segment_bytes=SEG)
    list(journal.recover())
    journal.start(lambda seq: None, lambda a, b, e: None)
    locs = [journal.append(1, p).loc for p in payloads]
    return journal, [loc for loc in locs if loc is not None]


def position_of(journal: Journal) -> Position:
    mark = journal.mark()
    assert mark is not None
    seq, last, end = mark
    return Position(last, end, seq)


def key_of(directory: Path) -> HeaderKey:
    """The journal's checksum key, as the broker reads it before a recovery."""
    key = open_key(directory)
    assert key is not None
    return key


def payloads_after(directory: Path, position: Position) -> list[bytes]:
    journal = Journal(directory, segment_bytes=SEG)
    try:
        return [bytes(p) for _, p, _ in journal.recover(position.anchor)]
    finally:
        journal.close()


# -- the file ---------------------------------------------------------------------------------

def test_packed_runs_of_cursor_slots_come_back_packed_and_unpack_in_place() -> None:
    """A cursor's packed block is stored as it is, between the lane's column slots."""
    fields = slotpack.empty()
    for k in range(10):
        for col, v in zip(fields, (10 + k, 0, 2, 100 * k, 50, 0, 5), strict=True):
            col.append(v)
    lane = snapshot.make_lane("q:big", 4)
    for col, v in zip(lane.columns(), (1, 1, 0, 20, 0, 3), strict=True):
        col.append(v)
    lane.add_packed(slotpack.pack(fields), skip=3, count=3)
    for col, v in zip(lane.columns(), (20, 3, 8, 20, 0, 3), strict=True):
        col.append(v)
    assert len(lane) == 5
    snap = IndexSnapshot(Position((1, 0), 20, 1), 99, [lane])
    loaded = snapshot.decode(b"".join(snapshot.encode(snap))).lanes[0]
    assert len(loaded.packed) == 1 and len(loaded) == 5  # still packed, as written
    back = loaded.unpacked()
    assert not back.packed and len(back) == 5
    assert list(back.mid) == [1, 13, 14, 15, 20]
    assert list(back.seg) == [1, 2, 2, 2, 3]
    assert list(back.off) == [0, 300, 400, 500, 8]
    assert list(back.size) == [3, 5, 5, 5, 3]


def test_round_trip_keeps_every_field() -> None:
    snap = sample()
    back = snapshot.decode(b"".join(snapshot.encode(snap)))
    assert back == snap
    assert back.lanes[0].mid == array("Q", range(100, 105))
    assert back.messages == 7
    assert back.parts == {"stages": {"parked": [1, 2]}}


def test_any_flipped_byte_is_detected() -> None:
    data = bytearray(b"".join(snapshot.encode(sample())))
    for i in range(0, len(data), 7):
        data[i] ^= 0x20
        with pytest.raises(SnapshotError):
            snapshot.decode(bytes(data))
        data[i] ^= 0x20
    snapshot.decode(bytes(data))  # and the intact bytes still load


@pytest.mark.parametrize("cut", [1, 20, 100])
def test_truncated_file_is_refused(cut: int) -> None:
    data = b"".join(snapshot.encode(sample()))
    with pytest.raises(SnapshotError):
        snapshot.decode(data[:-cut])


def test_ragged_columns_are_refused_when_writing() -> None:
    snap = sample()
    snap.lanes[0].size.append(1)
    with pytest.raises(ValueError, match="ragged"):
        snapshot.encode(snap)


def test_load_keeps_the_file_and_remove_deletes_it(tmp_path: Path) -> None:
    snapshot.save(tmp_path, sample())
    assert [p.name for p in tmp_path.iterdir()] == [snapshot.FILE_NAME]  # no temp left over
    assert snapshot.load(tmp_path) == (sample(), None)
    assert snapshot.load(tmp_path) == (sample(), None), "a snapshot stays valid after use"
    snapshot.remove(tmp_path)
    assert snapshot.load(tmp_path) == (None, None)


def test_a_newer_save_replaces_the_older_one(tmp_path: Path) -> None:
    snapshot.save(tmp_path, sample())
    newer = sample(Position((2, 0), 60, 99))
    snapshot.save(tmp_path, newer)
    assert snapshot.load(tmp_path) == (newer, None)


def test_a_corrupt_file_says_why(tmp_path: Path) -> None:
    snapshot.save(tmp_path, sample())
    path = tmp_path / snapshot.FILE_NAME
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))
    assert snapshot.load(tmp_path) == (None, "checksum mismatch")


# -- the anchor -------------------------------------------------------------------------------

def test_the_last_record_anchors_the_snapshot(tmp_path: Path) -> None:
    journal, _ = journal_with(tmp_path, [b"x" * 1000] * 9)
    position = position_of(journal)
    journal.close()
    assert position.last[0] == 3 and position.seq == 9
    assert snapshot.check(tmp_path, position, key_of(tmp_path)) is None


def test_an_empty_journal_needs_no_anchor(tmp_path: Path) -> None:
    journal, _ = journal_with(tmp_path, [])
    position = position_of(journal)
    journal.close()
    assert position.last == (0, -1) and position.anchor is None
    assert snapshot.check(tmp_path, position, key_of(tmp_path)) is None


def test_records_appended_later_do_not_make_it_stale(tmp_path: Path) -> None:
    journal, _ = journal_with(tmp_path, [b"a" * 100])
    position = position_of(journal)
    for p in (b"b" * 3000, b"c" * 3000):  # the second one opens a new segment
        journal.append(1, p)
    journal.close()
    assert snapshot.check(tmp_path, position, key_of(tmp_path)) is None
    assert payloads_after(tmp_path, position) == [b"b" * 3000, b"c" * 3000]


def test_a_missing_or_damaged_anchor_makes_it_unusable(tmp_path: Path) -> None:
    journal, locs = journal_with(tmp_path, [b"a" * 100, b"b" * 100])
    position = position_of(journal)
    journal.close()
    seg = tmp_path / segment_name(locs[-1].segment)
    data = bytearray(seg.read_bytes())
    data[locs[-1].offset + HEADER_SIZE + 5] ^= 1
    seg.write_bytes(bytes(data))
    assert "damaged" in (snapshot.check(tmp_path, position, key_of(tmp_path)) or "")
    seg.unlink()
    gone = snapshot.check(tmp_path, position, key_of(tmp_path))
    assert gone == f"segment {locs[-1].segment} is gone"


def test_an_anchor_that_names_another_record_is_refused(tmp_path: Path) -> None:
    journal, locs = journal_with(tmp_path, [b"a" * 100, b"b" * 100])
    journal.close()
    first = locs[0]
    key = key_of(tmp_path)
    assert "no record" in (snapshot.check(tmp_path, Position((1, first.offset + 1), 0), key) or "")
    assert "ends elsewhere" in (snapshot.check(tmp_path, Position((1, first.offset), 999), key)
                                or "")


# -- the journal after the anchor -------------------------------------------------------------

def test_only_the_tail_is_read_and_appending_continues_after_it(tmp_path: Path) -> None:
    journal, _ = journal_with(tmp_path, [b"%d" % i * 500 for i in range(10)])
    position = position_of(journal)
    journal.append(1, b"tail" * 10)
    journal.close()
    again = Journal(tmp_path, segment_bytes=SEG)
    assert [bytes(p) for _, p, _ in again.recover(position.anchor)] == [b"tail" * 10]
    assert again.report is not None and again.report.records == 1
    again.start(lambda seq: None, lambda a, b, e: None)
    again.append(1, b"more")
    again.close()
    everything = Journal(tmp_path, segment_bytes=SEG)
    payloads = [bytes(p) for _, p, _ in everything.recover()]
    everything.close()
    assert payloads[-2:] == [b"tail" * 10, b"more"] and len(payloads) == 12


def test_a_torn_tail_after_the_anchor_is_cut(tmp_path: Path) -> None:
    journal, _ = journal_with(tmp_path, [b"a" * 100])
    position = position_of(journal)
    loc = journal.append(1, b"b" * 100).loc
    journal.close()
    assert loc is not None
    seg = tmp_path / segment_name(loc.segment)
    with seg.open("r+b") as fh:
        fh.truncate(loc.offset + 50)
    journal = Journal(tmp_path, segment_bytes=SEG)
    assert list(journal.recover(position.anchor)) == []
    assert journal.report is not None and journal.report.dropped
    journal.close()
    assert payloads_after(tmp_path, Position((0, -1), 0)) == [b"a" * 100]


def test_a_journal_can_be_scanned_again_after_a_tail_read(tmp_path: Path) -> None:
    """Start-up falls back to a full scan when a snapshot turns out unusable."""
    journal, _ = journal_with(tmp_path, [b"a", b"b", b"c"])
    position = position_of(journal)
    journal.append(1, b"d")
    journal.close()
    journal = Journal(tmp_path, segment_bytes=SEG)
    assert [bytes(p) for _, p, _ in journal.recover(position.anchor)] == [b"d"]
    assert [bytes(p) for _, p, _ in journal.recover()] == [b"a", b"b", b"c", b"d"]
    journal.close()


def test_segments_before_the_anchor_are_not_read(tmp_path: Path) -> None:
    journal, _ = journal_with(tmp_path, [b"x" * 3000] * 4)
    position = position_of(journal)
    journal.close()
    copy = tmp_path.parent / "copy"
    shutil.copytree(tmp_path, copy)
    (copy / segment_name(1)).write_bytes(b"garbage" * 100)  # a full scan would report it
    journal = Journal(copy, segment_bytes=SEG)
    assert list(journal.recover(position.anchor)) == []
    assert journal.report is not None and not journal.report.dropped
    assert journal.live_segments() == [1, 2, 3, 4]
    journal.close()


def test_mark_follows_appends_of_a_running_journal(tmp_path: Path) -> None:
    journal, locs = journal_with(tmp_path, [b"a" * 10, b"b" * 20])
    mark = journal.mark()
    assert mark == (2, (locs[1].segment, locs[1].offset), locs[1].offset + HEADER_SIZE + 20)
    journal.close()
