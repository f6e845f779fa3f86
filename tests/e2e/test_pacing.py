"""Spec: producer pacing. A destination whose consumers are behind by more than its
``max_consumer_lag`` holds non-persistent SENDs until they catch up, so end-to-end latency is
bounded by the lag instead of by the memory limit; a destination with no consumer (a backlog
being filled) and persistent SENDs (paced by the disk already) are never held by it. Each
destination's lag and bound are shown by the admin API (and so the console) and /metrics.
"""

from __future__ import annotations

import json
import time
import urllib.request

from sluice_testing import BrokerProcess, RawStomp

CONFIG = """
[[policy]]
queue = "paced.>"
max_consumer_lag = "16 KiB"
"""
BODY = b"p" * 1024
COUNT = 40


def flow(b: BrokerProcess) -> dict:
    with urllib.request.urlopen(f"{b.console_url}/api/overview", timeout=10) as resp:
        return json.load(resp)["flow"]


def wait_flow(b: BrokerProcess, ok, within: float = 20.0) -> dict:
    deadline = time.monotonic() + within
    while True:
        state = flow(b)
        if ok(state):
            return state
        assert time.monotonic() < deadline, state
        b.listening.wait(0.05)  # paces the re-check only


def lag_metric(b: BrokerProcess, name: str) -> float:
    with urllib.request.urlopen(f"{b.console_url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    series = f'sluice_destination_consumer_lag_bytes{{kind="queue",name="{name}"}} '
    line = next(x for x in text.splitlines() if x.startswith(series))
    return float(line[len(series):])


def connect(b: BrokerProcess) -> RawStomp:
    c = RawStomp(b.host, b.port, timeout=30)
    c.connect()
    return c


def pipeline(c: RawStomp, destination: str, *, persistent: bool = False) -> None:
    for i in range(COUNT):
        headers = {"destination": destination, "receipt": str(i)}
        if persistent:
            headers["persistent"] = "true"
        c.send("SEND", headers, BODY)


def test_a_producer_waits_while_consumers_are_behind_and_resumes_when_they_catch_up(
        broker_factory) -> None:
    b = broker_factory(config_text=CONFIG)
    consumer, producer = connect(b), connect(b)
    consumer.send("SUBSCRIBE", {"destination": "/queue/paced.a", "id": "s", "ack": "client",
                                "activemq.prefetchSize": "1", "receipt": "sub"})
    assert consumer.recv().headers["receipt-id"] == "sub"
    pipeline(producer, "/queue/paced.a")
    state = wait_flow(b, lambda f: f["producers_waiting"] == 1)
    assert state["paced_total"] >= 1 and state["blocked_total"] == 0  # paced, not at a limit
    shown = b.api("destinations/queue/paced.a")
    assert shown["max_consumer_lag"] == 16 << 10
    assert shown["lag_bytes"] >= 16 << 10  # what holds the producer, visible where it is held
    assert lag_metric(b, "paced.a") >= 16 << 10
    held = []
    try:
        while True:  # the receipts of the SENDs taken before the hold are already on the wire
            held.append(producer.recv(timeout=1.0).headers["receipt-id"])
    except TimeoutError:
        pass
    assert 5 <= len(held) < COUNT, held  # ~2 KiB a message against a 16 KiB lag
    got = 0
    while got < COUNT:  # the consumer catches up; every SEND goes through, in order
        m = consumer.recv()
        assert m.command == "MESSAGE", m
        consumer.send("ACK", {"id": m.headers["ack"]})
        got += 1
    rest = [producer.recv().headers["receipt-id"] for _ in range(COUNT - len(held))]
    assert held + rest == [str(i) for i in range(COUNT)]
    assert flow(b)["producers_waiting"] == 0
    assert b.api("destinations/queue/paced.a")["lag_bytes"] == 0


def test_no_consumer_no_pacing_a_backlog_fills_at_full_speed(broker_factory) -> None:
    b = broker_factory(config_text=CONFIG)
    producer = connect(b)
    pipeline(producer, "/queue/paced.backlog")
    assert [producer.recv().headers["receipt-id"] for _ in range(COUNT)] == [
        str(i) for i in range(COUNT)]
    assert flow(b)["paced_total"] == 0
    assert b.api("destinations/queue/paced.backlog")["lag_bytes"] is None  # no consumer


def test_persistent_sends_are_not_paced_by_default(broker_factory) -> None:
    b = broker_factory(config_text=CONFIG)
    consumer, producer = connect(b), connect(b)
    consumer.send("SUBSCRIBE", {"destination": "/queue/paced.p", "id": "s", "ack": "client",
                                "activemq.prefetchSize": "1", "receipt": "sub"})
    assert consumer.recv().headers["receipt-id"] == "sub"
    pipeline(producer, "/queue/paced.p", persistent=True)
    assert [producer.recv().headers["receipt-id"] for _ in range(COUNT)] == [
        str(i) for i in range(COUNT)]
    assert flow(b)["paced_total"] == 0
