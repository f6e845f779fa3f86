"""Operators can see paging and flow control: how much of a backlog lives only on disk, how
full each broker-wide limit is, and how many producers are being held — in the JSON API
and in /metrics."""

from __future__ import annotations

from console_client import ConsoleClient, send
from test_metrics import scrape, value

from sluice_testing import RawStomp, eventually

CONFIG = """
[[policy]]
queue = "deep.>"
cursor_window = 20
[[policy]]
queue = "tight.>"
cursor = "vm"
memory_limit = "8 KiB"
[[policy]]
queue = "capped.>"
store_limit = "4 KiB"
"""


def test_a_backlog_beyond_the_cursor_window_shows_as_paged(broker_factory) -> None:
    broker = broker_factory(config_text=CONFIG)
    conn = RawStomp(broker.host, broker.port)
    conn.connect()
    for i in range(100):
        send(conn, "/queue/deep.orders", f"m{i}", persistent="true")
    api = ConsoleClient(broker.console_url)
    row = api.destination("queue", "deep.orders")
    assert row is not None
    assert row["depth"] == 100 and row["cursor"] == "store"
    assert row["paged"] >= 100 - 20
    # What is unconsumed, in memory or only on disk: every body byte sent ("m0".."m99").
    assert row["memory_bytes"] + row["paged_bytes"] == sum(len(f"m{i}") for i in range(100))
    families = scrape(broker.console_url)
    assert value(families["sluice_destination_paged_messages"], kind="queue",
                 name="deep.orders") == row["paged"]
    flow = api.get("/api/overview")["flow"]
    assert flow["paged"] == row["paged"]
    assert flow["limits"]["store"]["used"] > 100 * len("m99")
    assert {"memory", "store", "temp"} <= set(flow["limits"])
    conn.close()


def test_a_held_producer_is_counted_until_released(broker_factory) -> None:
    broker = broker_factory(config_text=CONFIG)
    producer = RawStomp(broker.host, broker.port, timeout=30)
    producer.connect()
    for i in range(20):  # 20 x 1 KiB into an 8 KiB destination: the producer gets held
        producer.send("SEND", {"destination": "/queue/tight.q", "persistent": "true",
                               "receipt": str(i)}, b"x" * 1024)
    api = ConsoleClient(broker.console_url)
    eventually(lambda: api.get("/api/overview")["flow"]["producers_waiting"] > 0,
               "flow control holding the producer")
    families = scrape(broker.console_url)
    assert value(families["sluice_flow_producers_waiting"]) >= 1
    assert value(families["sluice_flow_blocked"], "_total") >= 1
    assert value(families["sluice_limit_bytes"], limit="memory") > 0

    consumer = RawStomp(broker.host, broker.port, timeout=30)
    consumer.connect()
    consumer.send("SUBSCRIBE", {"destination": "/queue/tight.q", "id": "s", "ack": "auto"})
    receipts = set()
    while len(receipts) < 20:
        frame = producer.recv(timeout=20)
        if frame.command == "RECEIPT":
            receipts.add(frame.headers["receipt-id"])
    assert api.get("/api/overview")["flow"]["producers_waiting"] == 0
    producer.close()
    consumer.close()


def test_a_destination_shows_its_ready_bytes_against_its_store_limit(broker_factory) -> None:
    """Which destination is at its own store_limit, and by how much: its detail in the API."""
    broker = broker_factory(config_text=CONFIG)
    conn = RawStomp(broker.host, broker.port)
    conn.connect()
    for i in range(4):
        send(conn, "/queue/capped.q", str(i).ljust(1024, "c"), persistent="true")
    api = ConsoleClient(broker.console_url)
    detail = api.get("/api/destinations/queue/capped.q")
    assert (detail["ready_bytes"], detail["store_limit"]) == (4096, 4096)
    send(conn, "/queue/other.q", "o", persistent="true")
    assert api.get("/api/destinations/queue/other.q")["store_limit"] == 0  # none: 0
    conn.close()
