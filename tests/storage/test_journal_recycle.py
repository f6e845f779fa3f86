"""Spec of segment recycling: reclaimed segments' files become new segments, and what they held
before never comes back, whatever recovery finds after a segment's last record."""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path

from sluicemq.storage.checksum import crc32
from sluicemq.storage.headerkey import KEY_NAME
from sluicemq.storage.journal import Journal, Location
from sluicemq.storage.journal_writer import LARGE_RECORD
from sluicemq.storage.recycle import spare_name
from sluicemq.storage.segment import (
    HEADER_SIZE,
    REUSED,
    encode_header,
    segment_name,
)

SEG = 64 << 10


def fill(opened, sizes: list[int], seed: int) -> list[tuple[bytes, Location]]:
    """Append records of ``sizes`` (held once each), numbered in their first bytes; wait
    until they are durable."""
    rng = random.Random(seed)
    out = []
    for i, size in enumerate(sizes):
        payload = (b"%d.%06d " % (seed, i) + rng.randbytes(size))[:max(size, 10)]
        ticket = opened.journal.append(1, payload, holds=1)
        out.append((payload, ticket.loc))
    opened.watch.wait(ticket.seq)
    return out


def consume(opened, records: list[tuple[bytes, Location]]) -> list[int]:
    """Release them all, reclaim, and return once the writer has kept or deleted the files."""
    for _, loc in records:
        opened.journal.release(loc)
    gone = opened.journal.reclaim()
    for _ in range(2):  # the writer renames reclaimed files in its turn: two turns later, done
        opened.watch.wait(opened.journal.append(9, b"").seq)
    return gone


def left(records: list[tuple[bytes, Location]], gone: list[int]) -> list[bytes]:
    """The payloads of ``records`` whose segment was not reclaimed (released, not deleted)."""
    return [p for p, loc in records if loc.segment not in gone]


def spares(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("*.spare"))


def inode(path: Path) -> int:
    return path.stat().st_ino


def recover_closed(directory: Path, **kwargs) -> tuple[list[bytes], Journal]:
    kwargs.setdefault("segment_bytes", SEG)
    journal = Journal(directory, **kwargs)
    payloads = [bytes(p) for rtype, p, _ in journal.recover() if rtype == 1]
    journal.close()
    return payloads, journal


def test_reclaimed_files_are_kept_up_to_the_bound_and_become_the_next_segments(
        open_journal) -> None:
    opened = open_journal(segment_bytes=SEG, recycle_bytes=3 * SEG, preallocate=False)
    old = fill(opened, [3000] * 150, seed=1)  # ~7 segments
    kept_files = {n: inode(opened.directory / segment_name(n)) for n in (1, 2, 3)}
    gone = consume(opened, old)
    assert len(gone) >= 5
    assert spares(opened.directory) == [spare_name(n) for n in (1, 2, 3)]  # oldest first
    assert not any((opened.directory / segment_name(n)).exists() for n in gone)
    assert opened.journal.pool.spare_bytes == sum(
        (opened.directory / spare_name(n)).stat().st_size for n in (1, 2, 3))
    new = fill(opened, [3000] * 100, seed=2)
    made = sorted({loc.segment for _, loc in new} - {loc.segment for _, loc in old})
    assert [inode(opened.directory / segment_name(n)) for n in made[:3]] == list(
        kept_files.values())
    assert opened.journal.pool.taken == 3 and spares(opened.directory) == []
    assert all(n > max(gone) for n in made)  # a file never gets back a number it had


