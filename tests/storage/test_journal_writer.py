"""Spec of what the journal writer leaves in the page cache once a batch is durable.

A large record (a stream chunk) gives its cached pages back as soon as it is durable - fresh
page cache for every chunk cost the writer most of its time (``journal_writer.drop_cached``);
a small record keeps its pages, so reading a backlog of small messages back stays a memory
copy. Residency is read with ``mincore(2)`` on a private read-only mapping of the segment; on a
filesystem that ignores the advice (tmpfs) there is nothing to see, and the spec says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from pathlib import Path

import pytest

from sluicemq.storage.journal_writer import FOLIO, LARGE_RECORD, drop_cached
from sluicemq.storage.segment import HEADER_SIZE

PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def resident_pages(path: Path, start: int, end: int) -> int:
    """How many of the whole pages inside ``start:end`` of ``path`` are in the page cache."""
    first, last = -(-start // PAGE), end // PAGE
    if last <= first:
        return 0
    with path.open("rb") as fh:
        mapped = mmap.mmap(fh.fileno(), (last - first) * PAGE, access=mmap.ACCESS_COPY,
                           offset=first * PAGE)
    anchor = ctypes.c_char.from_buffer(mapped)  # the mapping's address, for as long as held
    try:
        vec = (ctypes.c_ubyte * (last - first))()
        if _libc.mincore(ctypes.byref(anchor), ctypes.c_size_t(len(mapped)), vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore")
        return sum(v & 1 for v in vec)
    finally:
        del anchor  # the mapping cannot close while a ctypes object views it
        mapped.close()


@pytest.fixture
def drops_cache(tmp_path: Path) -> None:
    """Skip where the filesystem keeps its cache in spite of the advice (tmpfs does)."""
    probe = tmp_path / "probe"
    fd = os.open(probe, os.O_RDWR | os.O_CREAT)
    try:
        os.pwrite(fd, os.urandom(16 * PAGE), 0)
        os.fdatasync(fd)
        drop_cached(fd, 0, 16 * PAGE)
    finally:
        os.close(fd)
    if resident_pages(probe, 0, 16 * PAGE) != 0:
        pytest.skip("this filesystem keeps written pages cached whatever the advice")


def test_a_stream_of_large_records_leaves_the_page_cache_once_durable(
    open_journal, drops_cache
) -> None:
    """All but the folios at its two ends (at most 2 MiB each) - they may hold other bytes."""
    opened = open_journal(segment_bytes=32 << 20)
    payloads = [os.urandom(LARGE_RECORD + 5000 * k) for k in range(40)]
    tickets = []
    for payload in payloads:
        tickets.append(opened.journal.append(1, payload))
        opened.watch.wait(tickets[-1].seq)  # one durable batch after the other
    first, last = tickets[0].loc, tickets[-1].loc
    assert first is not None and last is not None and first.segment == last.segment
    span = (first.offset, last.offset + HEADER_SIZE + last.length)
    assert span[1] - span[0] > 10 << 20
    assert resident_pages(opened.journal.segment_path(first.segment), *span) <= 2 * FOLIO // PAGE
    assert [opened.journal.read(t.loc) for t in tickets] == payloads  # read from the disk


def test_small_records_keep_their_page_cache(open_journal, drops_cache) -> None:
    opened = open_journal(segment_bytes=8 << 20)
    tickets = [opened.journal.append(1, os.urandom(1000)) for _ in range(64)]
    opened.watch.wait(tickets[-1].seq)
    first, last = tickets[0].loc, tickets[-1].loc
    assert first is not None and last is not None
    path = opened.journal.segment_path(first.segment)
    span = (first.offset, last.offset + HEADER_SIZE + last.length)
    assert resident_pages(path, *span) == (span[1] // PAGE) - (-(-span[0] // PAGE))
