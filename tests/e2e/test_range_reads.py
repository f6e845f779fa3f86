"""Spec: sequence numbers, head queries and range reads (docs/replay-protocol.md, sections 1,
2 and 5) against the real broker, through our client, raw frames and stomp.py."""

from __future__ import annotations

import time
from itertools import pairwise
from typing import Any

import pytest
from stomp_helpers import connect

from sluice_testing import RawStomp, rss_mib
from sluicemq.client import Client
from sluicemq.core.security.policy import hash_password
from sluicemq.errors import ClientError

PAGED = """
[[policy]]
queue = ">"
cursor_window = 50
"""


def fill(c: Client, destination: str, n: int, *, prefix: str = "m", **kw: Any) -> list[int]:
    """Send n persistent messages; their seqs, read back from the broker in seq order."""
    before = c.head(destination).next
    for i in range(n):
        c.send(destination, f"{prefix}{i}", **kw)
    return [m.seq for m in c.read_range(destination, before) if m.seq is not None]


def bodies(c: Client, destination: str, start: int | None = None, end: int | None = None,
           **kw: Any) -> list[str]:
    with c.read_range(destination, start, end, **kw) as rng:
        return [m.text() for m in rng]


# -- sequence numbers --------------------------------------------------------------------------
def test_every_message_carries_its_seq_which_is_its_message_id(broker) -> None:
    with Client(broker.url) as c:
        c.send("/queue/s", "a")
        c.send("/queue/s", "b")
        with c.subscribe("/queue/s", ack="client-individual") as sub:
            got = [m for m in (sub.get(5), sub.get(5)) if m is not None]
    assert len(got) == 2
    a, b = got
    assert a.message_id == f"ID:sluice-{a.seq}" and b.seq > a.seq


def test_seqs_keep_rising_across_restarts_even_with_an_empty_journal(broker) -> None:
    with Client(broker.url) as c:
        c.send("/queue/once", "first")
        with c.subscribe("/queue/once") as sub:
            first = sub.get(5)
    assert first is not None and first.seq is not None
    broker.kill()  # nothing left in the journal that remembers the id
    broker.restart()
    with Client(broker.url) as c:
        c.send("/queue/once", "second")
        assert c.head("/queue/once").first > first.seq
        [second] = list(c.read_range("/queue/once"))
    assert second.seq > first.seq


def test_a_producer_cannot_forge_a_seq(broker) -> None:
    with Client(broker.url) as c:
        c.send("/queue/forge", "x", {"sluice-seq": "1"})
        [msg] = list(c.read_range("/queue/forge"))
    assert msg.seq is not None and msg.seq > 1 and msg.headers["sluice-seq"] == str(msg.seq)


# -- head --------------------------------------------------------------------------------------
def test_the_head_of_an_empty_or_unknown_queue(broker) -> None:
    with Client(broker.url) as c:
        h = c.head("/queue/never-used")
        assert h.first == h.next == h.end and h.count == 0 and h.splits == []
        c.send("/queue/other", "moves the head")
        assert c.head("/queue/never-used").next > h.next


def test_the_head_of_a_queue_that_does_not_exist_says_so(broker, raw) -> None:
    """`sluice-destination-missing:true` on the end frame: what lets a reader tell a misspelt
    queue from an empty one. Once the queue exists (even emptied again) the header is gone."""
    r = raw()
    r.connect()
    r.send("SUBSCRIBE", {"id": "h", "destination": "/queue/typo", "browser": "true",
                         "sluice-head-only": "true"})
    end = r.recv()
    assert end.headers["browser"] == "end" and end.headers["sluice-count"] == "0"
    assert end.headers["sluice-destination-missing"] == "true"
    with Client(broker.url) as c:
        assert c.head("/queue/typo").exists is False
        assert c.read_range("/queue/typo").result().exists is False
        c.send("/queue/typo", "now it exists")
        with c.subscribe("/queue/typo") as sub:
            assert sub.get(timeout=5) is not None
        head = c.head("/queue/typo")
        assert head.exists is True and head.count == 0


