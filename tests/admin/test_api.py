"""The JSON admin API against a real broker process: read views and every action."""

from __future__ import annotations

import time

import pytest
from console_client import ConsoleClient, send

from sluice_testing import eventually


@pytest.fixture
def producer(raw):
    conn = raw()
    conn.connect()
    return conn


def test_destinations_list_every_queue_and_topic_with_counters(console, producer) -> None:
    for i in range(3):
        send(producer, "/queue/orders", f"o{i}", persistent="true")
    send(producer, "/topic/news", "n0")
    orders = console.destination("queue", "orders")
    assert orders is not None
    assert orders["depth"] == 3 and orders["pending"] == 3 and orders["inflight"] == 0
    assert orders["enqueued"] == 3 and orders["dequeued"] == 0 and orders["consumers"] == 0
    assert orders["memory_bytes"] == 6 and orders["dlq"] is False
    news = console.destination("topic", "news")
    assert news is not None and news["enqueued"] == 1 and news["subscriptions"] == 0


def test_browse_pages_through_waiting_messages_in_dispatch_order(console, producer) -> None:
    for i in range(5):
        send(producer, "/queue/b", f"m{i}", color="red" if i % 2 else "blue")
    send(producer, "/queue/b", "urgent", priority="9")
    first = console.get("/api/destinations/queue/b/messages?offset=0&limit=4")
    second = console.get("/api/destinations/queue/b/messages?offset=4&limit=4")
    assert first["total"] == 6 and first["offset"] == 0
    bodies = [m["body_preview"] for m in first["messages"] + second["messages"]]
    assert bodies == ["urgent", "m0", "m1", "m2", "m3", "m4"]
    m1 = first["messages"][2]
    assert m1["headers"]["color"] == "red" and m1["size"] == 2 and m1["binary"] is False
    assert m1["id"] == f"ID:sluice-{m1['mid']}" and m1["priority"] == 4


def test_one_message_in_full_and_its_raw_body(console, producer) -> None:
    producer.send("SEND", {"destination": "/queue/bin", "receipt": "r",
                           "content-type": "application/octet-stream"}, bytes(range(256)))
    assert producer.recv().command == "RECEIPT"
    [m] = console.get("/api/destinations/queue/bin/messages")["messages"]
    assert m["binary"] is True and m["body_preview"].startswith("00 01 02")
    status, body = console.request("GET", f"/api/destinations/queue/bin/messages/{m['mid']}?raw=1")
    assert status == 200 and body == bytes(range(256))
    detail = console.get(f"/api/destinations/queue/bin/messages/{m['id']}")
    assert detail["mid"] == m["mid"] and detail["size"] == 256


def test_purge_empties_a_queue_durably(broker, console, producer) -> None:
    for i in range(4):
        send(producer, "/queue/p", f"m{i}", persistent="true")
    assert console.post("/api/destinations/queue/p/purge") == {"removed": 4}
    d = console.destination("queue", "p")
    assert d is not None and d["depth"] == 0 and d["dequeued"] == 4
    broker.kill()
    broker.restart()
    again = ConsoleClient(broker.console_url)
    after = again.destination("queue", "p")
    assert after is None or after["depth"] == 0


def test_move_chosen_messages_survives_kill_9_exactly_once(broker, console, producer) -> None:
    for i in range(4):
        send(producer, "/queue/src", f"m{i}", persistent="true")
    mids = [m["mid"] for m in console.get("/api/destinations/queue/src/messages")["messages"]]
    moved = console.post("/api/destinations/queue/src/move",
                         {"to": "/queue/dst", "ids": [mids[1], f"ID:sluice-{mids[3]}"]})
    assert moved == {"moved": 2, "to": "dst"}
    assert console.bodies("src") == ["m0", "m2"]
    assert console.bodies("dst") == ["m1", "m3"]
    broker.kill()
    broker.restart()
    after = ConsoleClient(broker.console_url)
    assert after.bodies("src") == ["m0", "m2"]
    assert after.bodies("dst") == ["m1", "m3"]


