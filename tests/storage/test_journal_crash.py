"""Spec of crash safety: after kill -9 at any moment, every record reported durable is there."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sluicemq.storage.journal import Journal

# A producer that numbers its records across restarts (id = last recovered id + seq) and
# prints "D <id>" the moment on_durable covers that id, i.e. when a broker would RECEIPT it.
# It keeps at most ~256 records unwritten, woken by the writer's report rather than polling.
# Run as "recycle" it writes on a journal that reuses reclaimed segments' files: it holds each
# record (holds=1) and lets go of all but its last 300, so segments are reclaimed, kept as
# spares and written again while it is killed. Run as "stream", it does so with a stream's
# records: half of them large (256 KiB to 2.3 MiB: written with O_DIRECT, some in more than one
# piece), the other half small ones sharing blocks with them, at most 8 ahead, its last 40 held.
PRODUCER = r"""
import os, random, sys, threading
from pathlib import Path
from sluicemq.storage.journal import Journal

recycle, stream = sys.argv[2] != "plain", sys.argv[2] == "stream"
journal = Journal(Path(sys.argv[1]), **JOURNALS[sys.argv[2]])
every, ahead, keep = (4, 8, 40) if stream else (64, 256, 300)
base, held = 0, []
for _, payload, loc in journal.recover():
    base = int(payload[:12])
    if recycle:
        held.append(loc)
for loc in held:
    journal.retain(loc)
reported = threading.Condition()

def durable(seq):
    os.write(1, b"D %d\n" % (base + seq))
    with reported:
        reported.notify()

journal.start(durable, lambda first, last, exc: os.write(1, b"F %r\n" % exc))
rng = random.Random(base)
seq = 0
while True:
    seq += 1
    size = rng.randrange(4000)
    if stream and rng.random() < 0.5:
        size = rng.randrange(256 << 10, 2300 << 10)
    payload = b"%012d" % (base + seq) + os.urandom(size)
    ticket = journal.append(1 + seq % 200, payload, holds=int(recycle))
    if recycle:
        held.append(ticket.loc)
    if seq % every == 0:
        with reported:
            reported.wait_for(lambda: journal.durable_seq >= seq - ahead)
        if recycle:
            for loc in held[:-keep]:
                journal.release(loc)
            del held[:-keep]
            journal.reclaim()
"""
JOURNALS = {"plain": {"segment_bytes": 128 << 10},
            "recycle": {"segment_bytes": 128 << 10, "recycle_bytes": 4 << 20},
            "stream": {"segment_bytes": 8 << 20, "recycle_bytes": 32 << 20}}


def run_and_kill(directory: Path, rng: random.Random, mode: str = "plain") -> list[int]:
    """Start the producer (``mode`` plain or recycle), kill -9 it at a random moment; the
    ids it reported durable."""
    program = f"JOURNALS = {JOURNALS!r}\n{PRODUCER}"
    proc = subprocess.Popen([sys.executable, "-c", program, str(directory), mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    first = proc.stdout.readline()  # wait until it is really writing
    assert first.startswith(b"D "), first + proc.stderr.read() if proc.stderr else b""
    time.sleep(rng.uniform(0.05, 0.6))  # the moment of the kill is what is under test
    os.kill(proc.pid, signal.SIGKILL)
    rest, _ = proc.communicate(timeout=30)
    lines = (first + rest).decode().splitlines()
    assert not [line for line in lines if line.startswith("F ")]
    return [int(line.split()[1]) for line in lines if line.startswith("D ")]


def recovered_ids(directory: Path) -> list[int]:
    journal = Journal(directory, segment_bytes=128 << 10)
    ids = [int(payload[:12]) for _, payload, _ in journal.recover()]
    journal.close()
    return ids


def test_every_record_reported_durable_survives_kill_9(tmp_path: Path) -> None:
    rng = random.Random(20240611)
    promised = 0
    for _ in range(4):  # each round recovers what the previous one left, then is killed too
        printed = run_and_kill(tmp_path, rng)
        assert printed == sorted(printed) and printed, "on_durable must be monotonic"
        promised = max(promised, printed[-1])
        ids = recovered_ids(tmp_path)
        assert ids == list(range(1, len(ids) + 1)), "records are recovered in order, no gaps"
        assert len(ids) >= promised, f"durable id {promised} lost; recovered {len(ids)}"
    assert len(list(tmp_path.glob("*.log"))) > 2  # the rounds crossed segment boundaries


@pytest.mark.parametrize(("mode", "held"), [("recycle", 300), ("stream", 40)])
def test_kill_9_while_writing_into_reused_segment_files_loses_nothing_held(
        tmp_path: Path, mode: str, held: int) -> None:
    """Also with a stream's large records written directly (``storage/direct.py``)."""
    rng = random.Random(20261126)
    promised, stale, large = 0, 0, 0
    for _ in range(4):
        printed = run_and_kill(tmp_path, rng, mode)
        assert printed == sorted(printed) and printed, "on_durable must be monotonic"
        promised = max(promised, printed[-1])
        journal = Journal(tmp_path, **JOURNALS[mode])
        records = [bytes(payload) for _, payload, _ in journal.recover()]
        journal.close()
        ids = [int(payload[:12]) for payload in records]
        large += sum(len(payload) >= 256 << 10 for payload in records)
        assert journal.report is not None
        stale += journal.report.stale_bytes
        assert ids == list(range(ids[0], ids[0] + len(ids))), "in order, no gaps, no old ones"
        assert ids[-1] >= promised, f"durable id {promised} lost; recovered up to {ids[-1]}"
        # the producer lets go only of records older than its last `held` appended, so the last
        # `held` durable ones are all kept (fewer when it was killed before writing that many)
        assert ids[0] <= max(1, promised - held + 1), f"held records before id {promised} lost"
    if mode == "stream":  # (how many files are spares when it is killed is the moment's)
        assert large, "large records were written, and recovered"
        return
    assert stale > 0, "files were reused: earlier records lay after their segments' last"
    assert list(tmp_path.glob("*.spare"))
