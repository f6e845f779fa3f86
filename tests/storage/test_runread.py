"""Spec: runs of MSG records read straight into columns (what a column batch of a backlog uses).

Every record is still verified - magic, type, length, payload checksum and the message id the
index expects - so a corrupted or misplaced record fails the read instead of reaching a reader.
"""

from __future__ import annotations

import numpy as np
import pytest

from sluicemq.errors import StorageError
from sluicemq.storage import records, runread


def message(mid: int, body: bytes, **headers: str) -> bytes:
    return records.encode_message("q:orders", mid, 1000 + mid, 0, 4, headers, body)


def read_run(journal, tickets, mids: list[int]) -> runread.RunColumns:
    """``message_columns`` over the records of ``tickets``, which the index holds as ``mids``."""
    return runread.message_columns(
        journal, np.array(mids, np.uint64), np.array([t.loc.segment for t in tickets], np.uint32),
        np.array([t.loc.offset for t in tickets], np.uint64),
        np.array([t.loc.length for t in tickets], np.uint32))


def cut(joined: bytes, lengths) -> list[bytes]:
    ends = np.cumsum(lengths).tolist()
    return [joined[a:b] for a, b in zip([0, *ends], ends, strict=False)]


def test_a_run_reads_as_timestamps_expiries_headers_and_bodies(open_journal) -> None:
    opened = open_journal(segment_bytes=16 << 10)  # several segments: several spans
    bodies = [b"body %d " % i * (i % 7) for i in range(1, 301)]
    tickets = [opened.journal.append(records.MSG, message(i, b, n=str(i)))
               for i, b in enumerate(bodies, 1)]
    opened.watch.wait(tickets[-1].seq)
    run = read_run(opened.journal, tickets, list(range(1, 301)))
    assert cut(run.bodies, run.body_lengths) == bodies
    assert run.timestamps.tolist() == [1000 + i for i in range(1, 301)]
    assert run.expires.tolist() == [0] * 300
    assert cut(run.headers, run.header_lengths) == [records.encode_headers({"n": str(i)})
                                                    for i in range(1, 301)]


def test_records_naming_their_senders_read_the_same_beside_anonymous_ones(
        open_journal) -> None:
    """A record with its sender's login before the key (``OWNER_FLAG``, security on) gives
    the same columns: the login is skipped, whatever its length, record by record."""
    opened = open_journal()
    logins = ["", "alice", "", "b" * 300, "ünïcode"]
    tickets = [opened.journal.append(records.MSG, records.encode_message(
        "q:orders", i, 1000 + i, 0, 4, {"n": str(i)}, b"body %d" % i,
        records.encode_owner(login) if login else b""))
        for i, login in enumerate(logins, 1)]
    opened.watch.wait(tickets[-1].seq)
    run = read_run(opened.journal, tickets, [1, 2, 3, 4, 5])
    assert cut(run.bodies, run.body_lengths) == [b"body %d" % i for i in range(1, 6)]
    assert cut(run.headers, run.header_lengths) == [records.encode_headers({"n": str(i)})
                                                    for i in range(1, 6)]
    assert run.timestamps.tolist() == [1000 + i for i in range(1, 6)]


def test_records_far_apart_are_read_in_several_extents_and_still_in_order(
        open_journal) -> None:
    opened = open_journal()
    filler = b"f" * (100 << 10)  # more than the gap one read bridges
    ours = []
    for i in range(1, 6):
        ours.append(opened.journal.append(records.MSG, message(i, b"ours %d" % i)))
        last = opened.journal.append(records.MSG, message(100 + i, filler))
    opened.watch.wait(last.seq)
    run = read_run(opened.journal, ours, [1, 2, 3, 4, 5])
    assert cut(run.bodies, run.body_lengths) == [b"ours %d" % i for i in range(1, 6)]


