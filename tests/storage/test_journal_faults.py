"""Spec of write failures: a failed batch leaves no trace on disk, and the journal carries on."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice_testing import tmpfs
from sluicemq.storage.segment import HEADER_SIZE


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 512 KiB tmpfs, so that ENOSPC is real rather than simulated (needs root)."""
    with tmpfs(tmp_path / "small", "512k") as mnt:
        yield mnt


def leave_free(directory: Path, nbytes: int) -> Path:
    """Fill the filesystem with a file so that only about `nbytes` stay free."""
    st = os.statvfs(directory)
    filler = directory / "filler"
    filler.write_bytes(bytes(max(st.f_bavail * st.f_frsize - nbytes, 0)))
    return filler


@pytest.mark.parametrize("preallocate", [False, True])
def test_a_full_disk_fails_batches_cleanly_and_the_journal_recovers_when_space_returns(
    small_fs: Path, open_journal, preallocate: bool
) -> None:
    filler = leave_free(small_fs, 200 << 10)
    opened = open_journal(small_fs / "j", segment_bytes=64 << 10, preallocate=preallocate)
    journal, watch = opened.journal, opened.watch
    good: list[bytes] = []
    failed_tickets = []
    for _ in range(100):  # ~20 KiB per round: the disk fills within a few rounds
        chunk = [os.urandom(1000) for _ in range(20)]
        tickets = [journal.append(1, p) for p in chunk]
        watch.wait(tickets[-1].seq)
        if watch.failed:
            failed_tickets = tickets
            break
        good.extend(chunk)
    else:
        pytest.fail("the disk never filled up")
    assert good
    first, last, exc = watch.failed[0]
    assert isinstance(exc, OSError) and exc.errno == errno.ENOSPC
    assert (first, last) == (failed_tickets[0].seq, failed_tickets[-1].seq)
    assert all(t.loc is None for t in failed_tickets)
    assert journal.stats.failures == 1

    filler.unlink()
    later = [os.urandom(1000) for _ in range(30)]
    tickets = [journal.append(1, p) for p in later]
    watch.wait(tickets[-1].seq)
    assert watch.high == tickets[-1].seq and len(watch.failed) == 1
    assert [journal.read(t.loc) for t in tickets] == later
    journal.close()

    again = open_journal(small_fs / "j", segment_bytes=64 << 10, preallocate=preallocate)
    assert [p for _, p, _ in again.records] == good + later
    assert again.journal.report is not None and again.journal.report.dropped == []


def test_a_failed_fdatasync_fails_the_batch_and_cuts_it_from_the_file(
    open_journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault injection: the disk reports EIO once (the only place a syscall is faked)."""
    opened = open_journal(start=False)
    journal, watch = opened.journal, opened.watch
    gate, holding = threading.Event(), threading.Event()

    def on_durable(seq: int) -> None:
        holding.set()
        gate.wait(10)
        watch.on_durable(seq)

    journal.start(on_durable, watch.on_failed)
    kept = journal.append(1, b"kept")
    assert holding.wait(10)  # the writer now waits in on_durable(kept)
    assert journal.durable_seq == kept.seq
    doomed = [journal.append(1, b"doomed %d" % i) for i in range(5)]  # queued behind `kept`
    doomed_start = doomed[0].loc
    assert doomed_start is not None

    real = os.fdatasync
    calls: list[int] = []

    def fdatasync_failing_once(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 1:
            raise OSError(errno.EIO, "injected I/O error")
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync_failing_once)
    gate.set()
    watch.wait(doomed[-1].seq)
    assert [(a, b) for a, b, _ in watch.failed] == [(doomed[0].seq, doomed[-1].seq)]
    assert all(t.loc is None for t in doomed)
    with open(journal.segment_path(1), "rb") as fh:
        assert os.pread(fh.fileno(), HEADER_SIZE, doomed_start.offset) == bytes(HEADER_SIZE)

    after = journal.append(1, b"after")
    assert after.loc is not None  # appends continue after the last good record:
    assert (after.loc.segment, after.loc.offset) == (doomed_start.segment, doomed_start.offset)
    watch.wait(after.seq)
    assert watch.high == after.seq
    journal.close()
    again = open_journal(opened.directory)
    assert [p for _, p, _ in again.records] == [b"kept", b"after"]
    assert again.journal.report is not None and again.journal.report.dropped == []
