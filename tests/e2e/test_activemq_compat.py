"""Spec: what an ActiveMQ Classic user relies on over STOMP, beyond the STOMP spec itself.

Each case is a behaviour ActiveMQ 5.17 shows and STOMP clients written against it expect.
"""

from __future__ import annotations

import json
import threading
import time

import stomp

from sluice_testing import BrokerProcess, RawStomp
from sluicemq.core.security.policy import hash_password


def connect(b: BrokerProcess, heart_beat: str = "0,0") -> RawStomp:
    c = RawStomp(b.host, b.port)
    c.send("CONNECT", {"accept-version": "1.2", "host": "localhost", "heart-beat": heart_beat})
    assert c.recv().command == "CONNECTED"
    return c


def test_every_message_carries_priority_expires_persistent_and_timestamp(broker) -> None:
    c = connect(broker)
    before = int(time.time() * 1000)
    c.send("SEND", {"destination": "/queue/h", "receipt": "1"}, b"plain")
    c.send("SEND", {"destination": "/queue/h", "persistent": "true", "priority": "7",
                    "expires": str(before + 600_000), "receipt": "2"}, b"durable")
    assert [c.recv().headers["receipt-id"] for _ in range(2)] == ["1", "2"]
    c.send("SUBSCRIBE", {"destination": "/queue/h", "id": "s"})
    first, second = sorted((c.recv() for _ in range(2)), key=lambda f: f.body)
    assert (second.body, second.headers["priority"], second.headers["expires"],
            second.headers["persistent"]) == (b"plain", "4", "0", "false")
    assert (first.body, first.headers["priority"], first.headers["expires"],
            first.headers["persistent"]) == (b"durable", "7", str(before + 600_000), "true")
    for f in (first, second):
        assert before <= int(f.headers["timestamp"]) <= int(time.time() * 1000)


def test_a_client_asking_for_one_second_beats_gets_them(broker) -> None:
    c = connect(broker, heart_beat="0,1000")
    # (CONNECTED's heart-beat is checked by the next spec's negotiation; here: the EOLs)
    c.sock.settimeout(5)
    started = time.monotonic()
    data = c.sock.recv(16)
    assert data.strip(b"\r\n") == b"" and data
    assert time.monotonic() - started < 3  # not the 10 s a fixed server interval would give


def test_a_client_that_promised_beats_and_fell_silent_is_closed_within_seconds(broker) -> None:
    c = RawStomp(broker.host, broker.port)
    c.send("CONNECT", {"accept-version": "1.2", "host": "localhost", "heart-beat": "1000,0"})
    connected = c.recv()
    assert connected.headers["heart-beat"].split(",")[1] == "1000"
    frame = c.recv(timeout=10)  # silence: the broker gives up after two intervals
    assert frame.command == "ERROR" and "heart-beat" in frame.headers["message"]
    c.expect_closed()


def test_a_queue_subscription_with_a_durable_name_is_refused(broker) -> None:
    """ActiveMQ refuses activemq.subscriptionName on a queue: only topics have durable
    subscriptions, and silently ignoring the name would let a client believe it has one."""
    conn = stomp.Connection([(broker.host, broker.port)])
    errors: list[str] = []
    refused = threading.Event()

    class Listener(stomp.ConnectionListener):
        def on_error(self, frame: stomp.utils.Frame) -> None:
            errors.append(frame.headers.get("message", ""))
            refused.set()

    conn.set_listener("l", Listener())
    conn.connect(wait=True)
    conn.subscribe("/queue/orders", id="1", headers={"activemq.subscriptionName": "keep"})
    assert refused.wait(10)
    conn.disconnect()
    assert "subscriptionName" in errors[0] and "topics" in errors[0]


def test_higher_priority_consumers_get_messages_while_they_have_room(broker) -> None:
    """activemq.priority: the high consumer (prefetch 2) takes messages first; the low one
    gets only what the high one has no room for - and nothing once the high one acks."""
    high, low, producer = connect(broker), connect(broker), connect(broker)
    low.send("SUBSCRIBE", {"destination": "/queue/prio", "id": "low", "ack": "client-individual",
                           "activemq.priority": "1", "receipt": "l"})
    high.send("SUBSCRIBE", {"destination": "/queue/prio", "id": "high",
                            "ack": "client-individual", "activemq.prefetchSize": "2",
                            "activemq.priority": "9", "receipt": "h"})
    assert low.recv().headers["receipt-id"] == "l" and high.recv().headers["receipt-id"] == "h"
    for i in range(3):
        producer.send("SEND", {"destination": "/queue/prio", "n": str(i), "receipt": str(i)})
        assert producer.recv().headers["receipt-id"] == str(i)
    got_high = [high.recv() for _ in range(2)]
    assert [m.headers["n"] for m in got_high] == ["0", "1"]
    assert low.recv().headers["n"] == "2"  # the high one was full
    for m in got_high:
        high.send("ACK", {"id": m.headers["ack"]})
    producer.send("SEND", {"destination": "/queue/prio", "n": "3", "receipt": "3"})
    assert producer.recv().headers["receipt-id"] == "3"
    assert high.recv().headers["n"] == "3"