def test_old_records_left_after_the_tail_of_reused_files_never_come_back(
        open_journal) -> None:
    opened = open_journal(segment_bytes=SEG, recycle_bytes=16 * SEG, preallocate=False)
    old = fill(opened, [2000] * 200, seed=1)
    expected = left(old, consume(opened, old))
    # Same-sized records: each old record sits exactly where a new one would, and is intact
    # but for the segment number its header checksum is seeded with.
    expected += [p for p, _ in fill(opened, [2000] * 40, seed=2)]
    assert opened.journal.pool.taken
    rng = random.Random(3)
    tail = fill(opened, [rng.randrange(50, 5000) for _ in range(30)], seed=3)
    expected += [p for p, _ in tail]
    last = tail[-1][1]
    path = opened.directory / segment_name(last.segment)
    opened.journal.close()
    after_tail = path.read_bytes()[last.offset + HEADER_SIZE + last.length:]
    assert after_tail.strip(b"\0"), "the active segment's file holds its earlier records"

    payloads, journal = recover_closed(opened.directory)
    assert payloads == expected
    assert journal.report is not None and journal.report.dropped == []
    assert journal.report.stale_bytes > 0
    assert path.read_bytes()[last.offset + HEADER_SIZE + last.length:] == after_tail  # kept

    again = open_journal(opened.directory, segment_bytes=SEG, recycle_bytes=16 * SEG)
    more = fill(again, [2000] * 10, seed=4)
    again.journal.close()
    payloads, journal = recover_closed(opened.directory)
    assert payloads == expected + [p for p, _ in more]
    assert journal.report is not None and journal.report.dropped == []


def test_large_records_then_small_ones_in_reused_files_all_come_back(open_journal) -> None:
    """Batches that end in a large record (written with O_DIRECT, its last block too), small
    records after each in the next batch, in reused files whose earlier records lie past the
    log's end: every record comes back byte for byte, and none of the earlier ones."""
    seg = 1 << 20
    opened = open_journal(segment_bytes=seg, recycle_bytes=16 * seg, preallocate=False)
    old = fill(opened, [LARGE_RECORD + 100] * 12, seed=1)  # three a segment
    expected = left(old, consume(opened, old))
    rng = random.Random(5)
    for n in range(12):
        expected += [p for p, _ in fill(opened, [LARGE_RECORD + rng.randrange(4096)], seed=10 + n)]
        expected += [p for p, _ in fill(opened, [rng.randrange(1, 6000) for _ in range(3)],
                                        seed=30 + n)]
    assert opened.journal.pool.taken and opened.journal.stats.direct_bytes
    opened.journal.close()
    payloads, journal = recover_closed(opened.directory, segment_bytes=seg)
    assert payloads == expected
    assert journal.report is not None and journal.report.dropped == []


def test_a_torn_record_in_a_reused_file_is_the_torn_tail_and_only_it_is_zeroed(
        open_journal) -> None:
    opened = open_journal(segment_bytes=SEG, recycle_bytes=16 * SEG, preallocate=False)
    old = fill(opened, [2000] * 100, seed=1)
    before = left(old, consume(opened, old))
    new = fill(opened, [1500] * 60, seed=2)  # on into files of the pool
    last = new[-1][1]
    assert opened.journal.pool.reused(last.segment)
    opened.journal.close()
    path = opened.directory / segment_name(last.segment)
    end = last.offset + HEADER_SIZE + last.length
    with open(path, "r+b") as fh:  # the last record's payload never fully reached the disk
        os.pwrite(fh.fileno(), bytes(100), last.offset + HEADER_SIZE + 700)
    stale = path.read_bytes()[end:]

    payloads, journal = recover_closed(opened.directory)
    assert payloads == before + [p for p, _ in new[:-1]]
    assert journal.report is not None
    assert [(s, o, n) for s, o, n, _ in journal.report.dropped] == [
        (last.segment, last.offset, end - last.offset)]
    assert journal.report.dropped[0][3].startswith("torn tail")
    data = path.read_bytes()
    assert data[last.offset:end] == bytes(end - last.offset) and data[end:] == stale

    again = open_journal(opened.directory, segment_bytes=SEG, recycle_bytes=16 * SEG)
    more = fill(again, [400] * 3, seed=3)
    again.journal.close()
    payloads, journal = recover_closed(opened.directory)
    assert payloads == before + [p for p, _ in new[:-1] + more]
    assert journal.report is not None and journal.report.dropped == []


