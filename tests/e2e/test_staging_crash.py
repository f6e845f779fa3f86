"""Staged publishing under kill -9 at random moments: whatever the broker confirmed stays, and
every batch ends up visible exactly once (a coordinator that retries until it gets an answer) -
for parts of plain SENDs (spooled until COMMIT) and of column batches (journaled as they
arrive, not final until the COMMIT)."""

from __future__ import annotations

import random
import threading
from collections import Counter

import pytest

from sluice_testing import stored
from sluicemq import Client, ClientError
from sluicemq.protocol.columns import ColumnWriter

PARTS = ("p0", "p1", "p2")
LISTED = ["p2", "p0"]  # p1 plays the failed task: never published
PER_PART = 3


def body(batch: int, part: str, i: int) -> str:
    return f"b{batch}/{part}/{i}"


def stage_and_publish(url: str, batch: int, confirmed: dict[int, tuple[str, int]],
                      columns: bool) -> None:
    with Client(url, timeout=5) as c:
        for part in PARTS:
            with c.stage("crash", batch, part) as p:
                if columns:  # two column batches: a part of several records
                    for rows in (range(PER_PART - 1), range(PER_PART - 1, PER_PART)):
                        w = ColumnWriter()
                        for i in rows:
                            w.add(0, 0, 0, 4, 0, b"{}", body(batch, part, i).encode())
                        p.send_batch("/queue/crash", b"".join(w.finish()), len(rows))
                else:
                    for i in range(PER_PART):
                        p.send("/queue/crash", body(batch, part, i))
        confirmed[batch] = c.publish_stage("crash", batch, LISTED)


@pytest.mark.parametrize("columns", [False, True], ids=["sends", "column-batches"])
def test_kill_9_at_random_moments_never_loses_or_repeats_a_batch(broker, columns) -> None:
    rng = random.Random(7)
    confirmed: dict[int, tuple[str, int]] = {}
    batch = 0
    for _cycle in range(4):
        killer = threading.Timer(rng.uniform(0.05, 0.6), broker.kill)
        killer.start()
        try:
            while True:
                stage_and_publish(broker.url, batch, confirmed, columns)
                batch += 1
        except (ClientError, OSError):
            pass  # the broker died under us
        killer.join()
        broker.restart()
        for b, answer in confirmed.items():  # what was confirmed is remembered
            with Client(broker.url) as c:
                assert c.publish_stage("crash", b, LISTED) == ("duplicate", answer[1])
        batch += 1  # the interrupted batch keeps its number: retried below
    with Client(broker.url) as c:
        for b in range(batch):  # the coordinator's retries: every batch gets published once
            if b in confirmed:
                continue
            try:
                c.publish_stage("crash", b, LISTED)
            except ClientError:  # its parts never made it: the task would be re-run
                stage_and_publish(broker.url, b, confirmed, columns)
    seen = Counter(stored(broker.url, "/queue/crash"))
    expected = Counter(body(b, part, i) for b in range(batch) for part in LISTED
                       for i in range(PER_PART))
    assert seen == expected
    assert len(confirmed) >= 4