def test_an_invalid_consumer_priority_is_refused(broker) -> None:
    """Words and numbers of thousands of digits alike get the ERROR, the connection kept."""
    c = connect(broker)
    for value in ("high", "9" * 5000):
        c.send("SUBSCRIBE", {"destination": "/queue/prio", "id": "x", "activemq.priority": value})
        frame = c.recv()
        assert frame.command == "ERROR" and "activemq.priority" in frame.headers["message"]


def drain_one(c: RawStomp, destination: str, sub_id: str) -> bytes:
    c.send("SUBSCRIBE", {"destination": destination, "id": sub_id})
    frame = c.recv()
    assert frame.command == "MESSAGE" and frame.headers["destination"] == destination, frame
    return frame.body


def test_a_composite_send_reaches_every_destination(broker) -> None:
    listener = connect(broker)
    listener.send("SUBSCRIBE", {"destination": "/topic/c", "id": "t", "receipt": "t"})
    assert listener.recv().headers["receipt-id"] == "t"
    c = connect(broker)
    c.send("SEND", {"destination": "/queue/a,/queue/b,/topic/c,d", "persistent": "true",
                    "receipt": "r"}, b"to all")
    assert c.recv().headers["receipt-id"] == "r"
    assert listener.recv().body == b"to all"
    for i, queue in enumerate(("/queue/a", "/queue/b")):
        assert drain_one(c, queue, f"s{i}") == b"to all"


def test_a_persistent_composite_send_survives_kill_9_whole(broker) -> None:
    c = connect(broker)
    c.send("SEND", {"destination": "/queue/x,/queue/y", "persistent": "true", "receipt": "r"},
           b"both or none")
    assert c.recv().headers["receipt-id"] == "r"
    broker.kill()
    broker.restart()
    c = connect(broker)
    assert drain_one(c, "/queue/x", "1") == b"both or none"
    assert drain_one(c, "/queue/y", "2") == b"both or none"


def test_a_composite_send_with_a_bad_part_or_stream_headers_is_refused(broker) -> None:
    c = connect(broker)
    c.send("SEND", {"destination": "/queue/ok,/queue/bad name", "receipt": "r"}, b"x")
    frame = c.recv()
    assert frame.command == "ERROR" and "invalid destination" in frame.headers["message"]
    c.send("SEND", {"destination": "/queue/a,/queue/b", "sluice-stream-id": "s",
                    "receipt": "r2"}, b"x")
    frame = c.recv()
    assert frame.command == "ERROR" and "composite" in frame.headers["message"]


class Collector(stomp.ConnectionListener):
    """stomp.py listener: MESSAGE bodies by subscription; an event per RECEIPT."""

    def __init__(self) -> None:
        self.bodies: dict[str, list[str]] = {}
        self.receipts: dict[str, threading.Event] = {}
        self.errors: list[str] = []
        self.fenced = threading.Event()  # a MESSAGE on the subscription named "sync" came
        self.arrived: dict[str, threading.Event] = {}  # subscription -> its first MESSAGE
        self.errored = threading.Event()

    def on_message(self, frame: stomp.utils.Frame) -> None:
        sub = frame.headers["subscription"]
        self.bodies.setdefault(sub, []).append(f"{frame.headers['destination']}={frame.body}")
        self.arrived.setdefault(sub, threading.Event()).set()
        if sub == "sync":
            self.fenced.set()

    def on_receipt(self, frame: stomp.utils.Frame) -> None:
        self.receipts.setdefault(frame.headers["receipt-id"], threading.Event()).set()

    def on_error(self, frame: stomp.utils.Frame) -> None:
        self.errors.append(frame.headers.get("message", ""))
        self.errored.set()

    def first(self, sub: str) -> str:
        assert self.arrived.setdefault(sub, threading.Event()).wait(10), sub
        return self.bodies[sub][0]

    def wait(self, receipt: str) -> None:
        assert self.receipts.setdefault(receipt, threading.Event()).wait(10), receipt


