"""Spec: a data directory written by an older SluiceMQ starts on this one, whole.

``fixtures/datadir-e2a5683`` was written by commit e2a5683 (before core/ became packages by
concept) with ``fixtures/datadir-e2a5683/HOW_WRITTEN.md``: persistent messages with a producer
id, two priorities, a durable subscription holding a message published while its subscriber
was away, and an acknowledged message, then a clean stop (index snapshot). Both start-up paths
must read it: from the snapshot, and by scanning the journal alone.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sluicemq import Client

FIXTURE = Path(__file__).parent / "fixtures" / "datadir-e2a5683"
# The fixture's producer id was last seen when it was written; a window of a century keeps it
# remembered whatever today's date is (the default hour made this spec pass only on the day).
CONFIG = ("[journal]\nsegment_bytes = 1048576\npreallocate = false\n"
          "[limits]\ndedup_window = 3155760000.0\n")


@pytest.mark.parametrize("snapshot", [True, False], ids=["from-snapshot", "journal-scan"])
def test_an_old_data_dir_starts_with_everything_it_held(broker_factory, tmp_path: Path,
                                                        snapshot: bool) -> None:
    b = broker_factory(config_text=CONFIG)
    b.stop()
    shutil.rmtree(b.data_dir)
    shutil.copytree(FIXTURE / "journal", b.data_dir / "journal")
    if not snapshot:
        (b.data_dir / "journal" / "index.snapshot").unlink()
    b.restart()
    assert ("index snapshot used" in b.log()) == snapshot
    with Client(b.url, timeout=30) as c:
        orders = c.subscribe("/queue/compat.orders", ack="client-individual")
        got = [orders.get(timeout=10) for _ in range(5)]
        assert [m.body for m in got] == [f"order-{i}".encode() for i in range(5)]
        for m in got:
            m.ack()
        prio = c.subscribe("/queue/compat.prio")
        assert [prio.get(timeout=10).body for _ in range(2)] == [b"high", b"low"]
        c.send("/queue/compat.acked", b"fence")
        acked = c.subscribe("/queue/compat.acked")
        assert acked.get(timeout=10).body == b"fence"  # the one acked before the stop: gone
    with Client(b.url, client_id="compat-client", timeout=30) as c:
        news = c.subscribe("/topic/compat.news", durable_name="keep")
        assert news.get(timeout=10).body == b"while away"
    with Client(b.url, producer_id="old-producer", timeout=30) as c:
        assert c.send("/queue/compat.orders", b"again", producer_seq=5).duplicate