def test_the_head_counts_pending_and_unacknowledged_messages(broker) -> None:
    with Client(broker.url) as c:
        seqs = fill(c, "/queue/h", 5)
        with c.subscribe("/queue/h", ack="client-individual", prefetch=2) as sub:
            assert sub.get(5) is not None and sub.get(5) is not None
            h = c.head("/queue/h")
            assert (h.first, h.count, h.end) == (seqs[0], 5, h.next)
            assert h.next > seqs[-1]
            assert c.head("/queue/h", start=seqs[2]).count == 3


# -- range reads -------------------------------------------------------------------------------
def test_a_range_read_is_exact_repeatable_and_does_not_consume(broker) -> None:
    with Client(broker.url) as c:
        seqs = fill(c, "/queue/r", 10)
        assert bodies(c, "/queue/r", seqs[2], seqs[7]) == ["m2", "m3", "m4", "m5", "m6"]
        assert bodies(c, "/queue/r", seqs[2], seqs[7]) == ["m2", "m3", "m4", "m5", "m6"]
        with c.read_range("/queue/r", seqs[2], seqs[7]) as rng:
            got = [m.seq for m in rng]
        assert got == seqs[2:7]
        assert rng.head is not None and (rng.head.end, rng.head.count) == (seqs[7], 5)
        with c.subscribe("/queue/r") as sub:
            assert [sub.get(5).text() for _ in range(10)] == [f"m{i}" for i in range(10)]


def test_max_stops_early_and_seq_end_says_where_to_continue(broker) -> None:
    with Client(broker.url) as c:
        seqs = fill(c, "/queue/mx", 7)
        with c.read_range("/queue/mx", max_messages=3) as rng:
            first = [m.text() for m in rng]
        assert first == ["m0", "m1", "m2"] and rng.head is not None
        assert rng.head.end == seqs[2] + 1 and rng.head.count == 3
        assert bodies(c, "/queue/mx", rng.head.end) == ["m3", "m4", "m5", "m6"]
        h = c.head("/queue/mx", max_messages=4)
        assert (h.end, h.count) == (seqs[3] + 1, 4)


def test_splits_cut_a_range_into_slices_that_read_back_to_the_whole(broker) -> None:
    with Client(broker.url) as c:
        fill(c, "/queue/sp", 100)
        h = c.head("/queue/sp", splits=4)
        assert len(h.splits) == 3 and h.count == 100
        edges = [h.first, *h.splits, h.end]
        slices = [bodies(c, "/queue/sp", a, b) for a, b in pairwise(edges)]
        assert [len(s) for s in slices] == [25, 25, 25, 25]
        assert [body for s in slices for body in s] == [f"m{i}" for i in range(100)]


def test_a_range_sees_messages_a_consumer_holds_unacknowledged(broker) -> None:
    with Client(broker.url) as c:
        fill(c, "/queue/held", 4)
        with c.subscribe("/queue/held", ack="client", prefetch=10) as sub:
            assert [sub.get(5).text() for _ in range(4)] == ["m0", "m1", "m2", "m3"]
            assert bodies(c, "/queue/held") == ["m0", "m1", "m2", "m3"]


def test_a_range_end_above_the_head_is_lowered_to_the_head(broker) -> None:
    with Client(broker.url) as c:
        fill(c, "/queue/hi", 2)
        head = c.head("/queue/hi").next
        with c.read_range("/queue/hi", 0, head + 1_000_000) as rng:
            assert len(list(rng)) == 2
        assert rng.head is not None and rng.head.end == head


def test_ranges_over_a_paged_out_backlog_with_priorities(broker_factory) -> None:
    b = broker_factory(config_text=PAGED)
    with Client(b.url) as c:
        for i in range(3000):
            c.send_async("/queue/deep", f"m{i}", {"priority": str(i % 10)})
        c.send("/queue/deep", "last")
        h = c.head("/queue/deep", splits=3)
        assert h.count == 3001
        with c.read_range("/queue/deep", h.first, h.splits[1]) as rng:
            seqs = [m.seq for m in rng]
        assert seqs == sorted(seqs) and len(seqs) == 2000  # seq order, whatever the priority
        with c.read_range("/queue/deep") as rng:
            everything = [m.text() for m in rng]
        assert everything == [f"m{i}" for i in range(3000)] + ["last"]
    b.kill()
    b.restart()  # recovered slots are found the same way
    with Client(b.url) as c:
        assert c.head("/queue/deep").count == 3001
        assert bodies(c, "/queue/deep", max_messages=3) == ["m0", "m1", "m2"]


