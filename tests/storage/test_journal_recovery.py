"""Spec of recovery: keep every intact record, report and skip damage, cut only the torn tail."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluicemq.storage.journal import Journal, Location
from sluicemq.storage.segment import HEADER_SIZE, segment_name


def write_journal(directory: Path, data: list[bytes], **kwargs: Any) -> list[Location]:
    """A closed journal holding `data` as rtype-1 records; returns their locations."""
    kwargs.setdefault("segment_bytes", 4096)
    journal = Journal(directory, **kwargs)
    list(journal.recover())
    journal.start(lambda seq: None, lambda a, b, e: None)
    locs = [journal.append(1, p).loc for p in data]
    journal.close()
    return [loc for loc in locs if loc is not None]


def recover(directory: Path, **kwargs: Any) -> tuple[list[tuple[bytes, Location]], Journal]:
    kwargs.setdefault("segment_bytes", 4096)
    journal = Journal(directory, **kwargs)
    records = [(bytes(p), loc) for _, p, loc in journal.recover()]
    return records, journal


def recover_and_close(directory: Path, **kwargs: Any):
    records, journal = recover(directory, **kwargs)
    journal.close()
    assert journal.report is not None
    return records, journal.report


def numbered(n: int, size: int = 40) -> list[bytes]:
    return [(b"record %05d " % i).ljust(size, b".") for i in range(n)]


def patch(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(data)


def flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)[0]
        fh.seek(offset)
        fh.write(bytes([byte ^ 0x10]))


# ---------------------------------------------------------------- torn tails


def test_a_tail_torn_at_any_byte_of_the_last_record_loses_only_that_record(
    tmp_path: Path,
) -> None:
    data = numbered(30)
    pristine = tmp_path / "pristine"
    locs = write_journal(pristine, data, preallocate=False)
    last = locs[-1]
    seg_path = segment_name(last.segment)
    original = (pristine / seg_path).read_bytes()
    for cut in range(last.offset, last.offset + HEADER_SIZE + last.length):
        for zero_fill in (False, True):  # truncated file, or preallocated zeros after the cut
            work = tmp_path / f"cut{cut}{zero_fill}"
            shutil.copytree(pristine, work)
            with open(work / seg_path, "r+b") as fh:
                fh.truncate(cut)
                if zero_fill:
                    fh.truncate(4096)
            records, report = recover_and_close(work)
            assert records == list(zip(data[:-1], locs[:-1], strict=True)), cut
            if cut > last.offset:  # the report spans the torn bytes up to their last non-zero
                torn = len(original[last.offset : cut].rstrip(b"\0"))
                assert report.dropped == [
                    (last.segment, last.offset, torn, report.dropped[0][3])
                ]
                assert report.dropped[0][3].startswith("torn tail")
            else:
                assert report.dropped == []
            shutil.rmtree(work)


def test_the_torn_tail_is_zeroed_so_new_records_are_never_followed_by_stale_ones(
    tmp_path: Path,
) -> None:
    data = numbered(10)
    locs = write_journal(tmp_path, data)
    last = locs[-1]
    path = tmp_path / segment_name(last.segment)
    with open(path, "r+b") as fh:  # tear the middle of the last record
        fh.seek(last.offset + HEADER_SIZE + 5)
        fh.write(bytes(last.length))
    records, journal = recover(tmp_path)
    assert len(records) == 9
    with open(path, "rb") as fh:
        tail = os.pread(fh.fileno(), 4096, last.offset)
    assert tail == bytes(len(tail))
    journal.start(lambda seq: None, lambda a, b, e: None)
    journal.append(1, b"short")  # lands where the torn record began, and is shorter
    journal.close()
    records, report = recover_and_close(tmp_path)
    assert [p for p, _ in records] == [*data[:9], b"short"]
    assert report.dropped == []


def test_segments_after_the_last_intact_record_are_removed(tmp_path: Path) -> None:
    data = numbered(10)
    write_journal(tmp_path, data)
    (tmp_path / segment_name(7)).write_bytes(os.urandom(3000))
    (tmp_path / segment_name(8)).write_bytes(bytes(4096))
    records, report = recover_and_close(tmp_path)
    assert [p for p, _ in records] == data
    assert not (tmp_path / segment_name(7)).exists()
    assert not (tmp_path / segment_name(8)).exists()
    assert [(seg, reason.startswith("torn tail")) for seg, _, _, reason in report.dropped] == [
        (7, True)
    ]


# ---------------------------------------------------------------- damage inside the log


def test_a_bit_flip_costs_exactly_the_record_it_hits(tmp_path: Path) -> None:
    data = numbered(60, size=100)
    pristine = tmp_path / "pristine"
    locs = write_journal(pristine, data)
    rng = random.Random(7)
    for victim in rng.sample(range(len(data) - 1), 12):
        loc = locs[victim]
        work = tmp_path / f"flip{victim}"
        shutil.copytree(pristine, work)
        offset = loc.offset + rng.randrange(HEADER_SIZE + loc.length)
        flip(work / segment_name(loc.segment), offset)
        records, report = recover_and_close(work)
        expected = [(p, loc) for i, (p, loc) in enumerate(zip(data, locs, strict=True))
                    if i != victim]
        assert records == expected
        assert [d[:3] for d in report.dropped] == [
            (loc.segment, loc.offset, HEADER_SIZE + loc.length)
        ]
        shutil.rmtree(work)


def test_damage_in_an_earlier_segment_keeps_everything_after_it(tmp_path: Path) -> None:
    data = numbered(200, size=100)
    locs = write_journal(tmp_path, data)
    assert locs[-1].segment > 3
    path = tmp_path / segment_name(2)
    patch(path, 500, os.urandom(700))  # scribble over several records of segment 2
    records, report = recover_and_close(tmp_path)
    hit = {i for i, loc in enumerate(locs)
           if loc.segment == 2 and loc.offset < 1200 and loc.offset + HEADER_SIZE + 100 > 500}
    assert [p for p, _ in records] == [p for i, p in enumerate(data) if i not in hit]
    assert len(report.dropped) == 1 and report.dropped[0][0] == 2
    assert not report.dropped[0][3].startswith("torn tail")


def test_a_zeroed_hole_is_skipped_and_the_records_after_it_kept(tmp_path: Path) -> None:
    data = numbered(20)
    locs = write_journal(tmp_path, data)
    hole = locs[5]
    patch(tmp_path / segment_name(1), hole.offset, bytes(HEADER_SIZE + hole.length))
    records, report = recover_and_close(tmp_path)
    assert [p for p, _ in records] == data[:5] + data[6:]
    assert report.dropped == [(1, hole.offset, HEADER_SIZE + hole.length, "zero gap")]


def test_a_copy_of_a_record_inside_a_payload_is_never_resurrected(tmp_path: Path) -> None:
    inner = tmp_path / "inner"
    write_journal(inner, [b"phantom"], preallocate=False)
    smuggled = (inner / segment_name(1)).read_bytes()  # a valid record, as message content
    outer = tmp_path / "outer"
    locs = write_journal(outer, [b"before", smuggled, b"after"])
    flip(outer / segment_name(1), locs[1].offset + 2)  # break the carrier's header
    records, report = recover_and_close(outer)
    assert [p for p, _ in records] == [b"before", b"after"]
    assert report.dropped[0][:3] == (1, locs[1].offset, HEADER_SIZE + len(smuggled))


# ---------------------------------------------------------------- odd directories


def test_garbage_files_never_crash_recovery(tmp_path: Path) -> None:
    data = numbered(5)
    write_journal(tmp_path, data)
    (tmp_path / segment_name(0)).write_bytes(os.urandom(10_000) + b"\xffS" * 500)
    records, report = recover_and_close(tmp_path)
    assert [p for p, _ in records] == data
    assert report.dropped[0][:2] == (0, 0)
    assert report.segments >= 2


def test_a_journal_of_pure_garbage_recovers_empty_and_works(tmp_path: Path) -> None:
    (tmp_path / segment_name(1)).write_bytes(os.urandom(20_000))
    (tmp_path / segment_name(2)).write_bytes(os.urandom(5_000))
    records, report = recover_and_close(tmp_path)
    assert records == []
    assert {d[0] for d in report.dropped} == {1, 2}
    data = numbered(50)
    write_journal(tmp_path, data)
    records, report = recover_and_close(tmp_path)
    assert [p for p, _ in records] == data
    assert report.dropped == []


def test_zero_filled_and_empty_segments_are_just_empty(tmp_path: Path) -> None:
    (tmp_path / segment_name(1)).write_bytes(bytes(50_000))
    (tmp_path / segment_name(2)).write_bytes(b"")
    records, report = recover_and_close(tmp_path)
    assert records == [] and report.dropped == []
    assert report.bytes_scanned == 50_000


def test_leftover_temporaries_are_removed_and_foreign_files_ignored(tmp_path: Path) -> None:
    (tmp_path / (segment_name(1) + ".tmp")).write_bytes(bytes(100))
    (tmp_path / "README").write_text("not a segment")
    records, report = recover_and_close(tmp_path)
    assert records == [] and report.segments == 0
    assert not (tmp_path / (segment_name(1) + ".tmp")).exists()
    assert (tmp_path / "README").exists()


# ---------------------------------------------------------------- any damage at all


@settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    damage=st.lists(
        st.tuples(
            st.sampled_from(["flip", "zero", "random", "truncate"]),
            st.integers(0, 30_000),
            st.integers(1, 400),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_recovery_yields_only_original_records_in_order_whatever_the_damage(
    tmp_path_factory, damage: list[tuple[str, int, int]]
) -> None:
    directory = tmp_path_factory.mktemp("fuzz")
    data = [os.urandom(random.randrange(300)) for _ in range(150)]
    locs = write_journal(directory, data, sync=False)
    files = sorted(directory.glob("*.log"))
    rng = random.Random(repr(damage))
    for kind, offset, length in damage:
        path = rng.choice(files)
        size = path.stat().st_size
        if kind == "truncate":
            with open(path, "r+b") as fh:
                fh.truncate(min(offset, size))
            continue
        offset = min(offset, max(size - 1, 0))
        chunk = {"zero": bytes(length), "random": os.urandom(length)}.get(kind)
        if chunk is None:
            if size:
                flip(path, offset)
        else:
            patch(path, offset, chunk[: max(size - offset, 0)])
    records, _ = recover_and_close(directory)
    originals = dict(zip(locs, data, strict=True))
    positions = [(loc.segment, loc.offset) for _, loc in records]
    assert positions == sorted(positions)
    for payload, loc in records:
        assert originals[loc] == payload
    again, _ = recover_and_close(directory)
    assert again == records