def test_move_everything_to_a_topic_reaches_its_subscribers(console, producer, raw) -> None:
    sub = raw()
    sub.connect()
    sub.send("SUBSCRIBE", {"destination": "/topic/t", "id": "1", "receipt": "s"})
    assert sub.recv().command == "RECEIPT"
    send(producer, "/queue/q2t", "hello")
    assert console.post("/api/destinations/queue/q2t/move", {"to": "/topic/t"})["moved"] == 1
    frame = sub.recv()
    assert frame.command == "MESSAGE" and frame.body == b"hello"
    assert console.bodies("q2t") == []


def test_copy_keeps_the_source_and_gives_copies_new_ids(console, producer) -> None:
    send(producer, "/queue/c", "x", persistent="true")
    assert console.post("/api/destinations/queue/c/copy", {"to": "c2"}) == {"copied": 1,
                                                                             "to": "c2"}
    [src] = console.get("/api/destinations/queue/c/messages")["messages"]
    [dst] = console.get("/api/destinations/queue/c2/messages")["messages"]
    assert src["body_preview"] == dst["body_preview"] == "x"
    assert src["mid"] != dst["mid"]


def test_dead_letters_retry_back_to_their_origin(broker_factory, raw) -> None:
    b = broker_factory(config_text="[defaults]\nmax_redeliveries = 0\n", name="dlq")
    console = ConsoleClient(b.console_url)
    c = raw(b)
    c.connect()
    send(c, "/queue/work", "job", persistent="true")
    c.send("SUBSCRIBE", {"destination": "/queue/work", "id": "s", "ack": "client-individual"})
    msg = c.recv()
    c.send("NACK", {"id": msg.headers["ack"], "receipt": "n"})
    assert c.recv().command == "RECEIPT"
    c.send("UNSUBSCRIBE", {"id": "s", "receipt": "u"})
    assert c.recv().command == "RECEIPT"
    dlq = console.destination("queue", "DLQ.work")
    assert dlq is not None and dlq["dlq"] is True and dlq["depth"] == 1
    [dead] = console.get("/api/destinations/queue/DLQ.work/messages")["messages"]
    assert dead["headers"]["sluice-dlq-origin"] == "/queue/work"
    assert dead["headers"]["sluice-dlq-reason"] == "redelivered"
    result = console.post("/api/destinations/queue/DLQ.work/retry")
    assert result == {"retried": 1, "origins": {"/queue/work": 1}}
    [back] = console.get("/api/destinations/queue/work/messages")["messages"]
    assert back["body_preview"] == "job"
    assert not [k for k in back["headers"] if k.startswith("sluice-dlq-")], back["headers"]
    assert back["deliveries"] == 0
    assert console.bodies("DLQ.work") == []


def test_send_a_test_message_that_a_consumer_receives(console, raw) -> None:
    c = raw()
    c.connect()
    c.send("SUBSCRIBE", {"destination": "/queue/t1", "id": "s", "receipt": "r"})
    assert c.recv().command == "RECEIPT"
    sent = console.post("/api/destinations/queue/t1/send",
                        {"body": "ping", "headers": {"kind": "test"}}, expect=201)
    frame = c.recv()
    assert frame.command == "MESSAGE" and frame.body == b"ping"
    assert frame.headers["kind"] == "test" and frame.headers["message-id"] == sent["id"]
    assert frame.headers["persistent"] == "true"


def test_connections_show_sessions_and_can_be_closed(console, raw) -> None:
    c = raw()
    c.connect(login="alice", client_id="cid-1")
    c.send("SUBSCRIBE", {"destination": "/queue/held", "id": "sub-1", "ack": "client",
                         "activemq.prefetchSize": "7", "receipt": "r"})
    assert c.recv().command == "RECEIPT"
    [conn] = [x for x in console.get("/api/connections")["connections"]
              if x["client_id"] == "cid-1"]
    assert conn["login"] == "alice" and conn["version"] == "1.2" and conn["transport"] == "tcp"
    [sub] = conn["subscriptions"]
    assert sub["subscription"] == "sub-1" and sub["ack"] == "client" and sub["prefetch"] == 7
    detail = console.get("/api/destinations/queue/held")
    assert [x["subscription"] for x in detail["consumers_detail"]] == ["sub-1"]
    assert console.delete(f"/api/connections/{conn['id']}")["closed"] is True
    error = c.recv()
    assert error.command == "ERROR" and "administrator" in error.headers["message"]
    c.expect_closed()
    eventually(lambda: all(x["id"] != conn["id"]
                           for x in console.get("/api/connections")["connections"]),
               "the closed connection no longer listed")
    console.delete(f"/api/connections/{conn['id']}", expect=404)


