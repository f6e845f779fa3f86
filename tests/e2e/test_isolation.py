"""Spec of isolation between users (issue #16): with security on, one ordinary user can neither
read, destroy nor redirect another's data, and every such attempt is refused with an ERROR that
says why.

Two ordinary accounts, ``app-a`` and ``app-b``, share the ``/queue/orders.>`` queues (both may
read and write there) and each has a queue of its own; ``olga`` administers the broker.
"""

from __future__ import annotations

import asyncio
import base64
import socket
import time
import urllib.error
import urllib.request
from typing import Any

import aiohttp
import pytest
from accounts import Accounts

from sluice_testing import held
from sluicemq import Client, ClientError
from sluicemq.core.streams.chunks import FINAL, NAME, OFFSET, QUERY, SEQ, SIZE, STREAM_ID
from sluicemq.protocol.codec import FrameParser, encode_frame
from sluicemq.protocol.frames import Frame

ACCOUNTS = Accounts({"app-a": ("a-pw", ["apps"]), "app-b": ("b-pw", ["apps"]),
                     "olga": ("olga-pw", ["admins"])})
USERS = ACCOUNTS.users
DELAY = 0.1
RULES = """
[[security.acl]]
destination = "/queue/orders.>"
read = ["apps"]
write = ["apps"]

[[security.acl]]
destination = "/queue/a.>"
read = ["app-a"]
write = ["app-a"]

[[security.acl]]
destination = "/queue/b.>"
read = ["app-b"]
write = ["app-b"]

[[security.acl]]
destination = "/topic/news.>"
read = ["apps"]
write = ["apps"]

[[security.acl]]
destination = ">"
admin = ["admins"]
"""


def config(extra_security: str = "", max_failures: int = 10) -> str:
    return ACCOUNTS.config(RULES, delay=DELAY, max_failures=max_failures, extra=extra_security)


@pytest.fixture
def secured(broker_factory: Any) -> Any:
    return broker_factory(config_text=config())


login = ACCOUNTS.login


class Raw:
    """A bare STOMP 1.2 connection, to see every header of every RECEIPT and ERROR."""

    def __init__(self, b: Any, user: str | None, **headers: str) -> None:
        self.sock = socket.create_connection((b.host, b.port), timeout=10)
        self.parser = FrameParser(version="1.2")
        self.frames: list[Frame] = []
        h = {"accept-version": "1.2", "host": "localhost", **headers}
        if user is not None:
            h.update(login=user, passcode=USERS[user][0])
        self.connected = self.request(Frame("CONNECT", h))

    def request(self, frame: Frame) -> Frame:
        """Send one frame and return the broker's answer (a receipt is asked for)."""
        if frame.command != "CONNECT":
            frame.headers.setdefault("receipt", f"r{time.monotonic_ns()}")
        self.sock.sendall(encode_frame(frame, "1.2"))
        return self.recv()

    def recv(self, timeout: float = 10) -> Frame:
        deadline = time.monotonic() + timeout
        while not self.frames:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed")
            self.frames.extend(self.parser.feed(data))
        return self.frames.pop(0)

    def chunk(self, dest: str, sid: str, seq: int, body: bytes, final: bool = False) -> Frame:
        h = {"destination": dest, STREAM_ID: sid, "JMSXGroupID": sid, SEQ: str(seq),
             OFFSET: str(seq * len(body)), NAME: "orders.csv", "persistent": "true"}
        if final:
            h.update({FINAL: "true", SIZE: str((seq + 1) * len(body))})
        return self.request(Frame("SEND", h, body))

    def close(self) -> None:
        self.sock.close()


def refused(frame: Frame, why: str) -> None:
    assert frame.command == "ERROR", frame
    assert why in frame.headers["message"], frame.headers["message"]


def drain(c: Client, dest: str) -> list[bytes]:
    """Everything the queue holds, each message awaited (the broker says how many)."""
    return held(c, dest)


def stage(c: Client, batch: str, part: str, bodies: list[str], dest: str,
          sink: str = "orders-sink") -> None:
    with c.stage(sink, batch, part) as p:
        for body in bodies:
            p.send(dest, body.encode())
    assert (p.result, p.messages) == ("staged", len(bodies))


# -- staged batches --------------------------------------------------------------------------
def test_an_empty_publication_by_another_user_does_not_swallow_a_batch(secured: Any) -> None:
    """app-b publishing orders-sink/17 with no parts publishes app-b's own (empty) batch;
    app-a's batch of the same name is still app-a's to publish, and its rows appear."""
    with login(secured, "app-b") as b:
        assert b.publish_stage("orders-sink", 17, []) == ("published", 0)
    with login(secured, "app-a") as a:
        stage(a, "17", "p0", ["row1", "row2"], "/queue/orders.in")
        assert a.publish_stage("orders-sink", 17, ["p0"]) == ("published", 2)
        assert drain(a, "/queue/orders.in") == [b"row1", b"row2"]


