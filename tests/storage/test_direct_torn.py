"""Spec of a crash that tears the O_DIRECT writes of large records (``storage/direct.py``).

A large record goes to disk as whole 4 KiB blocks (several writes in flight, landing in any
order), and the block it ends in - which holds the next record's start - is written apart,
with the next large record or through the page cache. A crash before the batch's fdatasync may
leave any of those blocks unwritten: zeros in a fresh segment, the file's earlier life (an
older segment's records) in one made from a reclaimed file. Whatever subset landed, recovery
keeps exactly the records whose bytes are all on disk, in log order, and nothing else - no
record made up of a torn one's pieces - logs what it dropped, and the journal then goes on
from there: records appended after the recovery come back after the next one.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import pytest

from sluicemq.storage.direct import ALIGN
from sluicemq.storage.journal_writer import LARGE_RECORD
from sluicemq.storage.segment import HEADER_SIZE, segment_name

SEGMENT = 64 << 20


def batch_payloads() -> list[bytes]:
    """Small records in the blocks large ones start and end in, large ones back to back."""
    return [os.urandom(100), os.urandom(LARGE_RECORD + 5000), os.urandom(300),
            os.urandom(LARGE_RECORD + 3 * ALIGN + 17), os.urandom(LARGE_RECORD + 999),
            os.urandom(40), os.urandom(2 * LARGE_RECORD + 1), os.urandom(7)]


def written(open_journal: Any, directory: Path, payloads: list[bytes]) -> list[tuple[int, int]]:
    """One batch of ``payloads`` (direct writes in flight together), closed cleanly; each
    record's (start, end) in segment 1."""
    opened = open_journal(directory, segment_bytes=SEGMENT)
    opened.journal.wake_on_append = False
    tickets = [opened.journal.append(1, p) for p in payloads]
    opened.journal.kick()
    opened.watch.wait(tickets[-1].seq)
    assert not opened.watch.failed and opened.journal.stats.direct_bytes > 0
    opened.journal.close()
    spans = [(t.loc.offset, t.loc.offset + HEADER_SIZE + t.loc.length) for t in tickets]
    assert [s[0] for s in spans[1:]] == [s[1] for s in spans[:-1]]  # back to back
    return spans


