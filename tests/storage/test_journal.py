"""Spec of the journal's public API: append/recover round trips, reads, lifecycle, deletion."""

from __future__ import annotations

import os
import random
import threading
from pathlib import Path

import pytest

from sluicemq.errors import StorageError
from sluicemq.storage.journal import Journal, Location
from sluicemq.storage.journal_writer import LARGE_RECORD, zero_fill
from sluicemq.storage.segment import HEADER_SIZE, segment_name


def payloads(n: int, seed: int = 1, max_len: int = 3000) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(rng.randrange(max_len)) for _ in range(n)]


def segment_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("*.log"))


def through_the_writer(opened) -> None:
    """Return once the writer thread has done what it was handed before now (a reclaimed
    segment's unlink): a record appended now may share the writer's turn with that work and be
    reported before it is done; one appended after that record was reported is written in a
    later turn. No polling."""
    for _ in range(2):
        opened.watch.wait(opened.journal.append(1, b"").seq)


def blocking_on_durable(opened, gate: threading.Event) -> threading.Event:
    """Start the writer with an on_durable that holds the writer thread until ``gate`` is set,
    reporting to ``opened.watch`` once it is; returns the event set when it starts holding."""
    holding = threading.Event()

    def on_durable(seq: int) -> None:
        holding.set()
        gate.wait(10)
        opened.watch.on_durable(seq)

    opened.journal.start(on_durable, opened.watch.on_failed)
    return holding


# ---------------------------------------------------------------- round trips


def test_records_survive_close_and_reopen_across_segment_rolls(open_journal) -> None:
    first = open_journal(segment_bytes=16 << 10)
    assert first.records == []
    data = payloads(400)
    tickets = [first.journal.append(1 + i % 255, p) for i, p in enumerate(data)]
    first.watch.wait(tickets[-1].seq)
    first.journal.close()

    again = open_journal(first.directory, segment_bytes=16 << 10)
    assert again.records == [
        (1 + i % 255, p, t.loc) for i, (p, t) in enumerate(zip(data, tickets, strict=True))
    ]
    report = again.journal.report
    assert report is not None
    assert report.records == 400 and report.dropped == []
    assert report.segments > 10


def test_seqs_start_at_one_and_locations_are_final_at_append(open_journal) -> None:
    opened = open_journal(segment_bytes=1000)
    tickets = [opened.journal.append(7, bytes(300)) for _ in range(7)]
    assert [t.seq for t in tickets] == list(range(1, 8))
    # three 316-byte records fit in 1000 bytes; the fourth rolls to a new segment at offset 0
    assert [(t.loc.segment, t.loc.offset) for t in tickets] == [
        (1, 0), (1, 316), (1, 632), (2, 0), (2, 316), (2, 632), (3, 0)
    ]
    assert all(t.loc.length == 300 for t in tickets)


def test_appending_continues_after_the_recovered_end(open_journal) -> None:
    first = open_journal()
    a = first.journal.append(1, b"one")
    first.watch.wait(a.seq)
    first.journal.close()
    second = open_journal(first.directory)
    b = second.journal.append(1, b"two")
    assert b.loc == Location(1, HEADER_SIZE + 3, 3)
    second.watch.wait(b.seq)
    second.journal.close()
    third = open_journal(first.directory)
    assert [p for _, p, _ in third.records] == [b"one", b"two"]


def test_a_record_bigger_than_a_segment_gets_a_segment_of_its_own(open_journal) -> None:
    opened = open_journal(segment_bytes=64 << 10)
    huge = os.urandom(300 << 10)
    small, big, after = (opened.journal.append(1, b"a"), opened.journal.append(2, huge),
                         opened.journal.append(3, b"c"))
    assert big.loc == Location(2, 0, len(huge))
    assert after.loc.segment == 3
    opened.watch.wait(after.seq)
    assert opened.journal.read(big.loc) == huge
    opened.journal.close()
    assert (opened.directory / segment_name(2)).stat().st_size >= len(huge) + HEADER_SIZE
    again = open_journal(opened.directory, segment_bytes=64 << 10)
    assert [(r, loc) for r, _, loc in again.records] == [(1, small.loc), (2, big.loc),
                                                          (3, after.loc)]
    assert again.records[1][1] == huge


