"""/metrics: Prometheus text that prometheus_client parses, with the families operators need."""

from __future__ import annotations

import urllib.request

from console_client import send
from prometheus_client.parser import text_string_to_metric_families

from sluice_testing import RawStomp, eventually

EXPECTED_FAMILIES = {
    "sluice_destination_depth", "sluice_destination_consumers",
    "sluice_destination_memory_bytes", "sluice_destination_enqueued",
    "sluice_destination_dequeued", "sluice_destination_redelivered",
    "sluice_destination_dead_lettered", "sluice_messages_received", "sluice_messages_delivered",
    "sluice_connections", "sluice_journal_disk_bytes", "sluice_journal_written_bytes",
    "sluice_journal_direct_bytes",
    "sluice_journal_records", "sluice_journal_fsyncs", "sluice_journal_batches",
    "sluice_journal_batch_records", "sluice_journal_fsync_seconds", "sluice_memory_rss_bytes",
    "sluice_streams", "sluice_streams_in_progress", "process_resident_memory_bytes",
    "sluice_store_later_messages",
}


def scrape(url: str) -> dict[str, object]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(family, suffix: str = "", **labels: str) -> float:
    for s in family.samples:
        if s.name == family.name + suffix and all(s.labels.get(k) == v
                                                  for k, v in labels.items()):
            return s.value
    raise AssertionError(f"no sample {family.name}{suffix} {labels}")


def test_metrics_expose_destinations_journal_and_process(broker, raw) -> None:
    conn = raw()
    conn.connect()
    for i in range(3):
        send(conn, "/queue/m", f"m{i}", persistent="true")
    # a sampler tick folds the fsync latencies into the histogram
    eventually(lambda: value(scrape(broker.console_url)["sluice_journal_fsync_seconds"],
                             "_count") >= 3, "three fsyncs in the histogram")
    families = scrape(broker.console_url)
    assert set(families) >= EXPECTED_FAMILIES, EXPECTED_FAMILIES - set(families)
    assert value(families["sluice_destination_depth"], kind="queue", name="m") == 3
    assert value(families["sluice_destination_enqueued"], "_total", kind="queue",
                 name="m") == 3
    assert value(families["sluice_connections"], transport="tcp") == 1
    fsync = families["sluice_journal_fsync_seconds"]
    assert fsync.type == "histogram"
    assert value(fsync, "_count") >= 3
    assert value(fsync, "_bucket", le="+Inf") == value(fsync, "_count")
    assert value(families["sluice_journal_records"], "_total") >= 3
    assert value(families["sluice_memory_rss_bytes"]) > 1 << 20
    assert value(families["sluice_streams_in_progress"]) == 0


def test_each_family_is_declared_once(broker, raw) -> None:
    """The text format allows one TYPE line per metric name: a second family of the same name
    (the destinations' own state once shared the per-destination memory gauge's) breaks
    scrapers, and a parser keeping the last one hides the first."""
    conn = raw()
    conn.connect()
    send(conn, "/queue/once", "m", persistent="true")
    with urllib.request.urlopen(f"{broker.console_url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    declared = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert sorted(n for n in set(declared) if declared.count(n) > 1) == []
    families = scrape(broker.console_url)
    assert value(families["sluice_destination_memory_bytes"], kind="queue", name="once") == 1
    assert value(families["sluice_destinations_memory_bytes"]) > 0


SPARES = """
[journal]
segment_bytes = 262144
recycle_bytes = 1048576
store_delay_ms = 0
"""


def test_reclaimed_segment_files_are_counted_as_spares_then_reused(broker_factory) -> None:
    """The spares are disk the journal holds besides its live segments: operators see them."""
    broker = broker_factory(config_text=SPARES)
    conn = RawStomp(broker.host, broker.port)
    conn.connect()
    body = "x" * 50_000

    def through(round_: int) -> None:  # ~1 MB: four segments, then all consumed
        for i in range(20):
            conn.send("SEND", {"destination": "/queue/s", "persistent": "true",
                               "receipt": f"{round_}.{i}"}, body.encode())
            assert conn.recv().headers.get("receipt-id") == f"{round_}.{i}"
        conn.send("SUBSCRIBE", {"destination": "/queue/s", "id": str(round_)})
        for _ in range(20):
            assert conn.recv().command == "MESSAGE"
        conn.send("UNSUBSCRIBE", {"id": str(round_)})

    def family(name: str, suffix: str = "") -> float:
        return value(scrape(broker.console_url)[name], suffix)

    through(0)
    eventually(lambda: family("sluice_journal_spare_bytes") > 0, "reclaimed files kept")
    assert family("sluice_journal_spare_bytes") <= 1048576
    assert broker.api("overview")["journal"]["spare_bytes"] == family("sluice_journal_spare_bytes")
    through(1)
    eventually(lambda: family("sluice_journal_segments_reused", "_total") > 0, "a spare reused")
    conn.close()
