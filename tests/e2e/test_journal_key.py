"""Spec: a broker starts only on a journal.key its journal's segments were written with.

A key file copied from another broker's data directory (or made anew when a directory was
deleted and recreated under a running broker) checks out in none of the segments: the broker
refuses to start with an ERROR naming the key file and what to do, exits non-zero, and changes
nothing, so once the right key is back it recovers every message. A crash that tore the very
first write of a brand-new journal, which leaves no first record that checks out either, still
starts (storage-level cases, other segments and torn headers: tests/storage/test_headerkey.py).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from stomp_helpers import connect, send_with_receipt

from sluice_testing import BrokerProcess, RawStomp
from sluicemq.storage.headerkey import KEY_NAME
from sluicemq.storage.segment import HEADER_SIZE, segment_name

CONFIG = "[journal]\nsegment_bytes = 65536\n"  # ten 6000-byte messages a segment
BODY = 6000


def send(b: BrokerProcess, dest: str, count: int) -> list[bytes]:
    """``count`` persistent SENDs through stomp.py, each RECEIPTed: the bodies."""
    conn, listener = connect(b)
    bodies = [b"%04d " % i + bytes([65 + i % 26]) * BODY for i in range(count)]
    for i, body in enumerate(bodies):
        send_with_receipt(conn, listener, dest, body, f"r{i}", persistent="true")
    conn.disconnect()
    return bodies


def drain(b: BrokerProcess, dest: str) -> list[bytes]:
    """Every body left in ``dest``, in order, through our raw client: a marker sent after them
    ends the read."""
    consumer, producer = RawStomp(b.host, b.port, timeout=30), RawStomp(b.host, b.port)
    consumer.connect()
    producer.connect()
    consumer.send("SUBSCRIBE", {"destination": dest, "id": "1", "ack": "auto",
                                "receipt": "sub"})
    assert consumer.recv().headers.get("receipt-id") == "sub"
    producer.send("SEND", {"destination": dest, "n": "end", "receipt": "end"}, b"")
    assert producer.recv().command == "RECEIPT"
    got = []
    while (frame := consumer.recv(timeout=30)).headers.get("n") != "end":
        got.append(frame.body)
    consumer.close()
    producer.close()
    return got


def contents(data_dir: Path) -> dict[str, bytes]:
    """Every file of the data directory but the serving broker's lock note."""
    return {str(p.relative_to(data_dir)): p.read_bytes() for p in sorted(data_dir.rglob("*"))
            if p.is_file() and p.name != "lock"}


def start_refused(b: BrokerProcess) -> subprocess.CompletedProcess[str]:
    """Start the broker on ``b``'s data directory and config, expecting it to end on its own."""
    args = [sys.executable, "-m", "sluicemq", "broker", "--host", "127.0.0.1", "--port", "0",
            "--console-port", "off", "--ws-port", "off", "--data-dir", str(b.data_dir)]
    if b.config_path is not None:
        args += ["--config", str(b.config_path)]
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


def test_a_key_from_another_data_directory_is_refused_and_nothing_is_changed(
        broker_factory: Any) -> None:
    b = broker_factory(config_text=CONFIG)
    sent = send(b, "/queue/key.kept", 40)
    b.stop()
    other = broker_factory(name="other")
    other.stop()
    key = b.data_dir / "journal" / KEY_NAME
    own = key.read_bytes()
    shutil.copyfile(other.data_dir / "journal" / KEY_NAME, key)
    before = contents(b.data_dir)

    refused = start_refused(b)
    assert refused.returncode == 1, refused.stderr
    assert (f"ERROR sluicemq.server: {key} is not the key this journal's segments were "
            "written with") in refused.stderr
    assert "Nothing was changed. Put back the journal.key these segments were written with" \
        in refused.stderr
    assert "Traceback" not in refused.stderr and "listening on" not in refused.stdout
    assert contents(b.data_dir) == before  # no segment zeroed or deleted, no snapshot written

    key.write_bytes(own)
    b.restart()
    assert "dropped" not in b.log()
    assert drain(b, "/queue/key.kept") == sent


@pytest.mark.parametrize("landed", [0, HEADER_SIZE + 100],
                         ids=["nothing landed", "the header and part of the payload"])
def test_a_crash_that_tore_the_first_write_of_a_new_journal_still_starts(
        broker_factory: Any, landed: int) -> None:
    """The broker's first record went to a new journal's first segment and was RECEIPTed;
    the segment is then left as a crash tearing that write would leave it (zero-filled ahead
    of use, ``landed`` bytes of the write on disk)."""
    b = broker_factory(config_text=CONFIG)
    send(b, "/queue/key.torn", 1)
    b.kill()
    path = b.data_dir / "journal" / segment_name(1)
    data = bytearray(path.read_bytes())
    data[landed:] = bytes(len(data) - landed)
    path.write_bytes(bytes(data))
    b.restart()
    assert ("torn tail" in b.log()) == bool(landed)
    assert drain(b, "/queue/key.torn") == []
    assert send(b, "/queue/key.torn", 3) == drain(b, "/queue/key.torn")  # it goes on