def test_reopening_keeps_the_preallocated_next_segment(open_journal) -> None:
    first = open_journal(segment_bytes=4096)
    t = first.journal.append(1, b"x")
    first.watch.wait(t.seq)
    spare = first.journal.segment_path(2)
    first.journal.close()  # waits for the helper zero-filling it in the background
    assert spare.exists()
    inode = spare.stat().st_ino

    again = open_journal(first.directory, segment_bytes=4096)
    tickets = [again.journal.append(1, bytes(1000)) for _ in range(6)]
    again.watch.wait(tickets[-1].seq)
    assert tickets[-1].loc.segment == 2
    assert spare.stat().st_ino == inode  # reused, not zero-filled again
    again.journal.close()
    assert len(open_journal(first.directory, segment_bytes=4096).records) == 7


def test_close_writes_and_syncs_everything_still_pending(open_journal) -> None:
    opened = open_journal()
    data = payloads(300, seed=3)
    for p in data:
        opened.journal.append(1, p)
    opened.journal.close()
    assert opened.watch.high == 300
    assert [p for _, p, _ in open_journal(opened.directory).records] == data


# ---------------------------------------------------------------- reads


def test_read_returns_durable_payloads_and_payload_offset_points_at_them(open_journal) -> None:
    opened = open_journal(segment_bytes=8 << 10)
    data = payloads(50, seed=4)
    tickets = [opened.journal.append(1, p) for p in data]
    opened.watch.wait(tickets[-1].seq)
    for p, t in zip(data, tickets, strict=True):
        assert opened.journal.read(t.loc) == p
        with open(opened.journal.segment_path(t.loc.segment), "rb") as fh:
            assert os.pread(fh.fileno(), t.loc.length, opened.journal.payload_offset(t.loc)) == p


def test_read_serves_records_not_yet_written_from_memory(open_journal) -> None:
    opened = open_journal(start=False)
    gate = threading.Event()
    holding = blocking_on_durable(opened, gate)
    first = opened.journal.append(1, b"first")  # the writer blocks in on_durable after this
    assert holding.wait(10)
    assert opened.journal.durable_seq == first.seq
    queued = [opened.journal.append(1, b"queued %d" % i) for i in range(20)]
    with open(opened.journal.segment_path(1), "rb") as fh:
        assert os.pread(fh.fileno(), HEADER_SIZE, queued[0].loc.offset) == bytes(HEADER_SIZE)
    assert all(opened.journal.read(t.loc) == b"queued %d" % i for i, t in enumerate(queued))
    assert opened.journal.durable_seq == first.seq
    gate.set()


def test_read_detects_a_corrupted_payload(open_journal) -> None:
    opened = open_journal()
    ticket = opened.journal.append(1, b"precious bytes")
    opened.watch.wait(ticket.seq)
    with open(opened.journal.segment_path(1), "r+b") as fh:
        fh.seek(opened.journal.payload_offset(ticket.loc) + 3)
        fh.write(b"X")
    with pytest.raises(StorageError, match="checksum"):
        opened.journal.read(ticket.loc)
    with pytest.raises(StorageError):
        opened.journal.read(Location(1, ticket.loc.offset, ticket.loc.length + 1))


def test_append_copies_mutable_buffers(open_journal) -> None:
    opened = open_journal()
    buf = bytearray(b"original")
    view_source = bytearray(b"viewed")
    a = opened.journal.append(1, buf)
    b = opened.journal.append(1, memoryview(view_source))
    buf[:] = b"mutated!"
    view_source[:] = b"XXXXXX"
    opened.watch.wait(b.seq)
    assert opened.journal.read(a.loc) == b"original"
    assert opened.journal.read(b.loc) == b"viewed"


