"""Spec: scheduled delivery with ActiveMQ's headers (AMQ_SCHEDULED_DELAY, _PERIOD, _REPEAT, _CRON).

A scheduled message waits in the broker's own queue, stored like any message, and moves to its
destination in one journal transaction when due: never before its time, never lost across a
kill -9, never delivered twice. Times are checked against the client's clock taken before the
SEND, so a slow machine can only make a delivery later, never make a spec pass early.
"""

from __future__ import annotations

import json
import time
import urllib.request

import stomp
from stomp_helpers import Collector, connect, nothing_delivered, send_with_receipt, wait_receipt

from sluice_testing import BrokerProcess, RawStomp, eventually
from sluicemq import Client


def now_ms() -> int:
    return int(time.time() * 1000)


def test_a_delayed_message_arrives_after_its_delay_and_after_later_plain_ones(broker) -> None:
    conn, got = connect(broker)
    conn.subscribe("/queue/later", id="s", ack="auto")
    sent = now_ms()
    send_with_receipt(conn, got, "/queue/later", "delayed", "r1",
                      AMQ_SCHEDULED_DELAY="1500", persistent="true")
    send_with_receipt(conn, got, "/queue/later", "plain", "r2")
    first, second = got.next(), got.next(timeout=15)
    arrived = now_ms()
    assert (first.body, second.body) == ("plain", "delayed")
    assert arrived - sent >= 1500
    assert second.headers["AMQ_SCHEDULED_DELAY"] == "1500"
    assert not any(k.startswith("sluice-scheduled") for k in second.headers)
    conn.disconnect()


def test_period_and_repeat_deliver_repeat_plus_one_copies_each_a_period_apart(broker) -> None:
    with Client(broker.url) as c:
        sub = c.subscribe("/queue/ticks")
        sent = now_ms()
        c.send("/queue/ticks", b"tick", headers={"AMQ_SCHEDULED_DELAY": "200",
                                                "AMQ_SCHEDULED_PERIOD": "300",
                                                "AMQ_SCHEDULED_REPEAT": "3"})
        copies = [sub.get(timeout=15) for _ in range(4)]
        last = now_ms()
        assert [m.body for m in copies] == [b"tick"] * 4
        assert len({m.headers["message-id"] for m in copies}) == 4
        assert last - sent >= 200 + 3 * 300
        assert sub.get(timeout=1.0) is None  # a fifth would have come 300 ms after the fourth


def test_a_schedule_survives_kill_9_and_fires_exactly_once(broker) -> None:
    with Client(broker.url) as c:
        c.send("/queue/wake", b"soon", persistent=True, headers={"AMQ_SCHEDULED_DELAY": "1000"})
        c.send("/queue/wake", b"much later", persistent=True,
               headers={"AMQ_SCHEDULED_DELAY": "600000"})
    broker.kill()
    broker.restart()
    assert "2 scheduled messages wait" in broker.log()
    with Client(broker.url) as c:
        sub = c.subscribe("/queue/wake", ack="client-individual")
        m = sub.get(timeout=15)
        assert m.body == b"soon"
        m.ack(receipt=True)
        assert sub.get(timeout=1.5) is None  # the far one waits; the near one came once
    broker.kill()
    broker.restart()  # the move was journaled: after another crash it is not sent again
    assert "1 scheduled messages wait" in broker.log()
    with Client(broker.url) as c:
        assert c.head("/queue/wake").count == 0


