"""Spec: a damaged journal costs exactly the damaged records, never the broker or the rest.

Each round stores messages with receipts, stops the broker (SIGTERM or kill -9), injures one
journal file at a random place (truncation as a torn write, bit flips, a zeroed run, garbage),
restarts, and drains the round's queue. Where each message sits is found by searching the
segment files for its (unique) body, independently of the journal code; a message whose
record overlaps the injury may be gone, every other one must come back intact - in new files
and, with segment reuse on (``recycle-bytes``), in reused files alike: their checksums are keyed
(storage/headerkey.py), so recovery resynchronises past damage there too (docs/recovery.md).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from torture_engine import check_body, damage_files, make_body

from sluicemq.client import Client
from sluicemq.storage.segment import REUSED

ROUNDS = 12
PER_ROUND = 150
RECORD_SLACK = 1024  # header + stored headers in front of a body, generously
CONFIG = "[journal]\nsegment-bytes = 262144\n"
RECYCLE = "recycle-bytes = 4194304\n"
NO_RECYCLE = "recycle-bytes = 0\n"  # reuse is on by default (1 GiB): the new-files variant


def locate(files: list[Path], bodies: dict[str, bytes]) -> dict[str, tuple[Path, int, int]]:
    """Where each body's record lies: (file, start, end), the start padded by RECORD_SLACK."""
    contents = {p: p.read_bytes() for p in files}
    where = {}
    for msg_id, body in bodies.items():
        for path, data in contents.items():
            pos = data.find(body)
            if pos >= 0:
                where[msg_id] = (path, max(0, pos - RECORD_SLACK), pos + len(body))
                break
    return where


def at_risk(where: dict[str, tuple[Path, int, int]], injury: tuple[str, Path, int, int]
            ) -> set[str]:
    _kind, path, offset, nbytes = injury
    stop = offset + nbytes
    return {msg_id for msg_id, (p, start, end) in where.items()
            if p == path and start < stop and end > offset}


def reused(path: Path) -> bool:
    """Whether the segment's file held earlier segments (its first header says REUSED)."""
    with path.open("rb") as fh:
        head = fh.read(4)
    return len(head) == 4 and bool(head[3] & REUSED)


@pytest.mark.parametrize("recycle", [False, True], ids=["new-files", "reused-files"])
def test_random_journal_damage_drops_only_damaged_records(broker_factory: Any,
                                                          recycle: bool) -> None:
    rng = random.Random(2024)
    broker = broker_factory(["--console-port", "off", "--ws-port", "off"],
                            config_text=CONFIG + (RECYCLE if recycle else NO_RECYCLE))
    journal = broker.data_dir / "journal"
    recovered_total = lost_total = risk_total = reused_hits = 0
    kinds: list[str] = []
    for rnd in range(ROUNDS):
        queue = f"/queue/corrupt.{rnd}"
        bodies = {f"r{rnd}-{i}": make_body(f"r{rnd}-{i}", rng, 6000) for i in range(PER_ROUND)}
        with Client(broker.url, timeout=10) as c:
            for msg_id, body in bodies.items():
                c.send(queue, body, {"torture-id": msg_id})
        if rnd % 2:
            broker.kill()
        else:
            broker.stop()
        files = sorted(journal.glob("*.log"))
        where = locate(files, bodies)
        assert len(where) == PER_ROUND  # every receipted body is on disk
        injury = damage_files(files, rng)
        kinds.append(injury[0])
        reused_hits += reused(injury[1])
        risky = at_risk(where, injury)
        broker.restart()
        got: dict[str, int] = {}
        with Client(broker.url, timeout=10) as c:
            sub = c.subscribe(queue, ack="client-individual")
            while (msg := sub.get(1.0)) is not None:
                msg_id = check_body(msg.body)
                assert msg_id is not None, f"round {rnd}: corrupt delivery after {injury}"
                got[msg_id] = got.get(msg_id, 0) + 1
                msg.ack()
        missing = set(bodies) - set(got)
        assert missing <= risky, (f"round {rnd}: {injury[0]} at {injury[2]}+{injury[3]} of "
                                  f"{injury[1].name} lost intact {sorted(missing - risky)}")
        assert set(got) <= set(bodies)
        recovered_total += len(got)
        lost_total += len(missing)
        risk_total += len(risky)
        if missing:
            assert "journal: dropped" in broker.log()
    print(f"{ROUNDS} injuries ({', '.join(kinds)}): {recovered_total} recovered, "
          f"{lost_total} lost of {risk_total} at risk")
    assert (reused_hits > 0) == recycle  # the variant injures reused files, the other never
    assert "internal error" not in broker.log()
    assert "Traceback" not in broker.log()
