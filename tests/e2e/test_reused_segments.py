"""Spec of reused journal files between users: what one user sends never becomes a record of
the log, not even once the file it lay in is reused as a later segment.

A record's header checksum is seeded with its segment number and offset, and a spare file
always becomes a number above every one it had, so the records of its earlier life never check
out again (storage/recycle.py). But a message body is bytes its sender chose: a sender who
knows the (open) record layout can write into a body a record for the number and offset its
bytes will have once the file is reused. The checksums are keyed with the journal's secret
(storage/headerkey.py), which no user sees, so her record checks out under no seeds she can
know: the restart's scan resynchronises over it, after a clean stop or a crash alike.

``mallory`` may write only ``/queue/m.>`` and ``alice`` only ``/queue/a.>``. The spec reads the
journal's files to place mallory's record where the spec's own probe says her body will lie
and checks that it did: an attacker has to guess that layout, which on a quiet broker is
deterministic; the guarantee must not rest on her not guessing.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from accounts import NEIGHBOUR_RULES, NEIGHBOURS
from stomp_helpers import connect, send_with_receipt

from sluice_testing import eventually, held
from sluicemq import ClientError
from sluicemq.storage import records
from sluicemq.storage.headerkey import open_key
from sluicemq.storage.recycle import spare_name
from sluicemq.storage.segment import (
    HEADER_SIZE,
    REUSED,
    check_record,
    encode_header,
    scan,
    segment_name,
)

ACCOUNTS, RULES = NEIGHBOURS, NEIGHBOUR_RULES
CONFIG = """
[journal]
segment_bytes = 65536
recycle_bytes = 1048576
store_delay_ms = 0
""" + ACCOUNTS.config(RULES, delay=0.1, max_failures=10)

BODY = 6000  # ten records a 64 KiB segment
AT = 1000  # where in her body mallory's record lies
REUSED_AS = 4  # the number segment 1's file gets: the writer entering segment 2 made 3 ahead
# (no spare yet), entering 3 it makes 4 from the first spare


def seeds_of(journal: Path, segment: int) -> tuple[int, int]:
    """The segment's checksum seeds, from the journal's key file: the spec reads it to find
    the records, mallory never can."""
    key = open_key(journal)
    assert key is not None and key.keyed(segment)
    return key.seeds(segment)


def record_of(journal: Path, segment: int, marker: bytes) -> tuple[int, int, int]:
    """(offset, body offset, end) of the record in ``segment`` whose body starts with
    ``marker``."""
    buf = (journal / segment_name(segment)).read_bytes()
    seeds = seeds_of(journal, segment)
    for _rtype, payload, _segment, offset in scan(buf, segment, [], seeds=seeds):
        at = payload.find(marker)
        if at >= 0:
            return offset, offset + HEADER_SIZE + at, offset + HEADER_SIZE + len(payload)
    raise AssertionError(f"no record of segment {segment} holds {marker!r}")


def first_record_written(journal: Path, segment: int) -> bool:
    path = journal / segment_name(segment)
    return path.exists() and not isinstance(
        check_record(path.read_bytes(), segment, 0, seeds=seeds_of(journal, segment)), str)


def forged_record(position: int) -> bytes:
    """A MSG record for alice's queue laid out for ``position`` of segment REUSED_AS (its
    message id above any the broker gives: replay would keep it as a message of its own), with
    the checksums of a journal without a key: the best mallory, who never sees the journal's
    key, can compute (any other guess is as good, right once in 2^64)."""
    payload = records.encode_message("q:a.inbox", 1 << 60, int(time.time() * 1000), 0, 4,
                                     {}, b"forged by mallory")
    return encode_header(records.MSG, payload, REUSED_AS, position, flags=REUSED,
                         seeds=(0, 0)) + payload


def log_end(journal: Path, segment: int, before: int) -> int:
    """Where the segment's records end, counting only records that start before ``before``."""
    buf = (journal / segment_name(segment)).read_bytes()
    found = scan(buf, segment, [], seeds=seeds_of(journal, segment))
    return max(off + HEADER_SIZE + len(payload) for _rtype, payload, _seg, off in found
               if off < before)


@pytest.mark.parametrize(("where", "stop"), [("beyond the log's end", "stop"),
                                             ("at the log's end", "stop"),
                                             ("at the log's end", "crash")])
def test_a_body_written_as_a_record_for_the_reused_file_never_becomes_one(
        broker_factory: Any, where: str, stop: str) -> None:
    """Mallory's record lies in the reused file beyond where segment 4's records end, or right
    where they end (she sized her last message so: the exact next number and offset): after a
    clean stop, or a kill -9 that leaves it in place, and a start, alice's queue holds what
    alice sent, nothing else."""
    broker = broker_factory(config_text=CONFIG)
    journal = broker.data_dir / "journal"
    with ACCOUNTS.login(broker, "mallory") as mallory, pytest.raises(ClientError):
        mallory.send("/queue/a.inbox", b"not hers to write")

    conn, listener = connect(broker, headers={"login": "mallory", "passcode": "m-pw"})
    sent = 0

    def send(body: bytes) -> None:
        nonlocal sent
        sent += 1
        send_with_receipt(conn, listener, "/queue/m.q", body, f"r{sent:04d}", persistent="true")

    def fill_into(segment: int) -> None:
        while not first_record_written(journal, segment):
            send(b"fill".ljust(BODY, b"."))

    send(b"probe".ljust(BODY, b"."))
    offset, body, end = record_of(journal, 1, b"probe")
    position = end + (body - offset) + AT  # the next body of this size, AT bytes in
    forged = forged_record(position)
    send(b"craft".ljust(AT, b".") + forged.ljust(BODY - AT, b"."))
    assert record_of(journal, 1, b"craft")[1] == position - AT, "the probe's layout held"
    fill_into(2)
    with ACCOUNTS.login(broker, "mallory") as mallory:
        assert len(held(mallory, "/queue/m.q")) == sent  # consumed: segment 1 reclaimed
    eventually(lambda: (journal / spare_name(1)).exists(), "segment 1's file kept as a spare")
    with ACCOUNTS.login(broker, "alice") as alice:
        alice.send("/queue/a.inbox", b"mine")
    fill_into(3)
    fill_into(4)
    reused = (journal / segment_name(REUSED_AS)).read_bytes()
    assert reused[position:position + len(forged)] == forged, "her record lies in segment 4"
    if where == "at the log's end":
        records_end = log_end(journal, REUSED_AS, position)
        send(b"last".ljust(position - records_end - (body - offset), b"."))
        assert log_end(journal, REUSED_AS, position) == position, "the probe's layout held"
    conn.disconnect()

    if stop == "crash":
        broker.kill()
        data = (journal / segment_name(REUSED_AS)).read_bytes()
        assert data[position:position + len(forged)] == forged, "no seal: it lies at the end"
    else:
        broker.stop()
    broker.restart()
    with ACCOUNTS.login(broker, "alice") as alice:
        assert held(alice, "/queue/a.inbox") == [b"mine"]
