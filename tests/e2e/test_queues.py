"""Queue semantics over the wire with stomp.py: competing consumers, ack modes, redelivery."""

from __future__ import annotations

import time

import pytest
from stomp_helpers import (
    connect,
    nothing_delivered,
    send_with_receipt,
    subscribe_with_receipt,
    wait_receipt,
)

from sluice_testing import eventually
from sluicemq import Client

pytestmark = pytest.mark.usefixtures("broker")


def test_persistent_send_is_receipted_and_received(broker) -> None:
    conn, lst = connect(broker)
    send_with_receipt(conn, lst, "/queue/a", "hello", "r1", persistent="true")
    conn.subscribe("/queue/a", id="1", ack="auto")
    frame = lst.next()
    assert frame.body == "hello"
    assert frame.headers["persistent"] == "true"
    conn.disconnect()


def test_competing_consumers_share_the_queue_fairly(broker) -> None:
    c1, l1 = connect(broker)
    c2, l2 = connect(broker)
    subscribe_with_receipt(c1, l1, "/queue/fair", "1", ack="client-individual",
                           headers={"activemq.prefetchSize": "1"})
    subscribe_with_receipt(c2, l2, "/queue/fair", "2", ack="client-individual",
                           headers={"activemq.prefetchSize": "1"})
    p, lp = connect(broker)
    for i in range(19):
        p.send("/queue/fair", f"m{i}")
    send_with_receipt(p, lp, "/queue/fair", "m19", "all-sent")  # all 20 are queued now
    got: dict[str, list[str]] = {"1": [], "2": []}
    # Each consumer holds one message at a time (prefetch 1). Taking and acking them in turn,
    # the one that acks has the only room, so the next message is its own: neither may go
    # without while the other is served. (Draining whichever had something ready let the
    # faster side take a run of messages while the other's ack was on its way: a race.)
    for _ in range(10):
        for conn, lst, sid in ((c1, l1, "1"), (c2, l2, "2")):
            f = lst.next()
            got[sid].append(f.body)
            conn.ack(f.headers["ack"])
    assert sorted(got["1"] + got["2"], key=lambda s: int(s[1:])) == [f"m{i}" for i in range(20)]
    assert len(got["1"]) == len(got["2"]) == 10


def test_prefetch_limits_unacked_messages(broker) -> None:
    p, _lp = connect(broker)
    for i in range(10):
        p.send("/queue/pf", str(i))
    c, lc = connect(broker)
    c.subscribe("/queue/pf", id="s", ack="client-individual",
                headers={"activemq.prefetchSize": "3"})
    frames = [lc.next() for _ in range(3)]
    assert nothing_delivered(c, lc)
    c.ack(frames[0].headers["ack"])
    assert lc.next().body == "3"


def test_client_ack_is_cumulative(broker) -> None:
    p, _lp = connect(broker)
    for i in range(5):
        p.send("/queue/cum", str(i))
    c, lc = connect(broker)
    c.subscribe("/queue/cum", id="s", ack="client")
    frames = [lc.next() for _ in range(5)]
    c.ack(frames[2].headers["ack"], receipt="ack")  # acks 0, 1, 2
    wait_receipt(lc, "ack")
    c.disconnect()
    c2, lc2 = connect(broker)
    c2.subscribe("/queue/cum", id="s", ack="auto")
    rest = [lc2.next().body for _ in range(2)]
    assert rest == ["3", "4"]
    assert nothing_delivered(c2, lc2)


def test_nack_redelivers_with_redelivered_flag_and_count(broker) -> None:
    p, _lp = connect(broker)
    p.send("/queue/nack", "x")
    c, lc = connect(broker)
    c.subscribe("/queue/nack", id="s", ack="client-individual")
    first = lc.next()
    assert "redelivered" not in first.headers
    c.nack(first.headers["ack"])
    second = lc.next()
    assert second.body == "x"
    assert second.headers["redelivered"] == "true"
    assert second.headers["sluice-delivery-count"] == "2"
    c.ack(second.headers["ack"])
    assert nothing_delivered(c, lc)