def test_a_record_appended_with_a_tail_is_one_payload_pending_written_and_recovered(
        open_journal) -> None:
    opened = open_journal(start=False, segment_bytes=1 << 20)
    gate = threading.Event()
    holding = blocking_on_durable(opened, gate)
    first = opened.journal.append(1, b"first")  # the writer blocks in on_durable after this
    assert holding.wait(10)
    assert opened.journal.durable_seq == first.seq
    head, body = b"head:", bytearray(os.urandom(70_000))
    split = opened.journal.append(3, head, body)
    whole = bytes(head + body)
    body[:4] = b"XXXX"  # a mutable tail is copied like a mutable payload
    after = opened.journal.append(1, b"after")
    assert split.loc.length == len(whole)
    assert after.loc.offset == split.loc.offset + HEADER_SIZE + len(whole)
    assert opened.journal.peek(split.loc, 0, 5) == head  # still in memory
    assert opened.journal.read_many([(split.loc.segment, split.loc.offset, split.loc.length)]
                                    ) == [whole]
    assert opened.journal.read(split.loc) == whole
    gate.set()
    opened.watch.wait(after.seq)
    assert opened.journal.read(split.loc) == whole  # from the file, checksum verified
    opened.journal.close()
    again = open_journal(opened.directory, segment_bytes=1 << 20)
    assert [(r, bytes(p)) for r, p, _ in again.records] == [
        (1, b"first"), (3, whole), (1, b"after")]


def test_a_damaged_tail_fails_the_records_checksum(open_journal) -> None:
    opened = open_journal()
    ticket = opened.journal.append(1, b"head", b"tail bytes")
    opened.watch.wait(ticket.seq)
    with open(opened.journal.segment_path(1), "r+b") as fh:
        fh.seek(opened.journal.payload_offset(ticket.loc) + ticket.loc.length - 1)
        fh.write(b"X")
    with pytest.raises(StorageError, match="checksum"):
        opened.journal.read(ticket.loc)


# ---------------------------------------------------------------- lifecycle


def test_rtype_must_be_one_to_255(open_journal) -> None:
    opened = open_journal()
    for bad in (0, 256, -1):
        with pytest.raises(ValueError):
            opened.journal.append(bad, b"")
    assert opened.journal.append(255, b"").seq == 1


