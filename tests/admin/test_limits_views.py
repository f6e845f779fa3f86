"""Operators see every [limits] cap against what is used of it, in the JSON overview and in
/metrics, and the memory limit shown is the one the broker enforces (not physical RAM)."""

from __future__ import annotations

import dataclasses

from console_client import ConsoleClient
from test_metrics import scrape, value

from sluice_testing import RawStomp
from sluicemq.config import Limits
from sluicemq.core.routing.destinations import DESTINATION_BYTES
from sluicemq.transport.tcp import CONNECTION_BYTES as TCP_CONNECTION_BYTES

CONFIG = """
[limits]
memory-limit = "256 MiB"
max-connections = 50
max-connections-per-address = 7
max-destinations = 40
max-destinations-per-user = 30
connect-timeout = 4.5
max-header-bytes = 131072
turn-budget-ms = 3.0
output-buffer-bytes = "3 MiB"
"""


def test_the_overview_and_metrics_show_the_configured_memory_limit(broker_factory) -> None:
    broker = broker_factory(config_text=CONFIG)
    memory = ConsoleClient(broker.console_url).get("/api/overview")["memory"]
    assert memory["limit_bytes"] == 256 << 20 and memory["limit_source"] == "config"
    families = scrape(broker.console_url)
    assert value(families["sluice_memory_limit_bytes"], source="config") == 256 << 20


def test_the_default_memory_limit_is_shown_as_derived(broker_factory) -> None:
    broker = broker_factory()
    memory = ConsoleClient(broker.console_url).get("/api/overview")["memory"]
    assert memory["limit_source"] == "derived"
    assert 64 << 20 <= memory["limit_bytes"] <= 2 << 30  # 1/8 of RAM, clamped (core/paging/flow.py)


def test_connection_and_destination_caps_are_shown_with_their_use(broker_factory) -> None:
    broker = broker_factory(config_text=CONFIG)
    conns = [RawStomp(broker.host, broker.port) for _ in range(3)]
    for c in conns:
        c.connect()
    for i in range(4):
        conns[0].send("SEND", {"destination": f"/queue/v{i}", "receipt": str(i)}, b"x")
        assert conns[0].recv().command == "RECEIPT"
    limits = ConsoleClient(broker.console_url).get("/api/overview")["limits"]
    assert limits["connections"]["limit"] == 50
    assert limits["connections"]["used"] >= 3
    assert limits["connections_per_address"] == {"used": limits["connections"]["used"],
                                                 "limit": 7}
    assert limits["destinations"] == {"used": 4, "limit": 40}
    assert limits["destinations_per_user"] == {"used": 4, "limit": 30}
    assert limits["connect_timeout_s"] == 4.5
    assert limits["max_header_bytes"] == 131072
    assert limits["turn_budget_ms"] == 3.0 and limits["turns_deferred"] >= 0
    # three connections share the output budget (more, once the console's probe is one)
    assert limits["output_buffer"]["limit"] == 3 << 20
    assert limits["output_buffer"]["per_connection"] <= 1 << 20
    assert limits["output_buffered"] >= 0
    # connections' and destinations' own state is charged to memory_limit
    tcp = limits["connection_memory"]["used"]
    assert tcp >= 3 * TCP_CONNECTION_BYTES and tcp % TCP_CONNECTION_BYTES == 0
    assert limits["connection_memory"]["limit"] > 0
    assert limits["destination_memory"]["used"] == 4 * DESTINATION_BYTES
    families = scrape(broker.console_url)
    assert value(families["sluice_limit"], limit="max_connections_per_address") == 7
    assert value(families["sluice_limit"], limit="max_destinations") == 40
    assert value(families["sluice_limit"], limit="max_header_bytes") == 131072
    assert value(families["sluice_limit"], limit="output_buffer_bytes") == 3 << 20
    assert value(families["sluice_output_buffered_bytes"]) >= 0
    assert value(families["sluice_connection_memory_bytes"]) % TCP_CONNECTION_BYTES == 0
    assert value(families["sluice_destinations_memory_bytes"]) == 4 * DESTINATION_BYTES
    assert value(families["sluice_turns_deferred"], "_total") >= 0
    assert value(families["sluice_limit_used"], limit="max_destinations") == 4
    assert value(families["sluice_limit_used"], limit="max_destinations_per_user") == 4
    assert value(families["sluice_limit_used"], limit="max_connections") >= 3
    for c in conns:
        c.close()


def test_every_limits_setting_is_shown_by_its_name(broker_factory) -> None:
    """Each [limits] key an ERROR names can be looked up in the console and in /metrics,
    sizes in bytes (the broker-wide ones as resolved, never 0 for "derived")."""
    broker = broker_factory(config_text=CONFIG)
    configured = ConsoleClient(broker.console_url).get("/api/overview")["limits"]["configured"]
    families = scrape(broker.console_url)
    names = [f.name for f in dataclasses.fields(Limits)]
    assert sorted(configured) == sorted(names)
    for name in names:
        assert value(families["sluice_limit"], limit=name) == configured[name], name
    assert configured["memory_limit"] == 256 << 20
    assert configured["output_buffer_bytes"] == 3 << 20
    assert configured["connect_timeout"] == 4.5
    assert configured["store_limit"] > 0 and configured["temp_limit"] > 0


def test_metrics_keep_per_destination_series_bounded(broker_factory) -> None:
    """Beyond 500 destinations the shallowest are summed under (other): scrapes stay cheap."""
    broker = broker_factory()
    conn = RawStomp(broker.host, broker.port)
    conn.connect()
    for i in range(520):
        for _ in range(2 if i < 500 else 1):  # 500 queues 2 deep, 20 queues 1 deep
            conn.send("SEND", {"destination": f"/queue/many.{i}"}, b"x")
    conn.send("SEND", {"destination": "/queue/many.0", "receipt": "last"}, b"x")
    assert conn.recv().headers["receipt-id"] == "last"
    families = scrape(broker.console_url)
    depth = families["sluice_destination_depth"]
    assert len(depth.samples) == 501
    assert value(depth, kind="queue", name="many.0") == 3
    assert value(depth, kind="queue", name="(other)") == 20
    assert value(families["sluice_destination_enqueued"], "_total", kind="queue",
                 name="(other)") == 20
    conn.close()
