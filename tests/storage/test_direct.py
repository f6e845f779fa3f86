"""Spec of large records written with O_DIRECT (``storage/direct.py``).

A large record goes to disk from one of the writer's aligned staging slots, several writes in
flight at once, covering the aligned blocks around it; what it shares a block with - the
record before it, and the log's end after it - must come out exactly as a buffered write
leaves it. Checked on the real filesystem under the test's temporary directory: every record
reads back and recovers byte for byte, in order, and the segment file holds the same bytes as
one the same records were written to buffered; a write the disk refuses fails its batch.
"""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path
from typing import Any

import pytest

from sluice_testing import tmpfs
from sluicemq.storage.direct import ALIGN, SLOT_BYTES, SLOTS, DirectWrites
from sluicemq.storage.headerkey import KEY_NAME
from sluicemq.storage.journal_writer import LARGE_RECORD
from sluicemq.storage.segment import HEADER_SIZE, segment_name


def mixed_payloads(seed: int) -> list[bytes]:
    """Small and large records, a large one right after a small one and after a large one,
    one filling a slot, one larger than a slot, one larger than all slots together."""
    rng = random.Random(seed)
    sizes = [100, LARGE_RECORD, 3000, LARGE_RECORD + 1, LARGE_RECORD + 4095, 17,
             SLOT_BYTES - HEADER_SIZE, SLOT_BYTES + 12345, 1 << 20, 1 << 20, 5,
             SLOTS * SLOT_BYTES + 999]
    sizes += [rng.choice((rng.randrange(1, 5000), rng.randrange(LARGE_RECORD, 3 << 20)))
              for _ in range(12)]
    return [os.urandom(n) for n in sizes]


def write_records(open_journal: Any, directory: Path, payloads: list[bytes], *,
                  direct: bool = True, batch: int = 1) -> Any:
    """Append the payloads ``batch`` at a time, each batch durable before the next."""
    opened = open_journal(directory, segment_bytes=64 << 20)
    opened.journal.wake_on_append = False  # a batch is what kick() hands over
    if not direct:  # the journal as it was: every record through the page cache
        opened.journal._direct = DirectWrites()
        opened.journal._direct.enabled = False
    for at in range(0, len(payloads), batch):
        tickets = [opened.journal.append(1, p) for p in payloads[at:at + batch]]
        opened.journal.kick()
        opened.watch.wait(tickets[-1].seq)
    assert not opened.watch.failed
    return opened


def test_large_records_go_direct_and_come_back_byte_for_byte(open_journal, tmp_path) -> None:
    payloads = mixed_payloads(1)
    opened = write_records(open_journal, tmp_path / "j", payloads)
    stats = opened.journal.stats
    assert stats.direct_bytes >= sum(HEADER_SIZE + len(p) for p in payloads
                                     if len(p) >= LARGE_RECORD)
    opened.journal.close()
    again = open_journal(tmp_path / "j", segment_bytes=64 << 20, start=False)
    assert [payload for _, payload, _ in again.records] == payloads
    assert again.journal.report is not None and not again.journal.report.dropped


def test_the_segment_holds_what_buffered_writes_leave(open_journal, tmp_path) -> None:
    payloads = mixed_payloads(2)
    key = None
    for name, direct in (("direct", True), ("buffered", False)):
        for batch in (1, 4):
            directory = tmp_path / f"{name}-{batch}"
            if key is not None:  # one checksum key for all four, so their bytes compare
                directory.mkdir()
                (directory / KEY_NAME).write_bytes(key)
            write_records(open_journal, directory, payloads, direct=direct,
                          batch=batch).journal.close()
            key = (directory / KEY_NAME).read_bytes()
    segment = segment_name(1)
    expected = (tmp_path / "buffered-1" / segment).read_bytes()
    end = sum(HEADER_SIZE + len(p) for p in payloads)
    assert expected[end:].count(0) == len(expected) - end  # the log's end: zeros after it
    for name in ("buffered-4", "direct-1", "direct-4"):
        assert (tmp_path / name / segment).read_bytes() == expected, name


def test_a_record_after_a_direct_one_in_the_same_block_keeps_its_bytes(open_journal,
                                                                        tmp_path) -> None:
    """Small records between large ones share blocks with them; every byte survives a
    restart, whichever way each record went out."""
    payloads = [os.urandom(LARGE_RECORD + 7), os.urandom(10), os.urandom(ALIGN - 3),
                os.urandom(LARGE_RECORD), os.urandom(1), os.urandom(LARGE_RECORD + ALIGN)]
    write_records(open_journal, tmp_path / "j", payloads).journal.close()
    again = open_journal(tmp_path / "j", segment_bytes=64 << 20, start=False)
    assert [payload for _, payload, _ in again.records] == payloads


def test_a_direct_write_that_fails_fails_its_batch_and_leaves_no_trace(
        open_journal, tmp_path: Path) -> None:
    """A full disk (a real 4 MiB tmpfs: ENOSPC, not simulated) under a stream of large records:
    the failed batch is reported failed and cut back; once there is room again the journal
    carries on, and a restart finds exactly the records reported durable."""
    with tmpfs(tmp_path / "small", "4m") as small:
        filler = small / "filler"
        filler.write_bytes(bytes(2 << 20))
        opened = open_journal(small / "j", segment_bytes=64 << 20, preallocate=False)
        journal, watch = opened.journal, opened.watch
        good: list[bytes] = []
        for _ in range(40):
            payload = os.urandom(LARGE_RECORD + 999)
            ticket = journal.append(1, payload)
            watch.wait(ticket.seq)
            if watch.failed:
                break
            good.append(payload)
        else:
            pytest.fail("the disk never filled up")
        assert good and journal.stats.direct_bytes > 0
        _first, _last, exc = watch.failed[0]
        assert isinstance(exc, OSError) and exc.errno == errno.ENOSPC
        assert ticket.loc is None

        filler.unlink()
        later = [os.urandom(LARGE_RECORD + 5), os.urandom(10), os.urandom(LARGE_RECORD)]
        tickets = [journal.append(1, p) for p in later]
        watch.wait(tickets[-1].seq)
        assert watch.high == tickets[-1].seq and len(watch.failed) == 1
        assert [journal.read(t.loc) for t in tickets] == later
        journal.close()
        again = open_journal(small / "j", segment_bytes=64 << 20, preallocate=False,
                             start=False)
        assert [p for _, p, _ in again.records] == good + later
        assert again.journal.report is not None and again.journal.report.dropped == []
        again.journal.close()


def test_records_sharing_a_block_never_overwrite_each_other_in_flight(open_journal,
                                                                      tmp_path) -> None:
    """Many large records in one batch, each starting in the block the one before it ended
    in, all written at once: every one reads back whole (in flight together, the first
    one's zeros after its end used to land over the next one's header now and then)."""
    payloads = [os.urandom(LARGE_RECORD + 1000 + 37 * k) for k in range(24)]
    opened = write_records(open_journal, tmp_path / "j", payloads, batch=24)
    opened.journal.close()
    again = open_journal(tmp_path / "j", segment_bytes=64 << 20, start=False)
    assert [payload for _, payload, _ in again.records] == payloads