def test_a_payload_written_as_a_record_of_the_files_later_number_is_never_read(
        open_journal) -> None:
    """A payload's bytes are its sender's: one may lay out a record for the number and offset
    its file gets when reused. Its checksums are keyed with the journal's secret (headerkey.py),
    which the sender never sees, so her best guess - the seeds of a journal without a key - does
    not check out there: the scan resynchronises over it and goes on."""
    opened = open_journal(segment_bytes=SEG, recycle_bytes=16 * SEG, preallocate=False)
    # 21 records of 3,000 bytes a segment: 150 fill segments 1-8, so segment 1's file is the
    # oldest spare once they are consumed, and becomes segment 9.
    forged = b"forged"
    later = encode_header(1, forged, 9, HEADER_SIZE + 200, flags=REUSED, seeds=(0, 0)) + forged
    first = (b"x" * 200 + later).ljust(3000, b"y")
    ticket = opened.journal.append(1, first, holds=1)
    old = [(first, ticket.loc), *fill(opened, [3000] * 149, seed=1)]
    assert ticket.loc == Location(1, 0, 3000) and old[-1][1].segment == 8
    expected = left(old, consume(opened, old))
    new = fill(opened, [3000] * 18, seed=2)
    end = new[-1][1].offset + HEADER_SIZE + 3000
    new += fill(opened, [SEG - end - HEADER_SIZE, 40, 40], seed=3)  # 8 full, two records in 9
    assert new[-1][1] == Location(9, HEADER_SIZE + 40, 40)
    assert opened.journal.pool.reused(9)
    opened.journal.close()
    data = (opened.directory / segment_name(9)).read_bytes()
    assert data[HEADER_SIZE + 200:HEADER_SIZE + 200 + len(later)] == later  # there it lies
    payloads, journal = recover_closed(opened.directory)
    assert payloads == expected + [p for p, _ in new]
    assert journal.report is not None and journal.report.dropped == []


def test_damage_in_a_reused_file_costs_only_the_damaged_record(open_journal) -> None:
    """A record damaged after it was written (bit rot) in a reused file is lost and reported;
    the scan resynchronises past it, so the records after it in that segment are kept, as in
    a new file (test_journal_recovery): keyed checksums leave no chosen bytes to land on."""
    opened = open_journal(segment_bytes=SEG, recycle_bytes=16 * SEG, preallocate=False)
    old = fill(opened, [2000] * 100, seed=1)
    before = left(old, consume(opened, old))
    new = fill(opened, [1500] * 60, seed=2)
    hit = new[-10][1]
    assert opened.journal.pool.reused(hit.segment) and new[-1][1].segment == hit.segment
    opened.journal.close()
    with open(opened.directory / segment_name(hit.segment), "r+b") as fh:
        os.pwrite(fh.fileno(), b"\xff" * 8, hit.offset + HEADER_SIZE + 10)
    payloads, journal = recover_closed(opened.directory)
    assert payloads == before + [p for p, _ in new[:-10] + new[-9:]]
    assert journal.report is not None
    assert [(s, o, n) for s, o, n, _ in journal.report.dropped] == [
        (hit.segment, hit.offset, HEADER_SIZE + hit.length)]


