"""Spec: kill -9 at random moments never loses or corrupts a stream whose final chunk got a
receipt; both ends resume instead of starting over.

The short CI version of bench/torture_streams.py (whose engine this runs): a few cycles with
three producers sending files of 0 B to 3 MiB in 64 KiB chunks and four consumers on two
queues saving into shared inboxes. The producers' and consumers' own ledgers decide.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from sluicemq.client import Client
from sluicemq.client.files import save_stream
from torture_streams import Settings, broker_problems, leftover_parts, run

CHUNK = 64 * 1024


def test_acknowledged_streams_arrive_whole_despite_repeated_kill_9(
        broker_factory: Any, tmp_path: Path) -> None:
    broker = broker_factory(["--console-port", "off", "--ws-port", "off"])
    verdict = run(broker, tmp_path, Settings(cycles=5, seed=7, drain_timeout=25))
    report = verdict.summary()
    print(report)
    assert verdict.acknowledged >= 10, report  # the run did real work
    assert verdict.corrupt == [], report
    assert verdict.lost == [], report
    assert verdict.consumer_errors["integrity"] == 0, report
    assert verdict.resent_streams + verdict.resumed_deliveries > 0, report  # crashes hit streams
    assert broker_problems(broker.log()) == []
    print(f"{len(leftover_parts(tmp_path))} leftover part files")
    # Dead letters and "cannot-resume" errors come from the lost-final-ACK case specified
    # below; both should be zero once it is fixed.


def test_a_saved_file_survives_a_crash_that_ate_its_final_ack(
        broker_factory: Any, tmp_path: Path) -> None:
    """The crash loop's most frequent consumer error, made deterministic.

    ACK frames carry no receipt, so `save_stream` cannot know the broker journaled the final
    chunk's ACK; yet it deletes the `.done` marker as soon as it returned. Freezing the broker
    (SIGSTOP) between the last bytes and that ACK, then kill -9, loses the ACK: the broker
    rightly redelivers the tail as a resumed delivery, and the next consumer must accept it
    against the already renamed file, not refuse it ("cannot resume") until it is dead-lettered.
    """
    broker = broker_factory(["--console-port", "off", "--ws-port", "off"])
    data = os.urandom(3 * CHUNK + 11)
    inbox = tmp_path / "inbox"
    with Client(broker.url) as c:
        with c.stream_writer("/queue/lost-ack", name="f.bin", chunk_size=CHUNK) as w:
            w.write(data)

        def freeze_at_the_end(done: int, total: int | None) -> None:
            if done == len(data):
                # The earlier chunks' ACKs went out on this connection before this SEND, so
                # its receipt comes once they are journaled (a receipt waits for everything
                # appended before it); the final ACK will not be.
                c.send("/queue/lost-ack.barrier", persistent=False)
                os.kill(broker.pid, signal.SIGSTOP)

        stream = next(c.streams("/queue/lost-ack", timeout=60))
        saved = save_stream(stream, inbox, progress=freeze_at_the_end)
        broker.kill()
    assert saved.read_bytes() == data
    broker.restart()
    with Client(broker.url) as c:
        again = c.receive_file("/queue/lost-ack", inbox, timeout=60)
    assert again == saved
    assert saved.read_bytes() == data
