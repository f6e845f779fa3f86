"""A streaming query on a queue that does not exist says so (WARNING on `sluicemq.spark`):
once, then every 30 s while it lasts, and once when the queue appears. The planning methods
run here as Spark's planning worker runs them, against a real broker; time is injected."""

from __future__ import annotations

import logging

from pyspark.sql.streaming.datasource import ReadAllAvailable

from sluice_testing import eventually
from sluicemq.client import Client
from sluicemq.spark.options import SourceOptions
from sluicemq.spark.stream_reader import SluiceStreamReader
from sluicemq.spark.waiting import DestinationWatch


def waiting_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "sluicemq.spark"]


def test_a_missing_queue_is_logged_once_then_every_30_s_until_it_appears(broker, caplog):
    caplog.set_level(logging.WARNING, logger="sluicemq.spark")
    now = [1000.0]
    reader = SluiceStreamReader(SourceOptions.parse({"url": broker.url,
                                                     "destination": "/queue/ordrs"}))
    reader._watch = DestinationWatch("/queue/ordrs", clock=lambda: now[0])
    try:
        start = reader.initialOffset()
        for _ in range(50):  # an idle query asks ~80 times a second
            assert reader.latestOffset(start, ReadAllAvailable()) == start
        assert waiting_lines(caplog) == [
            "waiting for /queue/ordrs: it does not exist (nothing sent to it yet, or it was "
            "emptied and dropped as idle; check option destination for a typo)"]
        now[0] += 29.0
        reader.latestOffset(start, ReadAllAvailable())
        assert len(waiting_lines(caplog)) == 1
        now[0] += 1.0
        reader.latestOffset(start, ReadAllAvailable())
        assert len(waiting_lines(caplog)) == 2
        with Client(broker.url) as c:
            c.send("/queue/ordrs", "late")
        assert reader.latestOffset(start, ReadAllAvailable()) != start
        assert waiting_lines(caplog)[-1] == "/queue/ordrs exists now: reading it"
    finally:
        reader.stop()


def test_an_empty_queue_that_exists_is_not_reported(broker, caplog):
    caplog.set_level(logging.WARNING, logger="sluicemq.spark")
    with Client(broker.url) as c:
        c.send("/queue/quiet", "x")
        with c.subscribe("/queue/quiet") as sub:
            assert sub.get(timeout=5) is not None
    reader = SluiceStreamReader(SourceOptions.parse({"url": broker.url,
                                                     "destination": "/queue/quiet"}))
    try:
        start = reader.initialOffset()
        assert reader.latestOffset(start, ReadAllAvailable()) == start
        assert waiting_lines(caplog) == []
    finally:
        reader.stop()


def test_a_queue_the_query_saw_and_the_broker_reclaimed_when_idle_is_not_reported(
        broker_factory, caplog):
    """A running query drains its queue; the broker drops the empty queue once idle (as the
    CSV example's continuous job meets a minute after its last file) and brings it back with
    the next SEND: no typo, nothing to warn about, and the next message is read."""
    caplog.set_level(logging.WARNING, logger="sluicemq.spark")
    broker = broker_factory(config_text="[limits]\nidle-destination-seconds = 1.0\n")
    with Client(broker.url) as c:
        c.send("/queue/drained", "x")
        reader = SluiceStreamReader(SourceOptions.parse({"url": broker.url,
                                                         "destination": "/queue/drained"}))
        try:
            start = reader.initialOffset()
            with c.subscribe("/queue/drained", ack="client-individual") as sub:
                msg = sub.get(timeout=5)
                assert msg is not None
                msg.ack(receipt=True)
            eventually(lambda: not c.head("/queue/drained").exists, "the idle queue dropped")
            assert reader.latestOffset(start, ReadAllAvailable()) == start
            c.send("/queue/drained", "y")
            assert reader.latestOffset(start, ReadAllAvailable()) != start
            assert waiting_lines(caplog) == []
        finally:
            reader.stop()