def test_a_part_staged_under_another_users_part_name_does_not_redirect(secured: Any) -> None:
    """app-b staging ``p0`` of app-a's batch parks app-b's own part: app-a's publication still
    sends app-a's rows where app-a sent them; app-b cannot publish app-a's part."""
    with login(secured, "app-a") as a, login(secured, "app-b") as b:
        stage(a, "17", "p0", ["a-row"], "/queue/orders.in")
        stage(a, "17", "p1", ["a-row-2"], "/queue/orders.in")
        stage(b, "17", "p0", ["b-row"], "/queue/b.inbox")
        with pytest.raises(ClientError, match="no part p1 staged by user 'app-b'"):
            b.publish_stage("orders-sink", 17, ["p1"])
        assert a.publish_stage("orders-sink", 17, ["p0", "p1"]) == ("published", 2)
        assert drain(a, "/queue/orders.in") == [b"a-row", b"a-row-2"]
        assert drain(b, "/queue/b.inbox") == []


def test_another_user_cannot_discard_a_staged_batch(secured: Any) -> None:
    """An abort discards only the sender's own parts of that batch name."""
    with login(secured, "app-a") as a, login(secured, "app-b") as b:
        stage(a, "18", "p0", ["kept"], "/queue/orders.in")
        assert b.abort_stage("orders-sink", 18) == 0
        assert a.publish_stage("orders-sink", 18, ["p0"]) == ("published", 1)
        assert drain(a, "/queue/orders.in") == [b"kept"]


def test_staged_parts_keep_their_owner_across_a_crash(secured: Any) -> None:
    """The owner is journaled with the part and the publication: after kill -9 (journal
    replay) and after a clean stop (index snapshot) app-b still cannot publish app-a's part,
    and app-a's memory of a published batch is app-a's alone."""
    with login(secured, "app-a") as a:
        stage(a, "19", "p0", ["durable"], "/queue/orders.in")
        stage(a, "20", "p0", ["once"], "/queue/orders.in")
        assert a.publish_stage("orders-sink", 20, ["p0"]) == ("published", 1)
    secured.kill()
    secured.restart()
    with login(secured, "app-b") as b:
        with pytest.raises(ClientError, match="no part p0 staged by user 'app-b'"):
            b.publish_stage("orders-sink", 19, ["p0"])
        assert b.publish_stage("orders-sink", 20, []) == ("published", 0)
    with login(secured, "app-a") as a:
        assert a.publish_stage("orders-sink", 19, ["p0"]) == ("published", 1)
        assert a.publish_stage("orders-sink", 20, ["p0"]) == ("duplicate", 1)
        assert drain(a, "/queue/orders.in") == [b"once", b"durable"]
        stage(a, "21", "p0", ["snapshotted"], "/queue/orders.in")
    secured.stop()  # a clean stop: the parked part comes back from the index snapshot
    secured.restart()
    with login(secured, "app-b") as b, pytest.raises(ClientError, match="staged by user"):
        b.publish_stage("orders-sink", 21, ["p0"])
    with login(secured, "app-a") as a:
        assert a.publish_stage("orders-sink", 21, ["p0"]) == ("published", 1)
        assert a.publish_stage("orders-sink", 20, []) == ("duplicate", 1)


def test_batches_from_before_owners_stay_exactly_once(broker_factory: Any) -> None:
    """Records without an owner (security off writes them exactly as before owners existed)
    stay visible to every user once security is turned on: a published batch is still a
    duplicate, a parked part still publishes."""
    b = broker_factory(config_text="")
    with Client(b.url, timeout=10) as c:
        stage(c, "1", "p0", ["published before"], "/queue/orders.in")
        assert c.publish_stage("orders-sink", 1, ["p0"]) == ("published", 1)
        stage(c, "2", "p0", ["parked before"], "/queue/orders.in")
    b.kill()
    b.config_path.write_text(config())
    b.restart()
    with login(b, "app-a") as a:
        assert a.publish_stage("orders-sink", 1, ["p0"]) == ("duplicate", 1)
        assert a.publish_stage("orders-sink", 2, ["p0"]) == ("published", 1)
        assert drain(a, "/queue/orders.in") == [b"published before", b"parked before"]