def test_delete_refuses_a_queue_with_consumers_then_removes_it(console, raw) -> None:
    c = raw()
    c.connect()
    send(c, "/queue/gone", "x")
    c.send("SUBSCRIBE", {"destination": "/queue/gone", "id": "s", "ack": "client",
                         "receipt": "r"})
    assert {c.recv().command, c.recv().command} == {"MESSAGE", "RECEIPT"}
    console.delete("/api/destinations/queue/gone", expect=409)
    c.send("UNSUBSCRIBE", {"id": "s", "receipt": "u"})
    assert c.recv().command == "RECEIPT"
    assert console.delete("/api/destinations/queue/gone") == {"deleted": "/queue/gone",
                                                              "dropped": 1}
    assert console.destination("queue", "gone") is None


def test_overview_and_rates(console, producer) -> None:
    send(producer, "/queue/ov", "x", persistent="true")
    o = console.get("/api/overview")
    assert o["connections"] >= 1 and o["queues"] >= 1 and o["depth"] >= 1
    assert o["memory"]["rss_bytes"] > 1 << 20
    assert o["journal"]["disk_bytes"] > 0 and o["journal"]["records"] >= 1
    # the sampler folds a second's counts into a rate point on its own tick
    eventually(lambda: console.get("/api/overview")["rates"]["total_in"] >= 1,
               "the SEND counted in the rates")
    points = console.get("/api/rates?seconds=60")["points"]
    assert points and {"t", "in", "out"} <= set(points[0])


def test_streams_view_lists_broker_streams(console) -> None:
    data = console.get("/api/streams")
    assert data["available"] is True and isinstance(data["streams"], list)


ERROR_CASES = [
    ("GET", "/api/destinations/queue/nope", None, 404),
    ("GET", "/api/destinations/queue/nope/messages", None, 404),
    ("GET", "/api/destinations/queue/nope/messages/12", None, 404),
    ("POST", "/api/destinations/queue/nope/purge", {}, 404),
    ("POST", "/api/destinations/queue/x/move", {}, 400),
    ("POST", "/api/destinations/queue/x/move", {"to": "/bad/x"}, 400),
    ("POST", "/api/destinations/queue/x/move", {"to": "y", "ids": "all"}, 400),
    ("POST", "/api/destinations/queue/x/send", {"headers": "no"}, 400),
    ("GET", "/api/destinations/queue/x/messages?limit=many", None, 400),
    ("DELETE", "/api/connections/nobody", None, 404),
]


def test_errors_are_json_with_a_status(console, producer) -> None:
    send(producer, "/queue/x", "present")
    for method, path, body, status in ERROR_CASES:
        code, data = console.request(method, path, body)
        assert code == status, (method, path, code, data)
        assert isinstance(data["error"], str) and data["error"], (method, path)


NUMBER_CASES = [
    ("GET", "/api/destinations/queue/x/messages/" + "9" * 5000, None, 404),
    ("GET", "/api/destinations/queue/x/messages/%C2%B2", None, 404),  # "²": isdigit()
    ("GET", "/api/destinations/queue/x/messages?limit=" + "9" * 5000, None, 400),
    ("GET", "/api/destinations/queue/x/messages?offset=-1", None, 400),
    ("GET", "/api/rates?seconds=%C2%B2", None, 400),
    ("POST", "/api/destinations/queue/x/move", {"to": "y", "ids": ["9" * 5000]}, 400),
    ("POST", "/api/destinations/queue/x/move", {"to": "y", "ids": ["\u00b2"]}, 400),
    ("POST", "/api/destinations/queue/x/move", b'{"to": "y", "ids": [' + b"9" * 5000 + b"]}",
     400),
    ("POST", "/api/destinations/queue/x/send", b"[" * 100_000 + b"]" * 100_000, 400),
]