def test_bad_schedules_and_the_internal_queue_get_a_readable_error(broker) -> None:
    c = RawStomp(broker.host, broker.port)
    c.send("CONNECT", {"accept-version": "1.2", "host": "localhost"})
    assert c.recv().command == "CONNECTED"
    cases = [
        ({"destination": "/queue/x", "AMQ_SCHEDULED_DELAY": "soon"}, "whole number"),
        ({"destination": "/queue/x", "AMQ_SCHEDULED_DELAY": "-5"}, "0 to"),
        ({"destination": "/queue/x", "AMQ_SCHEDULED_CRON": "* * * MON *"},
         "invalid AMQ_SCHEDULED_CRON"),
        ({"destination": "/queue/x", "AMQ_SCHEDULED_CRON": "61 * * * *"}, "minute"),
        ({"destination": "/queue/x", "AMQ_SCHEDULED_REPEAT": "3"}, "needs AMQ_SCHEDULED_PERIOD"),
        ({"destination": "/queue/sluice.scheduled"}, "broker's own"),
        ({"destination": "/queue/a,/queue/b", "AMQ_SCHEDULED_DELAY": "10"}, "several"),
        ({"destination": "/queue/x", "AMQ_SCHEDULED_DELAY": "10", "transaction": "t"},
         "transaction"),
    ]
    c.send("BEGIN", {"transaction": "t"})
    for i, (headers, says) in enumerate(cases):
        c.send("SEND", {**headers, "receipt": str(i)}, b"x")
        frame = c.recv()
        assert frame.command == "ERROR" and says in frame.headers["message"], frame.headers
    c.send("SUBSCRIBE", {"destination": "/queue/sluice.scheduled", "id": "1", "receipt": "s"})
    frame = c.recv()
    assert frame.command == "ERROR" and "broker's own" in frame.headers["message"]
    c.send("SEND", {"destination": "/queue/x", "receipt": "ok"}, b"still served")
    assert c.recv().headers["receipt-id"] == "ok"


def test_with_the_scheduler_off_the_headers_are_ordinary(broker_factory) -> None:
    b = broker_factory(config_text="[scheduler]\nenabled = false\n")
    conn = stomp.Connection12([(b.host, b.port)], heartbeats=(0, 0))
    got = Collector()
    conn.set_listener("c", got)
    conn.connect(wait=True)
    conn.subscribe("/queue/now", id="s")
    conn.send("/queue/now", "at once", headers={"AMQ_SCHEDULED_DELAY": "600000"})
    m = got.next()
    assert (m.body, m.headers["AMQ_SCHEDULED_DELAY"]) == ("at once", "600000")
    conn.disconnect()


def api(broker, path: str) -> dict:
    with urllib.request.urlopen(f"{broker.console_url}/api/{path}", timeout=10) as answer:
        return json.load(answer)


def waiting(broker) -> list[dict]:
    """What waits in the scheduler's queues (sluice.scheduled and its per-second buckets),
    through the admin API."""
    names = [d["name"] for d in api(broker, "destinations")["destinations"]
             if d["name"].startswith("sluice.scheduled")]
    return [m for name in names
            for m in api(broker, f"destinations/queue/{name}/messages")["messages"]]


def broker_ms(b: BrokerProcess) -> int:
    """Now on the broker's (maybe moved) wall clock."""
    return int((time.time() + b.clock_offset) * 1000)