# -- streams ---------------------------------------------------------------------------------
def test_stream_progress_is_private_to_its_destination(secured: Any) -> None:
    """A stream is known by destination and id: app-b asking about, or sending chunks of,
    app-a's stream through app-b's own queue meets a stream that does not exist there; app-a's
    chunks are all stored."""
    a, b = Raw(secured, "app-a"), Raw(secured, "app-b")
    try:
        assert a.chunk("/queue/orders.files", "s-17", 0, b"aaaa").command == "RECEIPT"
        answer = b.request(Frame("SEND", {"destination": "/queue/b.inbox", QUERY: "s-17"}))
        assert answer.headers["sluice-stream-state"] == "unknown"
        refused(b.chunk("/queue/b.inbox", "s-17", 1, b"bbbb"), "must start at sequence 0")
        stored = a.chunk("/queue/orders.files", "s-17", 1, b"aaaa", final=True)
        assert stored.command == "RECEIPT" and "sluice-stream-duplicate" not in stored.headers
    finally:
        a.close()
        b.close()
    with login(secured, "app-a") as c:
        assert drain(c, "/queue/orders.files") == [b"aaaa", b"aaaa"]


def test_another_users_chunks_and_queries_on_a_shared_queue_are_refused(secured: Any) -> None:
    """On a queue both may write, a stream belongs to the user who sent its first chunk."""
    a, b = Raw(secured, "app-a"), Raw(secured, "app-b")
    try:
        assert a.chunk("/queue/orders.files", "s-18", 0, b"a0").command == "RECEIPT"
        refused(b.chunk("/queue/orders.files", "s-18", 1, b"b1"), "belongs to another user")
        refused(b.request(Frame("SEND", {"destination": "/queue/orders.files", QUERY: "s-18"})),
                "belongs to another user")
        # a message that would finish app-a's stream when consumed: under another stream id,
        refused(b.request(Frame("SEND", {"destination": "/queue/orders.files", STREAM_ID: "mine",
                                         "JMSXGroupID": "s-18", SEQ: "0", FINAL: "true",
                                         SIZE: "1"}, b"x")), "belongs to another user")
        refused(b.request(Frame("SEND", {"destination": "/queue/orders.files", STREAM_ID: "mine",
                                         "JMSXGroupID": "other", SEQ: "0"}, b"x")),
                "must be the stream id")
        # or inside a transaction, where chunks are not checked in sequence
        assert b.request(Frame("BEGIN", {"transaction": "t"})).command == "RECEIPT"
        refused(b.request(Frame("SEND", {"destination": "/queue/orders.files", STREAM_ID: "s-18",
                                         "JMSXGroupID": "s-18", SEQ: "1", FINAL: "true",
                                         "transaction": "t"}, b"x")), "belongs to another user")
        answer = a.request(Frame("SEND", {"destination": "/queue/orders.files", QUERY: "s-18"}))
        assert answer.headers["sluice-stream-next-seq"] == "1"
        assert a.chunk("/queue/orders.files", "s-18", 1, b"a1", final=True).command == "RECEIPT"
    finally:
        a.close()
        b.close()
    with login(secured, "app-a") as c:
        assert drain(c, "/queue/orders.files") == [b"a0", b"a1"]


# -- client ids ------------------------------------------------------------------------------
def test_a_client_id_held_by_another_user_does_not_lock_its_owner_out(secured: Any) -> None:
    """With security on a client id is each user's own: app-b holding ``svc-a`` neither blocks
    app-a's connection nor gets at app-a's durable subscription under that id."""
    with login(secured, "app-a", client_id="svc-a") as a:
        a.subscribe("/topic/news.eu", durable_name="feed").unsubscribe()
    squatter = Raw(secured, "app-b", **{"client-id": "svc-a"})
    try:
        assert squatter.connected.command == "CONNECTED"
        with login(secured, "app-a", client_id="svc-a") as a:
            twin = Raw(secured, "app-a", **{"client-id": "svc-a"})
            refused(twin.connected, "already connected")  # still one connection per user
            twin.close()
            refused(squatter.request(Frame("SUBSCRIBE", {
                "destination": "/topic/news.eu", "id": "1",
                "activemq.subscriptionName": "feed"})), "belongs to another user")
            a.send("/topic/news.eu", b"for app-a")
            assert a.subscribe("/topic/news.eu", durable_name="feed").get(5).body == b"for app-a"
    finally:
        squatter.close()