def stomp_client(b: BrokerProcess, login: str | None = None,
                 passcode: str | None = None) -> tuple[stomp.Connection, Collector]:
    conn = stomp.Connection([(b.host, b.port)])
    listener = Collector()
    conn.set_listener("c", listener)
    conn.connect(login, passcode, wait=True)
    return conn, listener


def reader_and_writer(broker_factory, acl: str) -> BrokerProcess:
    """A broker with users "reader" (password r-pw) and "writer" (w-pw) and ``acl``."""
    users = "".join(f'[[security.users]]\nname = "{n}"\npassword = "{hash_password(p)}"\n'
                    for n, p in (("reader", "r-pw"), ("writer", "w-pw")))
    return broker_factory(config_text=users + acl)


def test_wildcard_topic_subscriptions_receive_every_matching_topic(broker) -> None:
    """`*` is one segment, `>` the rest; topics created after the SUBSCRIBE count too; the
    MESSAGE names the concrete topic."""
    conn, seen = stomp_client(broker)
    conn.subscribe("/topic/prices.*", id="star")
    conn.subscribe("/topic/prices.>", id="rest", headers={"receipt": "subs"})
    seen.wait("subs")
    for topic in ("prices.ibm", "prices.ibm.eu", "orders.x"):
        conn.send(f"/topic/{topic}", topic)
    conn.send("/topic/prices.sun", "last", receipt="sent")
    seen.wait("sent")
    conn.unsubscribe("rest")
    conn.send("/topic/prices.after", "after", receipt="after")
    seen.wait("after")
    conn.subscribe("/topic/prices.sun", id="sync", headers={"receipt": "sync"})
    seen.wait("sync")
    conn.send("/topic/prices.sun", "fence")  # delivered after everything above, in order
    assert seen.fenced.wait(10)
    conn.disconnect()
    assert seen.bodies["star"] == ["/topic/prices.ibm=prices.ibm", "/topic/prices.sun=last",
                                   "/topic/prices.after=after", "/topic/prices.sun=fence"]
    assert seen.bodies["rest"] == ["/topic/prices.ibm=prices.ibm",
                                   "/topic/prices.ibm.eu=prices.ibm.eu",
                                   "/topic/prices.sun=last"]


def test_a_wildcard_never_reaches_a_topic_its_user_may_not_read(broker_factory) -> None:
    b = reader_and_writer(broker_factory, """
[[security.acl]]
destination = "/topic/orders.>"
write = ["writer"]
[[security.acl]]
destination = "/topic/orders.us"
read = ["reader"]
""")
    reader, seen = stomp_client(b, "reader", "r-pw")
    reader.subscribe("/topic/orders.>", id="all", headers={"receipt": "sub"})
    seen.wait("sub")
    writer, done = stomp_client(b, "writer", "w-pw")
    writer.send("/topic/orders.eu", "secret")
    writer.send("/topic/orders.us", "public", receipt="sent")
    done.wait("sent")
    reader.subscribe("/topic/orders.us", id="sync", headers={"receipt": "sync"})
    seen.wait("sync")
    writer.send("/topic/orders.us", "fence", receipt="fence")
    done.wait("fence")
    assert seen.fenced.wait(10)
    reader.disconnect()
    writer.disconnect()
    assert seen.bodies["all"] == ["/topic/orders.us=public", "/topic/orders.us=fence"]
    assert done.errors == [] and seen.errors == []


def test_a_bad_wildcard_is_refused_clearly(broker) -> None:
    c = connect(broker)
    for i, dest in enumerate(("/topic/a.>.b", "/queue/a.>.b", "/queue/a,/queue/b.>.c")):
        c.send("SUBSCRIBE", {"destination": dest, "id": f"bad{i}"})
        assert "invalid wildcard" in c.recv().headers["message"]
    c.send("SUBSCRIBE", {"destination": "/queue/a,/queue/b", "id": "d", "ack": "client",
                         "activemq.subscriptionName": "x"})
    assert "one topic" in c.recv().headers["message"]
    c.send("SUBSCRIBE", {"destination": "/queue/ok", "id": "ok", "receipt": "ok"})
    assert c.recv().headers["receipt-id"] == "ok"  # the connection still serves