def test_the_oldest_record_still_on_its_way_to_the_disk_is_named(open_journal) -> None:
    """Bulk reads take records from the segment files only: the journal says where the
    records that are not written yet begin, so a reader sends those to ``Journal.read``."""
    opened = open_journal()
    journal = opened.journal
    journal.wake_on_append = False  # appended records wait for kick()
    first = journal.append(records.MSG, message(1, b"written"))
    journal.kick()
    opened.watch.wait(first.seq)
    queued = [journal.append(records.MSG, message(i, b"queued")) for i in (2, 3)]
    assert journal.unwritten_from() == (queued[0].loc.segment, queued[0].loc.offset)
    journal.kick()
    opened.watch.wait(queued[-1].seq)
    assert journal.unwritten_from() is None
    run = read_run(opened.journal, [first, *queued], [1, 2, 3])
    assert cut(run.bodies, run.body_lengths) == [b"written", b"queued", b"queued"]


def test_a_corrupted_body_byte_fails_the_read(open_journal) -> None:
    opened = open_journal()
    tickets = [opened.journal.append(records.MSG, message(i, b"precious %d" % i))
               for i in (1, 2, 3)]
    opened.watch.wait(tickets[-1].seq)
    with open(opened.journal.segment_path(1), "r+b") as fh:
        fh.seek(opened.journal.payload_offset(tickets[1].loc) + tickets[1].loc.length - 2)
        fh.write(b"X")
    with pytest.raises(StorageError, match="message 2"):
        read_run(opened.journal, tickets, [1, 2, 3])


def test_a_record_that_is_not_the_expected_message_fails_the_read(open_journal) -> None:
    opened = open_journal()
    tickets = [opened.journal.append(records.MSG, message(i, b"m")) for i in (1, 2)]
    other = opened.journal.append(records.ACK, records.encode_acks([("q:orders", 1)]))
    opened.watch.wait(other.seq)
    with pytest.raises(StorageError, match="message 2"):  # an index pointing one record off
        read_run(opened.journal, [tickets[0], other], [1, 2])


def test_a_record_shared_by_another_seq_is_checked_whole_and_read(open_journal) -> None:
    opened = open_journal()
    ticket = opened.journal.append(records.MSG, message(7, b"fanned out"))
    opened.watch.wait(ticket.seq)
    run = read_run(opened.journal, [ticket], [70])
    assert run.bodies == b"fanned out"


def test_a_read_buffer_is_reused_only_once_nothing_refers_to_it(open_journal) -> None:
    """Extents are read into kept buffers (no page faults and munmap per read), but a buffer
    a transport still holds a view of is never overwritten: the next read gets another."""
    opened = open_journal()
    tickets = [opened.journal.append(records.MSG, message(i, b"m%d" % i)) for i in (1, 2)]
    opened.watch.wait(tickets[-1].seq)
    loc0, loc1 = tickets[0].loc, tickets[1].loc
    end0 = loc0.offset + 16 + loc0.length
    first = opened.journal.read_extent(loc0.segment, loc0.offset, end0)
    buffer = first.obj
    held = first[16:]  # as a transport holds a piece until it is written
    del first
    second = opened.journal.read_extent(loc1.segment, loc1.offset, loc1.offset + 16 + loc1.length)
    assert second.obj is not buffer
    assert bytes(held) == records.encode_message("q:orders", 1, 1001, 0, 4, {}, b"m1")
    del held, second
    third = opened.journal.read_extent(loc0.segment, loc0.offset, end0)
    assert third.obj is buffer  # nothing refers to it any more: reused


def test_when_every_kept_buffer_is_held_a_read_gets_a_fresh_one_of_its_own_size(
        open_journal) -> None:
    """At most a few buffers are kept, each sized to the reads that used it (a MiB here, not
    the largest extent a read may cover): memory stays small however many readers lag."""
    from sluicemq.storage.journal_reads import EXTENTS_KEPT

    opened = open_journal()
    ticket = opened.journal.append(records.MSG, message(1, b"m1"))
    opened.watch.wait(ticket.seq)
    loc = ticket.loc
    end = loc.offset + 16 + loc.length
    held = [opened.journal.read_extent(loc.segment, loc.offset, end)
            for _ in range(EXTENTS_KEPT + 2)]
    kept = [view.obj for view in held[:EXTENTS_KEPT]]
    assert all(isinstance(b, bytearray) and len(b) == 1 << 20 for b in kept)
    assert all(isinstance(view.obj, bytes) for view in held[EXTENTS_KEPT:])
    assert len({id(b) for b in kept}) == EXTENTS_KEPT
    assert all(bytes(view) == bytes(held[0]) for view in held)
