"""Exactly-once across a broker takeover: a streaming query reads and writes through a failover
URL while the master is killed -9 and the standby on the same data directory takes over.

The query's connections fail over on their own; a range read cut by the takeover fails its task
and Spark retries it (or the query fails and is restarted from its checkpoint) - either way the
sink holds every source message exactly once.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from test_spark_exactly_once import TOTAL, Gate, start_driver, wait_mid_batch

from ha_helpers import Cluster, failover_url, first_listening
from sluice_testing import stored
from sluicemq.client import Client

pytestmark = pytest.mark.xdist_group("spark-drivers")  # one driver JVM at a time


@pytest.mark.slow
def test_a_streaming_query_across_a_takeover_writes_every_message_once(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path / "shared")
    try:
        master = cluster.master()
        standby = cluster.standby()
        source = [f"event-{i}" for i in range(TOTAL)]
        with Client(master.url) as c:
            for r in [c.send_async("/queue/source", b) for b in source]:
                r.result(10)
        both = SimpleNamespace(url=failover_url(master, standby))
        gate = Gate(tmp_path, batch=1)
        driver = start_driver(both, "sluice", "/queue/sink", tmp_path, gate)
        wait_mid_batch(driver, tmp_path / "checkpoint", gate)
        master.kill()  # while a micro-batch is in flight
        gate.release()
        assert first_listening(standby) is standby
        out, _ = driver.communicate(timeout=300)
        if "driver: done" not in out:  # the query failed over the cut: restart it, as a user would
            again = start_driver(both, "sluice", "/queue/sink", tmp_path)
            out, _ = again.communicate(timeout=300)
            assert again.returncode == 0 and "driver: done" in out, out[-3000:]
        bodies = stored(standby.url, "/queue/sink")
        assert sorted(bodies) == sorted(source), (
            f"lost {len(set(source) - set(bodies))}, "
            f"duplicated {len(bodies) - len(set(bodies))}")
    finally:
        cluster.close()