def send_all(c: RawStomp, *destinations: str) -> None:
    """One persistent message to each destination (its body names it), receipted."""
    for i, dest in enumerate(destinations):
        c.send("SEND", {"destination": dest, "persistent": "true", "receipt": f"p{i}"},
               dest.encode())
        assert c.recv().headers["receipt-id"] == f"p{i}"


def test_a_composite_subscribe_consumes_from_each_destination(broker) -> None:
    """SUBSCRIBE /queue/a,/queue/b,/topic/c: one subscription id, a MESSAGE per destination
    naming it, each acknowledged on its own; UNSUBSCRIBE ends all three."""
    c, producer = connect(broker), connect(broker)
    send_all(producer, "/queue/ca", "/queue/cb")
    c.send("SUBSCRIBE", {"destination": "/queue/ca,cb,/topic/cc", "id": "all",
                         "ack": "client-individual", "receipt": "s"})
    frames = [c.recv() for _ in range(3)]  # the RECEIPT, and a MESSAGE from each queue
    assert sorted(f.command for f in frames) == ["MESSAGE", "MESSAGE", "RECEIPT"]
    send_all(producer, "/topic/cc")
    frames = [f for f in frames if f.command == "MESSAGE"] + [c.recv()]
    assert sorted(f.body for f in frames) == [b"/queue/ca", b"/queue/cb", b"/topic/cc"]
    for f in frames:
        assert f.headers["subscription"] == "all"
        assert f.headers["destination"] == f.body.decode()
        c.send("ACK", {"id": f.headers["ack"], "receipt": f"a-{f.body.decode()}"})
        assert c.recv().headers["receipt-id"] == f"a-{f.body.decode()}"
    c.send("UNSUBSCRIBE", {"id": "all", "receipt": "u"})
    assert c.recv().headers["receipt-id"] == "u"
    send_all(producer, "/queue/ca", "/topic/cc")
    c.send("SUBSCRIBE", {"destination": "/queue/fence", "id": "f", "receipt": "f"})
    assert c.recv().command == "RECEIPT"  # nothing came after the UNSUBSCRIBE
    assert drain_one(c, "/queue/ca", "later") == b"/queue/ca"  # left for other consumers


def test_a_queue_wildcard_consumes_matching_queues_now_and_later(broker) -> None:
    """`>` the rest (also nothing: orders.> takes orders, as ActiveMQ), `*` one segment;
    queues created after the SUBSCRIBE join it; MESSAGEs name the concrete queue."""
    producer, c = connect(broker), connect(broker)
    send_all(producer, "/queue/orders.eu", "/queue/orders.us.west", "/queue/other.eu")
    c.send("SUBSCRIBE", {"destination": "/queue/orders.>", "id": "rest", "receipt": "r"})
    first = sorted(c.recv().body for _ in range(3))  # two MESSAGEs and the RECEIPT
    assert first == [b"", b"/queue/orders.eu", b"/queue/orders.us.west"]
    send_all(producer, "/queue/orders.asia", "/queue/orders")
    later = [c.recv() for _ in range(2)]
    assert sorted(f.body for f in later) == [b"/queue/orders", b"/queue/orders.asia"]
    assert {f.headers["destination"] for f in later} == {"/queue/orders", "/queue/orders.asia"}
    c.send("UNSUBSCRIBE", {"id": "rest", "receipt": "u"})
    assert c.recv().headers["receipt-id"] == "u"
    send_all(producer, "/queue/orders.eu", "/queue/orders.us.west")
    c.send("SUBSCRIBE", {"destination": "/queue/orders.*", "id": "star", "receipt": "s",
                         "ack": "client-individual"})
    frames = [c.recv() for _ in range(2)]
    assert sorted(f.body for f in frames) == [b"", b"/queue/orders.eu"]  # not us.west
    c.send("SUBSCRIBE", {"destination": "/queue/fence", "id": "f", "receipt": "f"})
    assert c.recv().command == "RECEIPT"
    assert drain_one(producer, "/queue/orders.us.west", "w") == b"/queue/orders.us.west"