def shortly_before_a_minute(tmp_path, seconds: float = 4.0) -> BrokerProcess:
    """A broker whose wall clock starts ``seconds`` before a whole minute (SHIFTED_CLOCK), so
    that a spec of a cron round waits seconds for it, not up to a minute."""
    b = BrokerProcess(tmp_path / "data")
    minute = (int(time.time()) // 60 + 2) * 60
    b.clock_offset = minute - seconds - time.time()
    return b


def test_a_cron_round_goes_at_the_entry_time_plus_delay_then_repeats_period_apart(
        tmp_path) -> None:
    """As ActiveMQ: at each minute the entry names, the message goes after its delay, then
    AMQ_SCHEDULED_REPEAT more copies AMQ_SCHEDULED_PERIOD apart; then it waits for the next
    minute (it stays scheduled)."""
    broker = shortly_before_a_minute(tmp_path)
    try:
        broker.start()
        conn, got = connect(broker)
        conn.subscribe("/queue/cron", id="s", ack="auto")
        sent = broker_ms(broker)
        send_with_receipt(conn, got, "/queue/cron", "round", "r", persistent="true",
                          AMQ_SCHEDULED_CRON="* * * * *", AMQ_SCHEDULED_DELAY="200",
                          AMQ_SCHEDULED_PERIOD="300", AMQ_SCHEDULED_REPEAT="2")
        minute = (sent // 60_000 + 1) * 60_000  # the top of the next minute
        copies = [got.next(timeout=75) for _ in range(3)]
        last = broker_ms(broker)
        assert [m.body for m in copies] == ["round"] * 3
        assert last >= minute + 200 + 2 * 300
        assert copies[0].headers["AMQ_SCHEDULED_CRON"] == "* * * * *"
        [left] = waiting(broker)  # no fourth copy waits: the next round is a minute away
        assert int(left["headers"]["sluice-scheduled-at"]) == minute + 60_000 + 200
        conn.disconnect()
    finally:
        broker.kill()


def test_a_cron_schedule_survives_kill_9(broker) -> None:
    with Client(broker.url) as c:
        c.send("/queue/yearly", b"happy new year", persistent=True,
               headers={"AMQ_SCHEDULED_CRON": "0 0 1 1 *", "AMQ_SCHEDULED_DELAY": "1000"})
    [before] = waiting(broker)
    new_year = time.mktime((time.localtime().tm_year + 1, 1, 1, 0, 0, 0, 0, 0, -1))
    assert int(before["headers"]["sluice-scheduled-at"]) == int(new_year) * 1000 + 1000
    broker.kill()
    broker.restart()
    assert "1 scheduled messages wait" in broker.log()
    [after] = waiting(broker)
    assert after["headers"] == before["headers"]


BACKOFF = """
[[policy]]
queue = "retry.>"
max_redeliveries = 3
initial_redelivery_delay = 300
redelivery_delay = 300
use_exponential_backoff = true
backoff_multiplier = 2.0
maximum_redelivery_delay = 1000
"""


def raw_client(broker) -> RawStomp:
    c = RawStomp(broker.host, broker.port)
    c.send("CONNECT", {"accept-version": "1.2", "host": "localhost"})
    assert c.recv().command == "CONNECTED"
    return c


def nack(c: RawStomp, frame, receipt: str) -> int:
    """NACK ``frame``, wait for the receipt; returns the client's clock before the NACK."""
    at = now_ms()
    c.send("NACK", {"id": frame.headers["ack"], "receipt": receipt})
    assert c.recv().headers["receipt-id"] == receipt
    return at


def test_a_nacked_message_comes_back_after_an_exponential_back_off_then_goes_to_the_dlq(
        broker_factory) -> None:
    """ActiveMQ's redeliveryPolicy: waits of 300, 600, then 1,000 ms (1,200 capped); the
    redelivered copy goes to the queue's tail; after max_redeliveries, the DLQ."""
    b = broker_factory(config_text=BACKOFF)
    c = raw_client(b)
    c.send("SUBSCRIBE", {"destination": "/queue/retry.jobs", "id": "s",
                         "ack": "client-individual", "receipt": "s"})
    assert c.recv().headers["receipt-id"] == "s"
    producer = raw_client(b)  # (its RECEIPTs and c's MESSAGEs come in any order)
    producer.send("SEND", {"destination": "/queue/retry.jobs", "persistent": "true",
                           "receipt": "p"}, b"poison")
    assert producer.recv().headers["receipt-id"] == "p"
    frame = c.recv()
    assert frame.body == b"poison"
    for i, wait in enumerate((300, 600, 1000)):
        nacked = nack(c, frame, f"n{i}")
        if i == 0:  # sent after the NACK, delivered before the redelivery
            producer.send("SEND", {"destination": "/queue/retry.jobs", "receipt": "later"},
                          b"later")
            assert producer.recv().headers["receipt-id"] == "later"
            plain = c.recv(timeout=5)
            assert plain.body == b"later"
            c.send("ACK", {"id": plain.headers["ack"]})
        frame = c.recv(timeout=15)
        assert now_ms() - nacked >= wait
        assert (frame.body, frame.headers["redelivered"]) == (b"poison", "true")
        assert frame.headers["sluice-delivery-count"] == str(i + 2)
        assert not any(k.startswith("sluice-scheduled") for k in frame.headers)
    nack(c, frame, "last")  # a fourth delivery was the last allowed
    c.send("SUBSCRIBE", {"destination": "/queue/DLQ.retry.jobs", "id": "dlq"})
    dead = c.recv(timeout=10)
    assert (dead.body, dead.headers["sluice-dlq-deliveries"]) == (b"poison", "4")


def test_a_message_its_consumer_left_unacked_waits_the_delay_too(broker_factory) -> None:
    b = broker_factory(config_text=BACKOFF)
    first = raw_client(b)
    first.send("SUBSCRIBE", {"destination": "/queue/retry.crash", "id": "s",
                             "ack": "client-individual"})
    producer = raw_client(b)
    producer.send("SEND", {"destination": "/queue/retry.crash", "receipt": "p"}, b"crashes me")
    assert producer.recv().headers["receipt-id"] == "p"
    assert first.recv().body == b"crashes me"
    left = now_ms()  # (before the close: the broker cannot see it go any earlier)
    first.close()  # gone without an ACK
    second = raw_client(b)
    second.send("SUBSCRIBE", {"destination": "/queue/retry.crash", "id": "s",
                              "ack": "client-individual"})
    frame = second.recv(timeout=10)
    assert frame.body == b"crashes me" and frame.headers["redelivered"] == "true"
    assert now_ms() - left >= 300


def test_a_delayed_redelivery_survives_kill_9_with_its_delivery_count(broker_factory) -> None:
    b = broker_factory(config_text=BACKOFF.replace("initial_redelivery_delay = 300",
                                                   "initial_redelivery_delay = 2000"))
    c = raw_client(b)
    c.send("SUBSCRIBE", {"destination": "/queue/retry.kept", "id": "s",
                         "ack": "client-individual"})
    producer = raw_client(b)
    producer.send("SEND", {"destination": "/queue/retry.kept", "persistent": "true",
                           "receipt": "p"}, b"again")
    assert producer.recv().headers["receipt-id"] == "p"
    nacked = nack(c, c.recv(), "n")
    b.kill()
    b.restart()
    assert "1 scheduled messages wait" in b.log()
    c = raw_client(b)
    c.send("SUBSCRIBE", {"destination": "/queue/retry.kept", "id": "s",
                         "ack": "client-individual"})
    frame = c.recv(timeout=15)
    assert now_ms() - nacked >= 2000
    assert (frame.body, frame.headers["sluice-delivery-count"]) == (b"again", "2")
    c.send("ACK", {"id": frame.headers["ack"], "receipt": "a"})
    assert c.recv().headers["receipt-id"] == "a"


def test_a_far_message_is_refiled_into_its_second_and_survives_kill_9_on_either_side(
        broker_factory) -> None:
    """Due beyond the horizon, a message waits in sluice.scheduled; half the horizon before
    it is due it moves to the queue of its second, then to its destination - once, and never
    early, across a kill -9 before and after the move."""
    b = broker_factory(config_text="[scheduler]\nhorizon_seconds = 4\n")
    sent = now_ms()
    with Client(b.url) as c:
        c.send("/queue/far", b"far", persistent=True, headers={"AMQ_SCHEDULED_DELAY": "9000"})
    far = "destinations/queue/sluice.scheduled/messages"
    assert [m["body_preview"] for m in api(b, far)["messages"]] == ["far"]
    b.kill()
    b.restart()
    listed: list[dict] = []

    def refiled() -> bool:  # 2 s before due: in the bucket of its second, gone from far
        listed[:] = waiting(b)
        return bool(listed) and not api(b, far)["messages"]

    eventually(refiled, b.log, timeout=30)
    assert [m["body_preview"] for m in listed] == ["far"]
    b.kill()
    b.restart()
    with Client(b.url) as c:
        sub = c.subscribe("/queue/far", ack="client-individual")
        m = sub.get(timeout=20)
        assert m.body == b"far" and now_ms() >= sent + 9000
        m.ack(receipt=True)
        assert sub.get(timeout=1.0) is None
    assert waiting(b) == []


CRON_ROUND = {"AMQ_SCHEDULED_CRON": "* * * * *", "AMQ_SCHEDULED_DELAY": "200",
              "AMQ_SCHEDULED_PERIOD": "1500", "AMQ_SCHEDULED_REPEAT": "3"}
ROUND = [200, 1700, 3200, 4700]  # ms after the minute: the first copy and three repeats


def take_copies(b: BrokerProcess, due_ms: list[int], seen: set[str]) -> None:
    """Receive one copy per due time (broker clock), none early, each a message not seen
    before, each acknowledged durably (so a later kill -9 cannot bring it back)."""
    with Client(b.url) as c:
        sub = c.subscribe("/queue/cron.kill", ack="client-individual")
        for due in due_ms:
            m = sub.get(timeout=90)
            assert m is not None and m.body == b"round", f"no copy due at {due}"
            assert broker_ms(b) >= due, "a copy came early"
            assert m.headers["message-id"] not in seen, "a copy came twice"
            seen.add(m.headers["message-id"])
            m.ack(receipt=True)


def test_a_cron_round_cut_by_kill_9_between_two_repeats_finishes_once_then_the_next_round(
        tmp_path) -> None:
    """Cron `* * * * *`, 200 ms delay, 3 repeats 1.5 s apart. kill -9 between the second and
    the third copy: after the restart the third and fourth come at their times, once each,
    and exactly one next round waits (at the next minute); after another kill -9 and a
    restart a minute later (the broker was down) that round comes whole, once. The broker's
    wall clock is moved (SHIFTED_CLOCK) so that the minute is seconds away, not up to 60."""
    b = shortly_before_a_minute(tmp_path)
    try:
        b.start()
        with Client(b.url) as c:
            c.send("/queue/cron.kill", b"round", persistent=True, headers=CRON_ROUND)
        [filed] = waiting(b)
        first = int(filed["headers"]["sluice-scheduled-at"])  # the minute (or, late, the next)
        base = first - ROUND[0]
        seen: set[str] = set()
        take_copies(b, [base + t for t in ROUND[:2]], seen)
        b.kill()  # between the second copy and the third
        b.restart()
        assert "1 scheduled messages wait" in b.log()
        take_copies(b, [base + t for t in ROUND[2:]], seen)
        [next_round] = waiting(b)  # filed once, in the move of the last copy
        assert int(next_round["headers"]["sluice-scheduled-at"]) == base + 60_000 + ROUND[0]
        b.kill()
        b.clock_offset = (base + 57_000) / 1000 - time.time()  # down until 3 s before it
        b.restart()
        take_copies(b, [base + 60_000 + t for t in ROUND], seen)
        [after] = waiting(b)
        assert int(after["headers"]["sluice-scheduled-at"]) == base + 120_000 + ROUND[0]
        with Client(b.url) as c:
            assert c.head("/queue/cron.kill").count == 0  # nothing more was moved
        assert len(seen) == 8
    finally:
        b.kill()


FULL_CONFIG = '[[policy]]\nqueue = "full.>"\nstore_limit = "8 KiB"\n'


def test_a_due_burst_larger_than_the_queues_store_limit_waits_then_arrives_once_in_due_order(
        broker_factory) -> None:
    """24 x 1 KiB due into a queue whose [[policy]] store_limit is 8 KiB: 8 move (as 8 SENDs
    would), 16 wait in the scheduler's queues (listed by the admin API, headed for
    /queue/full.q) while a message due after them all reaches another queue on time; a
    consumer then receives all 24 exactly once, in due order (sent in about its reverse; the
    order is checked against each message's due time as the admin API listed it). Scheduled
    bytes count against the cap from the SEND, so the burst is sent under a 32 KiB cap and
    the broker restarted with the 8 KiB one before it is due."""
    b = broker_factory(config_text=FULL_CONFIG.replace("8 KiB", "32 KiB"))
    conn, got = connect(b)
    for i in range(24):  # message i is due about (23 - i) x 50 ms after the first
        headers = {"persistent": "true", "AMQ_SCHEDULED_DELAY": str(8000 + (23 - i) * 50)}
        conn.send("/queue/full.q", f"{i:02d}".ljust(1024, "."),
                  headers={**headers, **({"receipt": "burst"} if i == 23 else {})})
    wait_receipt(got, "burst")
    conn.disconnect()
    assert b.config_path is not None
    b.config_path.write_text(FULL_CONFIG)
    assert b.stop() == 0
    b.restart()
    conn, got = connect(b)
    due = {m["body_preview"][:2]: (int(m["headers"]["sluice-scheduled-at"]), m["mid"])
           for m in waiting(b)}
    assert len(due) == 24  # none due yet: the first is 8 s after the SEND
    last = max(at for at, _ in due.values())
    send_with_receipt(conn, got, "/queue/other", "after them all", "o", persistent="true",
                      AMQ_SCHEDULED_DELAY=str(last - now_ms() + 500))
    conn.subscribe("/queue/other", id="o", ack="auto")
    assert got.next(timeout=20).body == "after them all"  # the burst's due times have passed
    full = [d for d in api(b, "destinations")["destinations"] if d["name"] == "full.q"]
    assert [d["pending"] for d in full] == [8]
    held = waiting(b)
    assert len(held) == 16
    assert {m["headers"]["sluice-scheduled-destination"] for m in held} == {"/queue/full.q"}
    conn.subscribe("/queue/full.q", id="f", ack="auto")
    bodies = [got.next(timeout=15).body[:2] for _ in range(24)]
    assert bodies == sorted(due, key=due.__getitem__)
    eventually(lambda: not waiting(b), "the scheduler's queues emptied")
    assert nothing_delivered(conn, got)
    conn.disconnect()