def large_blocks(spans: list[tuple[int, int]]) -> list[int]:
    """Every block a large record touches: its direct writes' blocks and the one it ends in."""
    blocks: set[int] = set()
    for start, end in spans:
        if end - start - HEADER_SIZE >= LARGE_RECORD:
            blocks.update(range(start // ALIGN, (end - 1) // ALIGN + 1))
    return sorted(blocks)


def tear(directory: Path, lost: list[int]) -> None:
    """The crash: these blocks never reached the disk."""
    with open(directory / segment_name(1), "r+b") as f:
        for block in lost:
            f.seek(block * ALIGN)
            f.write(bytes(ALIGN))


@pytest.mark.parametrize("seed", range(12))
def test_only_records_with_every_byte_on_disk_come_back(open_journal, tmp_path: Path,
                                                         seed: int) -> None:
    payloads = batch_payloads()
    spans = written(open_journal, tmp_path / "whole", payloads)
    rng = random.Random(seed)
    blocks = large_blocks(spans)
    # the tail blocks (a large record's end, the next one's start) alone, then any subset
    tails = sorted({(end - 1) // ALIGN for (start, end) in spans
                    if end - start - HEADER_SIZE >= LARGE_RECORD})
    lost = tails if seed == 0 else sorted(rng.sample(blocks, rng.randrange(1, len(blocks))))
    torn = tmp_path / "torn"
    shutil.copytree(tmp_path / "whole", torn)
    tear(torn, lost)

    intact = [p for p, (start, end) in zip(payloads, spans, strict=True)
              if not any(start // ALIGN <= b <= (end - 1) // ALIGN for b in lost)]
    assert len(intact) < len(payloads)
    again = open_journal(torn, segment_bytes=SEGMENT)
    assert [p for _, p, _ in again.records] == intact
    report = again.journal.report
    assert report is not None and report.dropped, "what was dropped is logged"

    later = [os.urandom(LARGE_RECORD + 123), os.urandom(50), os.urandom(LARGE_RECORD)]
    tickets = [again.journal.append(1, p) for p in later]
    again.watch.wait(tickets[-1].seq)
    assert not again.watch.failed
    again.journal.close()
    last = open_journal(torn, segment_bytes=SEGMENT, start=False)
    assert [p for _, p, _ in last.records] == intact + later



REUSED_SEGMENT = 4 << 20


def in_a_reused_file(open_journal: Any, directory: Path, payloads: list[bytes]
                     ) -> tuple[int, list[bytes], list[tuple[int, int]], bytes]:
    """``payloads`` as one batch into a segment made from a reclaimed file (segment reuse,
    on by default), after one record written there first: (that segment, its records, their
    spans, the file's earlier contents)."""
    opened = open_journal(directory, segment_bytes=REUSED_SEGMENT,
                          recycle_bytes=4 * REUSED_SEGMENT)
    journal, watch = opened.journal, opened.watch
    old = [journal.append(1, os.urandom(200 << 10), holds=1) for _ in range(45)]
    watch.wait(old[-1].seq)
    for ticket in old:
        journal.release(ticket.loc)
    assert journal.reclaim(), "old segments reclaimed"
    for _ in range(2):  # the writer keeps reclaimed files as spares in its turn
        watch.wait(journal.append(9, b"").seq)
    spares = {p.stat().st_ino: p for p in directory.glob("*.spare")}  # a rename keeps the inode
    earlier = {ino: p.read_bytes() for ino, p in spares.items()}
    assert earlier, "a reclaimed file kept for reuse"
    start = old[-1].loc.segment
    while True:  # records up to the first one in a segment made from a spare (the one after
        first = os.urandom(100 << 10)  # ``start`` may have been made new before there were any)
        before = journal.append(1, first)
        watch.wait(before.seq)
        if (before.loc.segment != start
                and (directory / segment_name(before.loc.segment)).stat().st_ino in earlier):
            break
        assert before.loc.segment < start + 4, "no segment was made from a spare"
    segment = before.loc.segment
    journal.wake_on_append = False
    tickets = [journal.append(1, p) for p in payloads]
    journal.kick()
    watch.wait(tickets[-1].seq)
    assert not watch.failed and all(t.loc.segment == segment for t in tickets)
    journal.close()
    # the writer may have made the next segment from another spare already: this one's file
    made_from = (directory / segment_name(segment)).stat().st_ino
    assert made_from in earlier, "the segment was made from a spare"
    spans = [(t.loc.offset, t.loc.offset + HEADER_SIZE + t.loc.length)
             for t in [before, *tickets]]
    return segment, [first, *payloads], spans, earlier[made_from]


@pytest.mark.parametrize("seed", range(6))
def test_in_a_reused_file_what_did_not_land_is_the_old_contents_and_never_comes_back(
        open_journal, tmp_path: Path, seed: int) -> None:
    """The blocks a torn write left hold the file's earlier life (records of an older
    segment), not zeros: still exactly the intact new records come back, none of the old."""
    directory = tmp_path / "j"
    segment, payloads, spans, earlier = in_a_reused_file(open_journal, directory,
                                                         batch_payloads())
    rng = random.Random(seed)
    blocks = large_blocks(spans[1:])
    lost = sorted(rng.sample(blocks, rng.randrange(1, len(blocks))))
    assert any(earlier[b * ALIGN:(b + 1) * ALIGN].count(0) < ALIGN for b in lost)
    with open(directory / segment_name(segment), "r+b") as f:
        for block in lost:
            f.seek(block * ALIGN)
            f.write(earlier[block * ALIGN:(block + 1) * ALIGN])
    intact = [p for p, (start, end) in zip(payloads, spans, strict=True)
              if not any(start // ALIGN <= b <= (end - 1) // ALIGN for b in lost)]
    assert len(intact) < len(payloads)
    again = open_journal(directory, segment_bytes=REUSED_SEGMENT,
                         recycle_bytes=4 * REUSED_SEGMENT, start=False)
    assert [p for _, p, loc in again.records if loc.segment == segment] == intact