def test_a_range_of_a_durable_topic_subscription(broker) -> None:
    with Client(broker.url, client_id="reader") as r:
        r.subscribe("/topic/news", durable_name="spark").unsubscribe()  # exists, inactive
        with Client(broker.url) as p:
            for i in range(3):
                p.send("/topic/news", f"n{i}")
        assert bodies(r, "/topic/news", subscription="spark") == ["n0", "n1", "n2"]
        assert r.head("/topic/news", subscription="spark").count == 3
        with pytest.raises(ClientError, match="no durable subscription 'nope'"):
            r.head("/topic/news", subscription="nope")
        with Client(broker.url) as task:  # parallel readers name the client id by header
            assert task.head("/topic/news", subscription="spark", client_id="reader").count == 3
            with pytest.raises(ClientError, match="needs sluice-client-id or a client-id"):
                task.head("/topic/news", subscription="spark")
    with Client(broker.url, client_id="someone-else") as other, \
            pytest.raises(ClientError, match="no durable subscription 'spark'"):
        other.head("/topic/news", subscription="spark")


def test_a_large_range_is_paced_by_its_reader(broker) -> None:
    """A reader that stops reading holds up the range, not the broker's memory."""
    body = b"x" * (256 << 10)
    with Client(broker.url) as c:
        for _ in range(400):  # 100 MiB
            c.send_async("/queue/big", body)
        c.send("/queue/big", body)
        rss_before = rss_mib(broker.pid)
        raw = RawStomp(broker.host, broker.port, timeout=30)
        raw.connect()
        raw.send("SUBSCRIBE", {"destination": "/queue/big", "id": "r", "browser": "true"})
        time.sleep(2.0)  # nothing read: the broker must wait, not buffer 100 MiB
        grown = rss_mib(broker.pid) - rss_before
        total = count = 0
        while True:
            frame = raw.recv(30)
            if frame.headers.get("browser") == "end":
                break
            total += len(frame.body)
            count += 1
        raw.close()
    assert count == 401 and total == 401 * len(body)
    assert frame.headers["sluice-count"] == "401"
    assert grown < 16, f"broker grew {grown:.0f} MiB for an unread range"


# -- bad requests ------------------------------------------------------------------------------
@pytest.mark.parametrize(("headers", "says"), [
    ({"sluice-seq-from": "twelve"}, "invalid sluice-seq-from 'twelve'"),
    ({"sluice-commit-upto": "5"}, "sluice-commit-upto needs sluice-ledger"),
    ({"sluice-splits": "2"}, "sluice-splits needs sluice-head-only:true"),
    ({"destination": "/topic/t"}, "needs activemq.subscriptionName"),
    ({"destination": "/topic/t", "activemq.subscriptionName": "x"}, "or a client-id"),
    ({"sluice-commit-upto": str(1 << 62), "sluice-ledger": "l"}, "is above the head"),
    ({"sluice-format": "xml"}, "invalid sluice-format 'xml'"),
    ({"sluice-batch-bytes": "65536"}, "sluice-batch-bytes needs sluice-format:columns"),
    ({"sluice-format": "columns", "sluice-batch-bytes": "12"}, "invalid sluice-batch-bytes"),
    ({"sluice-format": "columns", "sluice-streams": "complete"}, "cannot be combined"),
])
def test_bad_requests_get_an_error_and_the_connection_keeps_working(raw, headers, says) -> None:
    c = raw()
    c.connect()
    frame = {"destination": "/queue/bad", "id": "r", "browser": "true", "receipt": "x"}
    c.send("SUBSCRIBE", {**frame, **headers})
    err = c.recv()
    assert err.command == "ERROR" and says in err.headers["message"], err
    assert err.headers["receipt-id"] == "x"
    c.send("SEND", {"destination": "/queue/bad", "receipt": "ok"}, b"still here")
    assert c.recv().headers == {"receipt-id": "ok"}
    c.send("SUBSCRIBE", {**frame, "receipt": "y"})  # the id was never taken
    assert c.recv().command == "RECEIPT"
    assert c.recv().body == b"still here"
    assert c.recv().headers["browser"] == "end"
    c.send("UNSUBSCRIBE", {"id": "r", "receipt": "u"})  # harmless once finished
    assert c.recv().headers == {"receipt-id": "u"}