def test_damage_in_a_reused_file_of_a_journal_without_a_key_still_ends_its_segment(
        tmp_path: Path) -> None:
    """A segment written into a reused file before keys existed (session 17's format: REUSED,
    seeds (0, 0)) is read as then: as a chain, since a body in it could hold a record of its
    number and offset; past a damaged record its file is taken for its earlier contents."""
    directory = tmp_path / "journal"
    directory.mkdir()
    payloads = [b"%03d" % i + bytes(1500) for i in range(30)]
    data, offsets = b"", []
    for payload in payloads:
        offsets.append(len(data))
        data += encode_header(1, payload, 5, len(data), flags=REUSED, seeds=(0, 0)) + payload
    later = encode_header(1, b"old", 3, 0, seeds=(0, 0)) + b"old"  # the file's earlier life
    data = data + later * ((SEG - len(data)) // len(later))
    damaged = bytearray(data)
    damaged[offsets[20] + HEADER_SIZE + 7] ^= 0xFF
    (directory / segment_name(5)).write_bytes(bytes(damaged).ljust(SEG, b"\0"))
    got, journal = recover_closed(directory)
    assert got == payloads[:20]
    assert journal.header_key.first == 6 and (directory / KEY_NAME).exists()


def test_a_spare_made_ready_before_a_stop_is_the_next_segment_after_it(open_journal) -> None:
    opened = open_journal(segment_bytes=SEG, recycle_bytes=16 * SEG)
    old = fill(opened, [2000] * 100, seed=1)
    before = left(old, consume(opened, old))
    new = fill(opened, [2000] * 40, seed=2)  # into the next segment: the one after is made
    active = new[-1][1].segment
    ready = opened.directory / segment_name(active + 1)
    opened.journal.close()
    assert ready.exists() and opened.journal.pool.reused(active + 1)
    ready_inode = inode(ready)

    payloads, journal = recover_closed(opened.directory)
    assert payloads == before + [p for p, _ in new]
    assert journal.report is not None and journal.report.dropped == []
    assert inode(ready) == ready_inode  # kept, not deleted and made again

    again = open_journal(opened.directory, segment_bytes=SEG, recycle_bytes=16 * SEG)
    assert again.journal.pool.reused(active + 1)
    more = fill(again, [2000] * 40, seed=3)  # rolls into it
    assert active + 1 in {loc.segment for _, loc in more}
    again.journal.close()
    with open(ready, "rb") as fh:
        assert fh.read(HEADER_SIZE)[3] & REUSED
    payloads, journal = recover_closed(opened.directory)
    assert payloads == before + [p for p, _ in new + more]
    assert journal.report is not None and journal.report.dropped == []


def v1_record(payload: bytes, segment: int, offset: int) -> bytes:
    """A record as the format before REUSED wrote it (flags 0), from its documented layout."""
    head = struct.pack("<2sBBII", b"\xffS", 1, 0, len(payload), crc32(payload))
    seed = crc32(struct.pack("<QQ", segment, offset))
    return head + struct.pack("<I", crc32(head, seed)) + payload


def test_a_journal_written_before_reuse_existed_recovers_as_it_did(
        tmp_path: Path, open_journal) -> None:
    directory = tmp_path / "journal"
    directory.mkdir()
    rng = random.Random(7)
    written: list[bytes] = []
    for segment in (1, 2):
        data, offset = b"", 0
        while True:
            payload = rng.randbytes(rng.randrange(100, 3000))
            record = v1_record(payload, segment, offset)
            if offset + len(record) > SEG:
                break
            data += record
            offset += len(record)
            written.append(payload)
        (directory / segment_name(segment)).write_bytes(data.ljust(SEG, b"\0"))
    torn = v1_record(b"t" * 1000, 2, offset)[:600]  # a torn tail after the last record
    with open(directory / segment_name(2), "r+b") as fh:
        os.pwrite(fh.fileno(), torn, offset)

    opened = open_journal(directory, segment_bytes=SEG, recycle_bytes=16 * SEG)
    assert [p for _, p, _ in opened.records] == written
    report = opened.journal.report
    assert report is not None and report.stale_bytes == 0
    assert [(s, o, r.startswith("torn tail")) for s, o, _, r in report.dropped] == [
        (2, offset, True)]
    assert (directory / segment_name(2)).read_bytes()[offset:] == bytes(SEG - offset)
    for _, _, loc in opened.records:
        opened.journal.retain(loc)
    old = [(p, loc) for _, p, loc in opened.records]
    before = left(old, consume(opened, old))
    assert spares(directory) == [spare_name(1)]  # 2 is the active segment
    new = fill(opened, [2500] * 60, seed=8)
    opened.journal.close()
    payloads, journal = recover_closed(directory)
    assert payloads == before + [p for p, _ in new]
    assert journal.report is not None and journal.report.dropped == []


def test_spares_beyond_the_bound_or_larger_than_a_segment_are_deleted_at_start(
        tmp_path: Path) -> None:
    directory = tmp_path / "journal"
    directory.mkdir()
    for n in (2, 3, 4):
        (directory / spare_name(n)).write_bytes(os.urandom(SEG))
    (directory / spare_name(1)).write_bytes(os.urandom(SEG * 2))
    journal = Journal(directory, segment_bytes=SEG, recycle_bytes=2 * SEG)
    assert list(journal.recover()) == []
    journal.close()
    assert spares(directory) == [spare_name(2), spare_name(3)]
    assert journal.pool.spare_bytes == 2 * SEG


def test_spares_stay_within_the_limit_together_with_the_live_segments(open_journal) -> None:
    """Spares are journal disk: reclaim keeps no more than the limit leaves after the log, and a
    start with a lower limit deletes what no longer fits."""
    opened = open_journal(segment_bytes=SEG, recycle_bytes=16 * SEG, preallocate=False)
    opened.journal.pool.bound(6 * SEG, min_free=1)
    old = fill(opened, [3000] * 150, seed=11)  # ~7 segments
    keep = fill(opened, [3000] * 30, seed=12)  # ~1.5 segments that stay live
    gone = consume(opened, old)
    live = opened.journal.segment_count()
    assert len(gone) >= 5 and live >= 2
    assert len(spares(opened.directory)) == 6 - live
    assert opened.journal.pool.released == 0  # refused at reclaim: deleted, not released
    opened.journal.close()
    journal = Journal(opened.directory, segment_bytes=SEG, recycle_bytes=16 * SEG)
    journal.pool.bound(live * SEG + SEG, min_free=1)
    payloads = [bytes(p) for rtype, p, _ in journal.recover() if rtype == 1]
    journal.close()
    assert payloads == left(old, gone) + [p for p, _ in keep]
    assert len(spares(opened.directory)) == 1 and journal.pool.released == 6 - live - 1


def test_spares_are_given_back_while_the_filesystem_is_below_its_free_floor(
        open_journal) -> None:
    """Below the floor no reclaimed file is kept and the kept ones are deleted, oldest first;
    the log itself is untouched."""
    opened = open_journal(segment_bytes=SEG, recycle_bytes=16 * SEG, preallocate=False)
    journal = opened.journal
    journal.pool.bound(0, min_free=1)
    gone = consume(opened, fill(opened, [3000] * 150, seed=13))
    assert len(spares(opened.directory)) == len(gone)
    journal.trim_spares()  # nothing pressing: nothing goes
    assert len(spares(opened.directory)) == len(gone) and not journal.pool.pressed()
    fs = os.statvfs(opened.directory)
    journal.pool.bound(0, min_free=fs.f_bavail * fs.f_frsize + (1 << 40))  # above the disk
    assert journal.pool.pressed()
    journal.trim_spares()
    assert spares(opened.directory) == [] and journal.pool.spare_bytes == 0
    assert journal.pool.released == len(gone)
    later = fill(opened, [3000] * 150, seed=14)
    consume(opened, later)
    assert spares(opened.directory) == []  # reclaimed files deleted, not kept
    assert journal.pool.released == len(gone)


def test_the_journals_files_on_disk_are_counted_before_recovery(tmp_path: Path) -> None:
    """What a default store limit adds back to the free disk at start: the segment and spare
    files in the journal's directory, nothing else, read before recovery."""
    directory = tmp_path / "journal"
    directory.mkdir()
    (directory / segment_name(5)).write_bytes(b"x" * 1000)
    (directory / spare_name(3)).write_bytes(b"y" * 500)
    (directory / "notes.txt").write_bytes(b"z" * 100)
    journal = Journal(directory, segment_bytes=SEG)
    try:
        assert journal.pool.on_disk() == 1500
    finally:
        journal.close()
    assert Journal(tmp_path / "absent", segment_bytes=SEG, dir_lock=False).pool.on_disk() == 0