def test_numbers_past_int_s_limit_or_not_ascii_get_a_clear_status(console, producer) -> None:
    """Ids, query numbers and JSON bodies of thousands of digits, digits ``int`` does not
    take (``"²"``), negative offsets and arrays nested 100,000 deep are refused with a
    status and a short message, never a 500 (was: ``int()`` of more than 4,300 digits or of
    a superscript raised ValueError, and so did the JSON parser)."""
    send(producer, "/queue/x", "present")
    for method, path, body, status in NUMBER_CASES:
        raw = body if isinstance(body, bytes) else None
        code, data = console.request(method, path, None if raw else body, raw=raw)
        assert code == status, (method, path[:80], code, data)
        assert isinstance(data["error"], str) and len(data["error"]) < 300, (method, path[:80])


def test_browser_borne_requests_are_refused(console) -> None:
    code, _ = console.request("GET", "/api/overview", headers={"Host": "evil.example:80"})
    assert code == 403  # DNS rebinding: a foreign name pointing at 127.0.0.1
    code, _ = console.request("POST", "/api/destinations/queue/x/purge",
                              headers={"Origin": "http://evil.example"})
    assert code == 403
    code, _ = console.request("POST", "/api/destinations/queue/x/purge", raw=b"x",
                              headers={"Content-Type": "text/plain"})
    assert code == 415
    code, data = console.request("POST", "/api/destinations/queue/x/send", raw=b"{not json")
    assert code == 400 and "JSON" in data["error"]


def test_scheduled_messages_are_browsable_and_cancellable(console, producer) -> None:
    """They wait in /queue/sluice.scheduled (due in over a minute) or the bucket of the
    second they are due in, /queue/sluice.scheduled.<second>: browsing shows where and when
    each goes; deleting one cancels it (nothing is delivered when its time comes). Proved by
    order, not by waiting: a third message due one second after the cancelled one is the
    first to arrive. The 8 s delay is the time browsing and deleting may take on a busy
    machine (2.5 s was too little once)."""
    sent = time.time() * 1000
    for body, delay in (("first", "600000"), ("second", "8000")):
        send(producer, "/queue/jobs", body, persistent="true", AMQ_SCHEDULED_DELAY=delay)
    [first] = console.get("/api/destinations/queue/sluice.scheduled/messages")["messages"]
    bucket = f"sluice.scheduled.{int(sent + 8000) // 1000}"
    if bucket not in {d["name"] for d in console.get("/api/destinations")["destinations"]}:
        bucket = f"sluice.scheduled.{int(sent + 8000) // 1000 + 1}"  # a second went by
    [second] = console.get(f"/api/destinations/queue/{bucket}/messages")["messages"]
    assert (first["body_preview"], second["body_preview"]) == ("first", "second")
    assert second["headers"]["sluice-scheduled-destination"] == "/queue/jobs"
    assert int(second["headers"]["sluice-scheduled-at"]) > time.time() * 1000
    assert console.delete(f"/api/destinations/queue/{bucket}/messages/{second['mid']}"
                          ) == {"removed": 1}
    later = max(1, int(second["headers"]["sluice-scheduled-at"]) + 1000 - int(time.time() * 1000))
    send(producer, "/queue/jobs", "third", persistent="true", AMQ_SCHEDULED_DELAY=str(later))
    producer.send("SUBSCRIBE", {"destination": "/queue/jobs", "id": "s"})
    frame = producer.recv(timeout=30.0)
    assert (frame.command, frame.body) == ("MESSAGE", b"third")  # the second never came
    left = console.get("/api/destinations/queue/sluice.scheduled/messages")["messages"]
    assert [m["body_preview"] for m in left] == ["first"]