def test_disconnect_returns_unacked_messages(broker) -> None:
    p, _lp = connect(broker)
    for i in range(3):
        p.send("/queue/ret", str(i))
    c, lc = connect(broker)
    c.subscribe("/queue/ret", id="s", ack="client-individual")
    [lc.next() for _ in range(3)]
    c.disconnect()
    c2, lc2 = connect(broker)
    c2.subscribe("/queue/ret", id="s", ack="client-individual")
    again = [lc2.next() for _ in range(3)]
    assert [f.body for f in again] == ["0", "1", "2"]
    assert all(f.headers["redelivered"] == "true" for f in again)


def test_exhausted_redeliveries_go_to_the_dlq(broker_factory) -> None:
    b = broker_factory(config_text="[defaults]\nmax_redeliveries = 2\n", name="dlq")
    p, lp = connect(b)
    send_with_receipt(p, lp, "/queue/work", "poison", "r", persistent="true")
    c, lc = connect(b)
    c.subscribe("/queue/work", id="s", ack="client-individual")
    for attempt in range(3):  # first delivery + 2 redeliveries
        f = lc.next()
        assert f.body == "poison", attempt
        c.nack(f.headers["ack"])
    assert nothing_delivered(c, lc)
    c.subscribe("/queue/DLQ.work", id="d", ack="auto")
    dead = lc.next()
    assert dead.body == "poison"
    assert dead.headers["sluice-dlq-origin"] == "/queue/work"


def test_exclusive_consumer_gets_everything(broker) -> None:
    c1, l1 = connect(broker)
    c2, l2 = connect(broker)
    subscribe_with_receipt(c1, l1, "/queue/ex", "1", headers={"activemq.exclusive": "true"})
    subscribe_with_receipt(c2, l2, "/queue/ex", "2")
    p, _ = connect(broker)
    for i in range(10):
        p.send("/queue/ex", str(i))
    assert [l1.next().body for _ in range(10)] == [str(i) for i in range(10)]
    assert nothing_delivered(c2, l2)  # the sends ran: c1 has their messages
    c1.disconnect()  # the other consumer takes over
    p.send("/queue/ex", "after")
    assert l2.next().body == "after"


def test_message_groups_stick_to_one_consumer(broker) -> None:
    c1, l1 = connect(broker)
    c2, l2 = connect(broker)
    subscribe_with_receipt(c1, l1, "/queue/grp", "1")
    subscribe_with_receipt(c2, l2, "/queue/grp", "2")
    p, _ = connect(broker)
    for i in range(30):
        p.send("/queue/grp", f"{'ABC'[i % 3]}{i}", headers={"JMSXGroupID": "ABC"[i % 3]})
    seen: dict[str, set[str]] = {"1": set(), "2": set()}
    count = 0

    def take() -> bool:
        nonlocal count
        for lst, sid in ((l1, "1"), (l2, "2")):
            while not lst.messages.empty():
                seen[sid].add(lst.messages.get_nowait().headers["JMSXGroupID"])
                count += 1
        return count == 30

    eventually(take, "all 30 delivered")
    assert seen["1"] | seen["2"] == {"A", "B", "C"}
    assert not (seen["1"] & seen["2"]), "a group was split across consumers"


def test_priority_orders_pending_messages(broker) -> None:
    p, lp = connect(broker)
    for prio in (1, 9, 4, 7):
        p.send("/queue/prio", f"p{prio}", headers={"priority": str(prio)})
    send_with_receipt(p, lp, "/queue/prio", "p0", "done", priority="0")
    c, lc = connect(broker)
    c.subscribe("/queue/prio", id="s")
    assert [lc.next().body for _ in range(5)] == ["p9", "p7", "p4", "p1", "p0"]


def test_expired_messages_are_not_delivered(broker) -> None:
    p, lp = connect(broker)
    past = str(int(time.time() * 1000) - 1000)
    future = str(int(time.time() * 1000) + 60_000)
    p.send("/queue/exp", "old", headers={"expires": past})
    send_with_receipt(p, lp, "/queue/exp", "fresh", "r", expires=future)
    c, lc = connect(broker)
    c.subscribe("/queue/exp", id="s")
    assert lc.next().body == "fresh"
    assert nothing_delivered(c, lc)