def test_a_queue_wildcard_never_reaches_a_queue_its_user_may_not_read(broker_factory) -> None:
    b = reader_and_writer(broker_factory, """
[[security.acl]]
destination = "/queue/orders.>"
write = ["writer"]
[[security.acl]]
destination = "/queue/orders.us"
read = ["reader"]
[[security.acl]]
destination = "/queue/orders.asia"
read = ["reader"]
[[security.acl]]
destination = "/queue/fence"
read = ["reader"]
write = ["writer"]
""")
    writer, done = stomp_client(b, "writer", "w-pw")
    writer.send("/queue/orders.eu", "secret")
    writer.send("/queue/orders.us", "public", receipt="sent")
    done.wait("sent")
    reader, seen = stomp_client(b, "reader", "r-pw")
    reader.subscribe("/queue/orders.>", id="all", headers={"receipt": "sub"})
    seen.wait("sub")
    writer.send("/queue/orders.eu", "secret later")
    writer.send("/queue/orders.asia", "new queue", receipt="sent2")
    done.wait("sent2")
    reader.subscribe("/queue/fence", id="sync", headers={"receipt": "sync"})
    seen.wait("sync")
    writer.send("/queue/fence", "fence", receipt="fence")  # delivered after all of the above
    done.wait("fence")
    assert seen.fenced.wait(10)
    reader.disconnect()
    assert sorted(seen.bodies["all"]) == ["/queue/orders.asia=new queue",
                                          "/queue/orders.us=public"]
    assert seen.errors == [] and done.errors == []


def connect_as(b: BrokerProcess, login: str, passcode: str) -> RawStomp:
    c = RawStomp(b.host, b.port)
    c.send("CONNECT", {"accept-version": "1.2", "host": "localhost", "login": login,
                       "passcode": passcode, "client-id": login})
    assert c.recv().command == "CONNECTED"
    return c


def durable_pattern(c: RawStomp, pattern: str, receipt: str) -> None:
    c.send("SUBSCRIBE", {"destination": pattern, "id": "d", "ack": "client-individual",
                         "activemq.subscriptionName": "watch", "receipt": receipt})


def test_a_durable_wildcard_subscription_keeps_what_came_while_away_across_kill_9(
        broker) -> None:
    """Topics that match, existing or new (before and after a restart), are kept for the
    subscription while its client is away; it gets them in order when it comes back."""
    c = connect_as(broker, "anyone", "x")
    durable_pattern(c, "/topic/prices.>", "s")
    assert c.recv().headers["receipt-id"] == "s"
    c.close()
    other = connect(broker)
    send_all(other, "/topic/prices.ibm", "/topic/orders.x", "/topic/prices.ibm.eu")
    broker.kill()
    broker.restart()
    other = connect(broker)
    send_all(other, "/topic/prices.new")
    c = connect_as(broker, "anyone", "x")
    durable_pattern(c, "/topic/prices.>", "again")
    frames = [c.recv() for _ in range(4)]
    assert [f.body for f in frames if f.command == "MESSAGE"] == [
        b"/topic/prices.ibm", b"/topic/prices.ibm.eu", b"/topic/prices.new"]
    for f in frames:
        if f.command == "MESSAGE":
            assert f.headers["destination"] == f.body.decode()
            c.send("ACK", {"id": f.headers["ack"]})
    c.send("UNSUBSCRIBE", {"id": "d", "activemq.subscriptionName": "watch", "receipt": "u"})
    assert c.recv().headers["receipt-id"] == "u"


def test_a_durable_wildcard_keeps_only_what_its_owner_may_read_across_a_restart(
        broker_factory) -> None:
    b = reader_and_writer(broker_factory, """
[[security.acl]]
destination = "/topic/orders.>"
write = ["writer"]
[[security.acl]]
destination = "/topic/orders.us"
read = ["reader"]
""")
    c = connect_as(b, "reader", "r-pw")
    durable_pattern(c, "/topic/orders.>", "s")
    assert c.recv().headers["receipt-id"] == "s"
    c.close()
    writer = connect_as(b, "writer", "w-pw")
    send_all(writer, "/topic/orders.eu", "/topic/orders.us")
    b.kill()
    b.restart()
    writer = connect_as(b, "writer", "w-pw")
    send_all(writer, "/topic/orders.eu", "/topic/orders.us")
    c = connect_as(b, "reader", "r-pw")
    durable_pattern(c, "/topic/orders.>", "again")
    frames = [c.recv() for _ in range(3)]
    assert sorted(f.body for f in frames) == [b"", b"/topic/orders.us", b"/topic/orders.us"]