SECURED = f"""
[[security.users]]
name = "app"
password = "{hash_password('app-pw')}"
groups = ["apps"]
[[security.users]]
name = "eve"
password = "{hash_password('eve-pw')}"
groups = ["others"]
[[security.acl]]
destination = "/queue/secret"
read = ["apps"]
write = ["apps", "others"]
[[security.acl]]
destination = "/topic/shared"
read = ["*"]
write = ["*"]
"""


def test_range_reads_need_read_permission(broker_factory) -> None:
    b = broker_factory(config_text=SECURED)
    with Client(b.url, login="app", passcode="app-pw") as app:
        app.send("/queue/secret", "s")
        assert app.head("/queue/secret").count == 1
    with Client(b.url, login="eve", passcode="eve-pw") as eve:
        for attempt in (lambda: eve.head("/queue/secret"),
                        lambda: eve.read_range("/queue/secret"),
                        lambda: eve.commit_upto("/queue/secret", 1, ledger="x")):
            with pytest.raises(ClientError, match="not authorized to read /queue/secret"):
                attempt()
        eve.send("/queue/secret", "eve may still write")


def test_another_users_durable_subscription_cannot_be_read(broker_factory) -> None:
    b = broker_factory(config_text=SECURED)
    with Client(b.url, login="app", passcode="app-pw", client_id="app-1") as app:
        app.subscribe("/topic/shared", durable_name="d").unsubscribe()
        app.send("/topic/shared", "mine")
        with Client(b.url, login="app", passcode="app-pw") as task:
            assert task.head("/topic/shared", subscription="d", client_id="app-1").count == 1
    with Client(b.url, login="eve", passcode="eve-pw") as eve:
        for attempt in (lambda: eve.head("/topic/shared", subscription="d", client_id="app-1"),
                        lambda: eve.commit_upto("/topic/shared", 1, ledger="x",
                                                subscription="d", client_id="app-1")):
            with pytest.raises(ClientError, match="belongs to another user"):
                attempt()


# -- compatibility -----------------------------------------------------------------------------
def test_a_plain_activemq_browse_with_stomp_py(broker) -> None:
    conn, listener = connect(broker)
    for i in range(3):
        conn.send("/queue/plain", f"p{i}", headers={"persistent": "true"})
    conn.subscribe("/queue/plain", id="b", headers={"browser": "true"})
    frames = [listener.next() for _ in range(4)]
    assert [f.body for f in frames[:3]] == ["p0", "p1", "p2"]
    assert frames[3].headers["browser"] == "end" and frames[3].headers["sluice-count"] == "3"
    conn.subscribe("/queue/plain", id="c")  # browsing consumed nothing
    assert [listener.next().body for _ in range(3)] == ["p0", "p1", "p2"]
    conn.disconnect()


def test_browser_false_is_an_ordinary_subscription(raw) -> None:
    c = raw()
    c.connect()
    c.send("SEND", {"destination": "/queue/bf", "receipt": "s"}, b"taken")
    assert c.recv().command == "RECEIPT"
    c.send("SUBSCRIBE", {"destination": "/queue/bf", "id": "1", "browser": "false"})
    assert c.recv().body == b"taken"
    c.send("SUBSCRIBE", {"destination": "/queue/bf", "id": "2", "browser": "true"})
    assert c.recv().headers["sluice-count"] == "0"  # consumed by the first


def test_a_dead_lettered_message_gets_a_fresh_seq_and_keeps_its_first_id(broker_factory) -> None:
    b = broker_factory(config_text="[defaults]\nmax_redeliveries = 0\n")
    with Client(b.url) as c:
        c.send("/queue/work", "poison")
        with c.subscribe("/queue/work", ack="client-individual") as sub:
            msg = sub.get(5)
            assert msg is not None
            msg.nack(receipt=True)
        [dead] = list(c.read_range("/queue/DLQ.work"))
    assert dead.seq is not None and msg.seq is not None and dead.seq > msg.seq
    assert dead.headers["sluice-original-id"] == msg.message_id
    assert dead.message_id == f"ID:sluice-{dead.seq}"