def test_lifecycle_is_recover_then_start_then_close(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j")
    with pytest.raises(StorageError):
        journal.start(print, print)
    list(journal.recover())
    with pytest.raises(StorageError):
        journal.append(1, b"not started")
    list(journal.recover())  # again before start: a full scan after an unusable snapshot
    journal.start(lambda seq: None, lambda a, b, e: None)
    with pytest.raises(StorageError):
        list(journal.recover())
    journal.close()
    with pytest.raises(StorageError):
        journal.append(1, b"closed")
    journal.close()


def test_a_directory_is_used_by_one_journal_at_a_time(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j")
    with pytest.raises(StorageError, match="in use"):
        Journal(tmp_path / "j")
    journal.close()
    Journal(tmp_path / "j").close()


def test_the_callback_thread_survives_a_raising_on_durable(open_journal) -> None:
    opened = open_journal(start=False)
    calls: list[int] = []

    def explode(seq: int) -> None:
        calls.append(seq)
        opened.watch.on_durable(seq)
        raise RuntimeError("store bug")

    opened.journal.start(explode, opened.watch.on_failed)
    opened.watch.wait(opened.journal.append(1, b"a").seq)
    assert calls == [1]
    opened.watch.wait(opened.journal.append(1, b"b").seq)
    assert calls == [1, 2]


# ---------------------------------------------------------------- deletion rule


def fill_segments(opened, count: int, record: int = 400) -> list:
    """Append records of `record` bytes until `count` segments are sealed; wait for them."""
    tickets = []
    while not tickets or tickets[-1].loc.segment <= count:
        tickets.append(opened.journal.append(1, bytes(record)))
    opened.watch.wait(tickets[-1].seq)
    return tickets


def test_segments_go_oldest_first_once_nothing_in_them_is_live(open_journal) -> None:
    opened = open_journal(segment_bytes=1024)
    journal = opened.journal
    tickets = fill_segments(opened, 4)
    by_segment = {t.loc.segment: t for t in tickets}
    for seg in (1, 2, 3):
        journal.retain(by_segment[seg].loc)
    journal.retain(tickets[-1].loc)

    journal.release(by_segment[2].loc)
    assert journal.reclaim() == []  # 1 is still live, so 2 must wait
    journal.release(by_segment[1].loc)
    assert journal.reclaim() == [1, 2]
    through_the_writer(opened)
    assert segment_files(opened.directory)[0] == segment_name(3)
    with pytest.raises(StorageError):
        journal.read(by_segment[1].loc)
    with pytest.raises(StorageError):
        journal.retain(by_segment[2].loc)
    journal.release(by_segment[3].loc)
    assert journal.reclaim() == [3, 4]


def test_the_active_segment_is_never_reclaimed(open_journal) -> None:
    opened = open_journal(segment_bytes=1024)
    t = opened.journal.append(1, b"only")
    opened.watch.wait(t.seq)
    opened.journal.retain(t.loc)
    opened.journal.release(t.loc)
    assert opened.journal.reclaim() == []
    assert opened.journal.read(t.loc) == b"only"


def test_segments_nobody_retained_go_once_a_newer_record_was_touched(open_journal) -> None:
    opened = open_journal(segment_bytes=1024)
    tickets = fill_segments(opened, 3)  # e.g. acknowledgement records nobody retains
    assert opened.journal.reclaim() == []  # their owner may not have seen them yet
    opened.journal.retain(tickets[-1].loc)  # the caller has now caught up to the newest one
    assert opened.journal.reclaim() == [1, 2, 3]


def test_reclaim_spares_a_durable_segment_whose_records_the_caller_has_not_seen(
    open_journal,
) -> None:
    """A caller that retains when on_durable reaches its loop must not lose that race."""
    opened = open_journal(segment_bytes=1024)
    old = opened.journal.append(1, bytes(400))
    opened.watch.wait(old.seq)
    opened.journal.retain(old.loc)
    newer = fill_segments(opened, 3)  # durable on disk, retains not yet made by the caller
    opened.journal.release(old.loc)
    assert opened.journal.reclaim() == []
    for t in newer:
        opened.journal.retain(t.loc)
    assert opened.journal.reclaim() == []
    assert all(opened.journal.read(t.loc) == bytes(400) for t in newer)


def test_release_without_retain_is_an_error(open_journal) -> None:
    opened = open_journal()
    t = opened.journal.append(1, b"x")
    with pytest.raises(StorageError):
        opened.journal.release(t.loc)


def test_after_recovery_counts_start_at_zero_and_the_replayer_retains(open_journal) -> None:
    first = open_journal(segment_bytes=1024)
    fill_segments(first, 5)
    first.journal.close()

    again = open_journal(first.directory, segment_bytes=1024, start=False)
    files_before = segment_files(again.directory)
    keep = [loc for _, _, loc in again.records if loc.segment == 3]
    for loc in keep:
        again.journal.retain(loc)
    disk = again.journal.disk_bytes()
    assert again.journal.reclaim() == [1, 2]  # not started: deleted synchronously
    assert segment_files(again.directory) == files_before[2:]
    assert again.journal.disk_bytes() < disk
    for loc in keep:
        again.journal.release(loc)
    assert again.journal.reclaim() == [3, 4, 5]
    again.journal.start(again.watch.on_durable, again.watch.on_failed)
    t = again.journal.append(1, b"still works")
    again.watch.wait(t.seq)
    assert again.journal.read(t.loc) == b"still works"


def test_segments_are_zero_filled_ahead_unless_the_records_since_are_large() -> None:
    assert zero_fill(0, 0)  # nothing written yet: the small-record case
    assert zero_fill(1000, 1000 * 1024)
    assert zero_fill(3, 3 * LARGE_RECORD - 1)
    assert not zero_fill(3, 3 * LARGE_RECORD)


def test_large_records_in_allocated_not_zero_filled_segments_recover_whole(
        open_journal) -> None:
    first = open_journal(segment_bytes=2 << 20)
    data = [bytes([i]) * (300 << 10) for i in range(1, 31)]  # ~9 MiB: the later segments
    tickets = [first.journal.append(1, p) for p in data]     # are allocated, not zero-filled
    first.watch.wait(tickets[-1].seq)
    first.journal.close()

    again = open_journal(first.directory, segment_bytes=2 << 20)
    assert [p for _, p, _ in again.records] == data
    report = again.journal.report
    assert report is not None and report.dropped == [] and report.segments >= 4