def test_a_virtual_topic_gives_each_consumer_group_its_own_copy(broker) -> None:
    """SEND to /topic/VirtualTopic.orders: every /queue/Consumer.<group>.VirtualTopic.orders
    gets a copy (persistent: one transaction), shared by that group's consumers; a plain
    topic subscriber still gets its own."""
    a1, a2, b1, topic_sub, producer = (connect(broker) for _ in range(5))
    for c, dest, sid in ((a1, "/queue/Consumer.A.VirtualTopic.orders", "a1"),
                         (a2, "/queue/Consumer.A.VirtualTopic.orders", "a2"),
                         (b1, "/queue/Consumer.B.VirtualTopic.orders", "b1"),
                         (topic_sub, "/topic/VirtualTopic.orders", "t")):
        c.send("SUBSCRIBE", {"destination": dest, "id": sid, "receipt": sid})
        assert c.recv().headers["receipt-id"] == sid
    for i in range(4):
        producer.send("SEND", {"destination": "/topic/VirtualTopic.orders", "n": str(i),
                               "persistent": "true", "receipt": str(i)})
        assert producer.recv().headers["receipt-id"] == str(i)
    got_b = [b1.recv().headers["n"] for _ in range(4)]
    got_t = [topic_sub.recv().headers["n"] for _ in range(4)]
    got_a = [a1.recv().headers["n"] for _ in range(2)] + [a2.recv().headers["n"]
                                                          for _ in range(2)]
    assert got_b == got_t == ["0", "1", "2", "3"]
    assert sorted(got_a) == ["0", "1", "2", "3"]  # group A shares its copy


def test_a_virtual_topics_group_queue_keeps_its_copies_while_its_consumers_are_away(
        broker) -> None:
    c = connect(broker)
    c.send("SUBSCRIBE", {"destination": "/queue/Consumer.A.VirtualTopic.x", "id": "s",
                         "receipt": "s"})
    assert c.recv().headers["receipt-id"] == "s"
    c.send("UNSUBSCRIBE", {"id": "s", "receipt": "u"})
    assert c.recv().headers["receipt-id"] == "u"
    c.send("SEND", {"destination": "/topic/VirtualTopic.x", "persistent": "true",
                    "receipt": "r"}, b"kept")
    assert c.recv().headers["receipt-id"] == "r"
    broker.kill()
    broker.restart()
    c = connect(broker)
    assert drain_one(c, "/queue/Consumer.A.VirtualTopic.x", "again") == b"kept"


def test_request_reply_over_a_temporary_queue_with_stomp_py(broker) -> None:
    """The requester's /temp-queue/ is its own; the reply-to the service sees is rewritten to
    an address any connection can SEND to; only the requester may consume it; it goes away
    with the requester's connection."""
    requester, replies = stomp_client(broker)
    requester.subscribe("/temp-queue/replies", id="r", headers={"receipt": "sub"})
    replies.wait("sub")
    service, requests = stomp_client(broker)
    got_request = threading.Event()
    reply_to: list[str] = []

    class Service(stomp.ConnectionListener):
        def on_message(self, frame: stomp.utils.Frame) -> None:
            reply_to.append(frame.headers["reply-to"])
            service.send(frame.headers["reply-to"], f"re: {frame.body}")
            got_request.set()

    service.set_listener("svc", Service())
    service.subscribe("/queue/service", id="s", headers={"receipt": "svc"})
    requests.wait("svc")
    requester.send("/queue/service", "ping", headers={"reply-to": "/temp-queue/replies"},
                   receipt="sent")
    replies.wait("sent")
    assert got_request.wait(10)
    assert reply_to[0].startswith("/remote-temp-queue/")

    thief, seen = stomp_client(broker)
    thief.subscribe(reply_to[0], id="steal")
    assert seen.errored.wait(10)
    assert "only the connection" in seen.errors[0]
    thief.disconnect()

    assert replies.first("r").endswith("=re: ping")
    requester.disconnect()
    late = connect(broker)
    late.send("SEND", {"destination": reply_to[0], "receipt": "late"}, b"too late")
    frame = late.recv()
    assert frame.command == "ERROR" and "does not exist" in frame.headers["message"]
    service.disconnect()


def test_two_connections_temporary_queues_of_the_same_name_are_two_queues(broker) -> None:
    a, b = connect(broker), connect(broker)
    for c, body in ((a, b"for a"), (b, b"for b")):
        c.send("SEND", {"destination": "/temp-queue/mine", "receipt": "r"}, body)
        assert c.recv().headers["receipt-id"] == "r"
    a.send("SUBSCRIBE", {"destination": "/temp-queue/mine", "id": "x"})
    b.send("SUBSCRIBE", {"destination": "/temp-queue/mine", "id": "x"})
    assert a.recv().body == b"for a" and b.recv().body == b"for b"