# -- login throttle --------------------------------------------------------------------------
def http_get(url: str, user: str | None = None) -> int:
    headers = {}
    if user is not None:
        token = base64.b64encode(f"{user}:{USERS[user][0]}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=15) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_anonymous_failures_do_not_lock_users_out(secured: Any) -> None:
    """Failed logins are counted per (address, login name): a dozen anonymous GET /metrics
    from an address leave its users free to log in over STOMP and HTTP."""
    for _ in range(12):
        assert http_get(f"{secured.console_url}/metrics") == 401
    with login(secured, "app-a") as a:
        a.send("/queue/orders.in", b"still in")
    assert http_get(f"{secured.console_url}/metrics", "olga") == 200


def test_a_burst_of_wrong_logins_is_checked_only_up_to_the_limit(secured: Any) -> None:
    """200 concurrent CONNECTs with wrong passwords for app-b: checks in progress count as
    failures, so 10 (max-login-failures) are checked and 190 refused unchecked; app-a's login
    from the same address meanwhile is neither locked out nor "busy"."""
    socks = []
    for i in range(200):
        sock = socket.create_connection((secured.host, secured.port), timeout=30)
        sock.sendall(encode_frame(Frame("CONNECT", {
            "accept-version": "1.2", "host": "localhost", "login": "app-b",
            "passcode": f"guess-{i}"}), "1.2"))
        socks.append(sock)
    try:
        legit = Raw(secured, "app-a")
        assert legit.connected.command == "CONNECTED"
        legit.close()
        reasons = []
        for sock in socks:
            parser = FrameParser(version="1.2")
            frames: list[Frame] = []
            while not frames:
                data = sock.recv(65536)
                assert data, "closed without an ERROR"
                frames = parser.feed(data)
            reasons.append(frames[0].headers["message"])
    finally:
        for sock in socks:
            sock.close()
    assert reasons.count("invalid login or passcode") == 10
    assert reasons.count("too many failed logins; try again later") == 190


# -- dead-letter queues ----------------------------------------------------------------------
def kill_one(b: Any, user: str, dest: str, body: bytes) -> None:
    """Send a message and NACK it past max-redeliveries (1): it moves to the DLQ."""
    with login(b, user) as c:
        c.send(dest, body)
        with c.subscribe(dest, ack="client") as sub:
            for _ in range(2):
                msg = sub.get(timeout=5)
                assert msg is not None and msg.body == body
                msg.nack(receipt=True)


def test_a_dlq_can_be_read_by_whoever_reads_its_origin(broker_factory: Any) -> None:
    """Readers of orders.> read /queue/DLQ.orders.*; a DLQ of someone else's queue stays
    closed, saying why."""
    b = broker_factory(config_text=config() + "\n[defaults]\nmax-redeliveries = 1\n")
    kill_one(b, "app-a", "/queue/orders.pay", b"died")
    kill_one(b, "app-a", "/queue/a.private", b"private")
    with login(b, "app-b") as c:
        assert drain(c, "/queue/DLQ.orders.pay") == [b"died"]
        with pytest.raises(ClientError, match=r"not authorized to read /queue/DLQ\.a\.private"):
            c.subscribe("/queue/DLQ.a.private")
    with login(b, "app-a") as a:
        assert drain(a, "/queue/DLQ.a.private") == [b"private"]


def test_dlq_rights_can_be_left_to_explicit_rules(broker_factory: Any) -> None:
    b = broker_factory(config_text=config("dlq-follows-origin = false")
                       + "\n[defaults]\nmax-redeliveries = 1\n")
    kill_one(b, "app-a", "/queue/orders.pay", b"died")
    with login(b, "app-a") as a, pytest.raises(ClientError, match="not authorized to read"):
        a.subscribe("/queue/DLQ.orders.pay")


# -- WebSocket -------------------------------------------------------------------------------
def ws_upgrade(url: str, origin: str | None, host: str | None = None) -> int | str:
    """Open STOMP over WebSocket with this Origin: "CONNECTED" or the refusing HTTP status."""
    async def main() -> int | str:
        headers = {"Origin": origin} if origin else {}
        if host is not None:
            headers["Host"] = host
        async with aiohttp.ClientSession() as http:
            try:
                async with http.ws_connect(f"{url}/stomp", protocols=("v12.stomp",),
                                           headers=headers) as ws:
                    await ws.send_str(encode_frame(Frame("CONNECT", {
                        "accept-version": "1.2", "host": "localhost"}), "1.2").decode())
                    msg = await ws.receive(timeout=10)
                    return str(msg.data).split("\n", 1)[0]
            except aiohttp.WSServerHandshakeError as exc:
                return exc.status

    return asyncio.run(main())


def test_websocket_upgrades_from_other_sites_are_refused(broker_factory: Any) -> None:
    """An open broker is the target: a page elsewhere must not drive the operator's browser
    into it. Its own origin, listed origins and non-browser clients (no Origin) get in."""
    b = broker_factory(config_text='[security]\nwebsocket-origins = ["https://ops.example"]\n')
    own = b.ws_url.replace("ws://", "http://")
    assert ws_upgrade(b.ws_url, "https://evil.example") == 403
    assert ws_upgrade(b.ws_url, "null") == 403
    assert ws_upgrade(b.ws_url, own) == "CONNECTED"
    assert ws_upgrade(b.ws_url, "https://ops.example") == "CONNECTED"
    assert ws_upgrade(b.ws_url, None) == "CONNECTED"
    assert ws_upgrade(b.ws_url, None, host="rebound.example") == 403  # DNS rebinding
    b.wait_for_log("WebSocket upgrade refused")