def test_selector_filters_queue_messages(broker) -> None:
    c, lc = connect(broker)
    subscribe_with_receipt(c, lc, "/queue/sel", "s",
                           headers={"selector": "region = 'eu' AND amount > 10"})
    p, _ = connect(broker)
    p.send("/queue/sel", "a", headers={"region": "eu", "amount": "5"})
    p.send("/queue/sel", "b", headers={"region": "us", "amount": "50"})
    p.send("/queue/sel", "c", headers={"region": "eu", "amount": "50"})
    assert lc.next().body == "c"
    assert nothing_delivered(c, lc)


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_older_protocol_versions_ack_by_message_id(broker, version: str) -> None:
    p, _ = connect(broker)
    p.send("/queue/old" + version.replace(".", ""), "m")
    c, lc = connect(broker, version=version)
    dest = "/queue/old" + version.replace(".", "")
    if version == "1.0":
        c.subscribe(dest, id="s", ack="client")
        f = lc.next()
        c.ack(f.headers["message-id"], receipt="acked")
    else:
        c.subscribe(dest, id="s", ack="client")
        f = lc.next()
        c.ack(f.headers["message-id"], "s", receipt="acked")
    wait_receipt(lc, "acked")
    c.disconnect()
    with Client(broker.url) as q:
        assert q.head(dest).count == 0, "acked message came back"


def _mixed_backlog(count: int) -> list[tuple[str, bytes, dict[str, str]]]:
    """Messages that a run of deliveries must carry whole or hand to the single path in
    between: groups, expired ones, bodies written apart from their head (from 4 KiB), headers
    that need escaping, and plain ones of many sizes."""
    past = str(int(time.time() * 1000) - 1000)
    out = []
    for i in range(count):
        headers = {"n": str(i)}
        body = bytes([65 + i % 26]) * (1 + i * 37 % 3000)
        if i % 7 == 3:
            headers["JMSXGroupID"] = f"g{i % 3}"
        if i % 11 == 5:
            headers["expires"] = past
        if i % 13 == 6:
            body = b"L" * (4096 + i)
        if i % 17 == 8:
            headers["note"] = "a:b\\c"
        out.append((f"m{i}", body, headers))
    return out


@pytest.mark.parametrize("consumer", ["stomp.py", "sluicemq"])
def test_a_backlog_reaches_an_auto_ack_consumer_in_order_and_whole(broker, consumer) -> None:
    """A queue's one auto-ack consumer is served in runs (dispatch._auto_run): every message
    not expired arrives once, in order, with its body and headers as sent."""
    dest = f"/queue/runs-{consumer}"
    sent = _mixed_backlog(400)
    p, lp = connect(broker)
    for name, body, headers in sent[:-1]:
        p.send(dest, body, headers=dict(headers, name=name))
    name, body, headers = sent[-1]
    send_with_receipt(p, lp, dest, body, "all", name=name, **headers)
    wanted = [(name, body, headers) for name, body, headers in sent
              if "expires" not in headers]
    got: list[tuple[str, bytes, dict[str, str]]] = []
    if consumer == "stomp.py":
        c, lc = connect(broker)
        c.subscribe(dest, id="s", ack="auto")
        for _ in wanted:
            f = lc.next()
            got.append((f.headers["name"], f.body.encode(), f.headers))
        assert nothing_delivered(c, lc)
        c.disconnect()
    else:
        with Client(broker.url) as q:
            sub = q.subscribe(dest, ack="auto")
            for _ in wanted:
                m = sub.get(timeout=10)
                assert m is not None
                got.append((m.headers["name"], bytes(m.body), m.headers))
    assert [g[0] for g in got] == [w[0] for w in wanted]
    for (_, body, headers), (_, got_body, got_headers) in zip(wanted, got, strict=True):
        assert got_body == body
        assert {k: got_headers[k] for k in headers} == headers
