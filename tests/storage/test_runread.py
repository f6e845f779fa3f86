"""Spec: runs of MSG records read straight into columns (what a column batch of a backlog uses).

Every record is still verified - magic, type, length, payload checksum and the message id the
index expects - so a corrupted or misplaced record fails the read instead of reaching a reader.
"""

from __future__ import annotations

import threading

import pytest

from sluicemq.errors import StorageError
from sluicemq.storage import records, runread


def message(mid: int, body: bytes, **headers: str) -> bytes:
    return records.encode_message("q:orders", mid, 1000 + mid, 0, 4, headers, body)


def locs_of(tickets) -> list[tuple[int, int, int]]:
    return [(t.loc.segment, t.loc.offset, t.loc.length) for t in tickets]


def test_a_run_reads_as_timestamps_expiries_headers_and_bodies(open_journal) -> None:
    opened = open_journal(segment_bytes=16 << 10)  # several segments: several spans
    bodies = [b"body %d " % i * (i % 7) for i in range(1, 301)]
    tickets = [opened.journal.append(records.MSG, message(i, b, n=str(i)))
               for i, b in enumerate(bodies, 1)]
    opened.watch.wait(tickets[-1].seq)
    ts, exp, heads, got = runread.message_columns(opened.journal, locs_of(tickets),
                                                  list(range(1, 301)))
    assert [bytes(b) for b in got] == bodies
    assert ts == [1000 + i for i in range(1, 301)]
    assert exp == [0] * 300
    assert [bytes(h) for h in heads] == [records.encode_headers({"n": str(i)})
                                         for i in range(1, 301)]


def test_records_still_in_memory_are_read_from_there(open_journal) -> None:
    opened = open_journal(start=False)
    gate = threading.Event()
    opened.journal.start(lambda seq: gate.wait(10), opened.watch.on_failed)
    first = opened.journal.append(records.MSG, message(1, b"written"))
    queued = [opened.journal.append(records.MSG, message(i, b"queued")) for i in (2, 3)]
    try:
        _ts, _exp, _heads, got = runread.message_columns(
            opened.journal, locs_of([first, *queued]), [1, 2, 3])
        assert [bytes(b) for b in got] == [b"written", b"queued", b"queued"]
    finally:
        gate.set()


def test_a_corrupted_body_byte_fails_the_read(open_journal) -> None:
    opened = open_journal()
    tickets = [opened.journal.append(records.MSG, message(i, b"precious %d" % i))
               for i in (1, 2, 3)]
    opened.watch.wait(tickets[-1].seq)
    with open(opened.journal.segment_path(1), "r+b") as fh:
        fh.seek(opened.journal.payload_offset(tickets[1].loc) + tickets[1].loc.length - 2)
        fh.write(b"X")
    with pytest.raises(StorageError, match="message 2"):
        runread.message_columns(opened.journal, locs_of(tickets), [1, 2, 3])


def test_a_record_that_is_not_the_expected_message_fails_the_read(open_journal) -> None:
    opened = open_journal()
    tickets = [opened.journal.append(records.MSG, message(i, b"m")) for i in (1, 2)]
    other = opened.journal.append(records.ACK, records.encode_acks([("q:orders", 1)]))
    opened.watch.wait(other.seq)
    with pytest.raises(StorageError, match="message 2"):  # an index pointing one record off
        runread.message_columns(opened.journal, locs_of([tickets[0], other]), [1, 2])


def test_a_record_shared_by_another_seq_is_checked_whole_and_read(open_journal) -> None:
    opened = open_journal()
    ticket = opened.journal.append(records.MSG, message(7, b"fanned out"))
    opened.watch.wait(ticket.seq)
    _ts, _exp, _heads, got = runread.message_columns(opened.journal, locs_of([ticket]), [70])
    assert [bytes(b) for b in got] == [b"fanned out"]
