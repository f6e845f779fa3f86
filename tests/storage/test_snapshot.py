"""Spec of the index snapshot: an exact, checksummed file that is trusted only while the journal
is exactly as it was when the snapshot was written, and read at most once."""

from __future__ import annotations

import os
from array import array
from pathlib import Path

import pytest

from sluicemq.errors import StorageError
from sluicemq.storage import snapshot
from sluicemq.storage.journal import Journal
from sluicemq.storage.records import DurableSub
from sluicemq.storage.segment import Location, segment_name
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
        position or Position([(1, SEG, 123)], 1, 420, (1, 400)), {1: 8}, 1234,
        [lane, urgent], [(sub, Location(1, 0, 40))],
        [{"key": "q:files", "stream": "s", "mid": 7, "priority": 4, "loc": [1, 300, 9],
          "inner": 0, "size": 3}],
        [{"id": "s", "next_seq": 2, "open": True, "pin": [1, 300, 9]}])


def closed_journal(directory: Path, payloads: list[bytes]) -> Position:
    """Append payloads, close, and describe the journal as a clean stop would."""
    journal = Journal(directory, segment_bytes=SEG)
    list(journal.recover())
    journal.start(lambda seq: None, lambda a, b, e: None)
    for p in payloads:
        journal.append(1, p)
    journal.close()
    shape = journal.position()
    assert shape is not None
    return snapshot.describe(directory, *shape)


# -- the file ---------------------------------------------------------------------------------

def test_round_trip_keeps_every_field() -> None:
    snap = sample()
    back = snapshot.decode(b"".join(snapshot.encode(snap)))
    assert back == snap
    assert back.lanes[0].mid == array("Q", range(100, 105))
    assert back.messages == 7


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


def test_take_reads_once_and_deletes(tmp_path: Path) -> None:
    snapshot.save(tmp_path, sample())
    assert [p.name for p in tmp_path.iterdir()] == [snapshot.FILE_NAME]  # no temp left over
    snap, why = snapshot.take(tmp_path)
    assert why is None and snap == sample()
    assert not (tmp_path / snapshot.FILE_NAME).exists()
    assert snapshot.take(tmp_path) == (None, None)


def test_take_deletes_a_corrupt_snapshot_and_says_why(tmp_path: Path) -> None:
    snapshot.save(tmp_path, sample())
    path = tmp_path / snapshot.FILE_NAME
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))
    snap, why = snapshot.take(tmp_path)
    assert snap is None and why == "checksum mismatch"
    assert not path.exists()


# -- matching the journal ---------------------------------------------------------------------

def test_a_cleanly_closed_journal_matches_its_position(tmp_path: Path) -> None:
    position = closed_journal(tmp_path, [b"x" * 1000] * 9)
    assert position.active == 3 and [s[0] for s in position.segments] == [1, 2, 3]
    assert snapshot.check(tmp_path, position) is None


def test_an_empty_journal_matches(tmp_path: Path) -> None:
    position = closed_journal(tmp_path, [])
    assert position.end == 0 and position.last == (0, -1)
    assert snapshot.check(tmp_path, position) is None


def test_resume_continues_appending_where_the_log_ends(tmp_path: Path) -> None:
    position = closed_journal(tmp_path, [b"a" * 100, b"b" * 100])
    journal = Journal(tmp_path, segment_bytes=SEG)
    journal.resume([s[0] for s in position.segments], position.active, position.end,
                   position.last)
    journal.start(lambda seq: None, lambda a, b, e: None)
    journal.append(1, b"c" * 100)
    journal.close()
    again = Journal(tmp_path, segment_bytes=SEG)
    assert [bytes(p)[:1] for _, p, _ in again.recover()] == [b"a", b"b", b"c"]
    again.close()


def test_records_appended_after_the_snapshot_make_it_stale(tmp_path: Path) -> None:
    position = closed_journal(tmp_path, [b"a" * 100])
    journal = Journal(tmp_path, segment_bytes=SEG)
    list(journal.recover())
    journal.start(lambda seq: None, lambda a, b, e: None)
    journal.append(1, b"b" * 100)
    journal.close()
    assert snapshot.check(tmp_path, position) is not None


def test_data_past_the_recorded_end_makes_it_stale(tmp_path: Path) -> None:
    position = closed_journal(tmp_path, [b"a" * 100])
    seg = tmp_path / segment_name(position.active)
    st = seg.stat()
    with seg.open("r+b") as fh:  # same size and mtime: only the end check can notice
        fh.seek(position.end)
        fh.write(b"\xffS")
    os.utime(seg, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert snapshot.check(tmp_path, position) == "data follows the recorded end"


def test_missing_extra_or_changed_segments_make_it_stale(tmp_path: Path) -> None:
    position = closed_journal(tmp_path, [b"x" * 1000] * 9)
    (tmp_path / segment_name(7)).write_bytes(bytes(SEG))
    assert "newer segments" in (snapshot.check(tmp_path, position) or "")
    (tmp_path / segment_name(7)).unlink()
    os.utime(tmp_path / segment_name(2), ns=(1, 1))
    assert snapshot.check(tmp_path, position) == "segment 2 changed since the snapshot"
    (tmp_path / segment_name(1)).unlink()
    assert "differ" in (snapshot.check(tmp_path, position) or "")


def test_a_zeroed_spare_segment_is_expected(tmp_path: Path) -> None:
    position = closed_journal(tmp_path, [b"x" * 100])
    spare = tmp_path / segment_name(position.active + 1)
    spare.write_bytes(bytes(SEG))
    assert snapshot.check(tmp_path, position) is None
    spare.write_bytes(b"\xffS" + bytes(SEG - 2))
    assert snapshot.check(tmp_path, position) == "the next segment has data"


def test_on_closed_runs_while_the_journal_is_still_locked(tmp_path: Path) -> None:
    journal = Journal(tmp_path, segment_bytes=SEG)
    list(journal.recover())
    journal.start(lambda seq: None, lambda a, b, e: None)
    seen: list[bool] = []

    def on_closed() -> None:
        with pytest.raises(StorageError, match="in use"):
            Journal(tmp_path)
        seen.append(journal.position() is not None)

    journal.close(on_closed)
    assert seen == [True]
    Journal(tmp_path).close()  # and unlocked afterwards