def test_expired_persistent_messages_go_to_the_dlq_by_policy(broker_factory) -> None:
    """ActiveMQ's processExpired: with dead_letter_expired, an expired persistent message is
    moved to DLQ.<name> with the reason, and does not expire there; without it, dropped."""
    b = broker_factory(config_text='[[policy]]\nqueue = "keep.>"\ndead_letter_expired = true\n')
    c = connect(b)
    past = str(int(time.time() * 1000) - 1000)
    for dest in ("/queue/keep.orders", "/queue/drop.orders"):
        c.send("SEND", {"destination": dest, "persistent": "true", "expires": past,
                        "receipt": dest}, b"late")
        assert c.recv().headers["receipt-id"] == dest
    for i, dest in enumerate(("/queue/keep.orders", "/queue/drop.orders")):
        c.send("SUBSCRIBE", {"destination": dest, "id": f"s{i}", "receipt": f"s{i}"})
        assert c.recv().headers["receipt-id"] == f"s{i}"  # the pass that expires them ran
    c.send("SUBSCRIBE", {"destination": "/queue/DLQ.keep.orders", "id": "dlq"})
    dead = c.recv()
    assert (dead.body, dead.headers["sluice-dlq-reason"], dead.headers["expires"],
            dead.headers["sluice-dlq-origin"]) == (b"late", "expired", "0", "/queue/keep.orders")
    c.send("SUBSCRIBE", {"destination": "/queue/DLQ.drop.orders", "id": "none",
                         "receipt": "none"})
    frame = c.recv()
    assert frame.command == "RECEIPT"  # nothing was moved there: no MESSAGE before it


def watch_advisories(b: BrokerProcess, *topics: str) -> RawStomp:
    """A connection subscribed (receipted) to ``/topic/ActiveMQ.Advisory.<topic>`` for each."""
    watcher = connect(b)
    for i, topic in enumerate(topics):
        watcher.send("SUBSCRIBE", {"destination": f"/topic/ActiveMQ.Advisory.{topic}",
                                   "id": f"w{i}", "receipt": f"w{i}"})
        assert watcher.recv().headers["receipt-id"] == f"w{i}"
    return watcher


def test_advisories_tell_of_consumers_connections_and_dead_letters(broker_factory) -> None:
    """ActiveMQ.Advisory.Consumer.Queue.X, .Connection and .MessageDLQd.Queue.X, JSON bodies
    and the facts in headers; published only to whoever listens."""
    b = broker_factory(config_text='[[policy]]\nqueue = "adv.>"\nmax_redeliveries = 0\n')
    watcher = watch_advisories(b, "Consumer.Queue.adv.work", "Connection", "MessageDLQd.>")
    worker = connect(b)
    joined = watcher.recv()
    assert joined.headers["advisory-type"] == "ConnectionInfo"
    assert joined.headers["event"] == "added"
    worker.send("SUBSCRIBE", {"destination": "/queue/adv.work", "id": "job",
                              "ack": "client-individual", "receipt": "s"})
    assert worker.recv().headers["receipt-id"] == "s"
    added = watcher.recv()
    assert (added.headers["advisory-type"], added.headers["event"],
            added.headers["advisory-destination"], added.headers["advisory-subscription"]) == (
        "ConsumerInfo", "added", "/queue/adv.work", "job")
    assert json.loads(added.body)["destination"] == "/queue/adv.work"
    worker.send("SEND", {"destination": "/queue/adv.work", "receipt": "p"}, b"poison")
    assert worker.recv().headers["receipt-id"] == "p"
    msg = worker.recv()
    worker.send("NACK", {"id": msg.headers["ack"]})  # no redeliveries allowed: to the DLQ
    dead = watcher.recv()
    assert (dead.headers["advisory-type"], dead.headers["dlq"]) == (
        "MessageDLQd", "/queue/DLQ.adv.work")
    worker.send("UNSUBSCRIBE", {"id": "job", "receipt": "u"})
    assert worker.recv().headers["receipt-id"] == "u"
    assert watcher.recv().headers["event"] == "removed"


def test_advisories_tell_of_new_and_temporary_destinations_and_expired_messages(broker) -> None:
    """ActiveMQ.Advisory.Queue / .TempQueue (added, then removed with its connection) and
    .Expired.Queue.X for a message that expired before anyone took it."""
    watcher = watch_advisories(broker, "Queue", "TempQueue", "Expired.Queue.adv.late")
    other = connect(broker)
    other.send("SEND", {"destination": "/queue/adv.fresh", "receipt": "1"}, b"x")
    created = watcher.recv()
    assert (created.headers["advisory-type"], created.headers["event"],
            created.headers["advisory-destination"]) == (
        "DestinationInfo", "added", "/queue/adv.fresh")
    assert other.recv().headers["receipt-id"] == "1"
    other.send("SUBSCRIBE", {"destination": "/temp-queue/replies", "id": "t", "receipt": "t"})
    temp = watcher.recv()
    assert temp.headers["event"] == "added"
    assert temp.headers["advisory-destination"].startswith("/queue/sluice.temp.")
    assert other.recv().headers["receipt-id"] == "t"
    other.send("SEND", {"destination": "/queue/adv.late", "expires": "1", "persistent": "true",
                        "receipt": "2"}, b"too late")
    assert watcher.recv().headers["advisory-destination"] == "/queue/adv.late"  # queue added
    assert other.recv().headers["receipt-id"] == "2"
    other.send("SUBSCRIBE", {"destination": "/queue/adv.late", "id": "l", "receipt": "l"})
    expired = watcher.recv()
    assert (expired.headers["advisory-type"], expired.headers["advisory-destination"]) == (
        "MessageExpired", "/queue/adv.late")
    assert json.loads(expired.body)["message-id"] == expired.headers["advisory-message-id"]
    other.send("DISCONNECT", {"receipt": "bye"})
    gone = watcher.recv()
    assert (gone.headers["event"], gone.headers["advisory-destination"]) == (
        "removed", temp.headers["advisory-destination"])


def test_advisories_tell_of_producers_and_slow_consumers(broker_factory) -> None:
    """.Producer.Queue.X when a connection first sends to X (not again) and when it goes;
    .SlowConsumer.Queue.X once for a consumer whose prefetch stayed full while messages
    waited for slow_consumer_seconds."""
    b = broker_factory(config_text="[advisories]\nslow_consumer_seconds = 1\n")
    watcher = watch_advisories(b, "Producer.Queue.adv.p", "SlowConsumer.Queue.adv.p")
    producer, consumer = connect(b), connect(b)
    consumer.send("SUBSCRIBE", {"destination": "/queue/adv.p", "id": "slow", "receipt": "s",
                                "ack": "client-individual", "activemq.prefetchSize": "1"})
    assert consumer.recv().headers["receipt-id"] == "s"
    send_all(producer, "/queue/adv.p", "/queue/adv.p", "/queue/adv.p")
    added = watcher.recv()
    assert (added.headers["advisory-type"], added.headers["event"],
            added.headers["advisory-destination"]) == ("ProducerInfo", "added", "/queue/adv.p")
    assert json.loads(added.body)["connection"] == added.headers["connection"]
    assert consumer.recv().command == "MESSAGE"  # and never acknowledged
    slow = watcher.recv(timeout=15)  # the broker looks once a second
    assert (slow.headers["advisory-type"], slow.headers["event"],
            slow.headers["advisory-subscription"], slow.headers["prefetch"],
            slow.headers["inflight"], slow.headers["pending"]) == (
        "ConsumerInfo", "slow", "slow", "1", "1", "2")
    assert (slow.headers["destination"], slow.headers["subscription"]) == (
        "/topic/ActiveMQ.Advisory.SlowConsumer.Queue.adv.p", "w1")  # the watcher's own
    producer.send("DISCONNECT", {"receipt": "bye"})
    gone = watcher.recv(timeout=15)  # not a second slow advisory, not a second 'added'
    assert (gone.headers["advisory-type"], gone.headers["event"]) == ("ProducerInfo", "removed")


def test_advisories_can_be_switched_off(broker_factory) -> None:
    b = broker_factory(config_text="[advisories]\nenabled = false\n")
    watcher = connect(b)
    for i, topic in enumerate(("Connection", "Producer.>", "SlowConsumer.>")):
        watcher.send("SUBSCRIBE", {"destination": f"/topic/ActiveMQ.Advisory.{topic}",
                                   "id": f"w{i}", "receipt": f"w{i}"})
        assert watcher.recv().headers["receipt-id"] == f"w{i}"
    send_all(connect(b), "/queue/quiet")
    watcher.send("SUBSCRIBE", {"destination": "/queue/fence", "id": "f", "receipt": "f"})
    assert watcher.recv().command == "RECEIPT"  # no advisory came before it
