"""Spec of authentication and authorization over real STOMP connections.

A broker with three users and ActiveMQ-style rules; every refusal below is a bypass attempt
that must fail, and every grant must keep working.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from accounts import Accounts

from sluicemq.client import Client
from sluicemq.core.streams.chunks import OFFSET, SEQ, STREAM_ID
from sluicemq.errors import ClientError
from sluicemq.protocol.codec import FrameParser, encode_frame
from sluicemq.protocol.frames import Frame

ACCOUNTS = Accounts({"app": ("app-pw", ["apps"]), "olga": ("olga-pw", ["admins"]),
                     "rita": ("rita-pw", ["readers"])})
USERS = ACCOUNTS.users
DELAY = 0.3
RULES = """
[[security.acl]]
destination = "/queue/orders.>"
read = ["apps", "readers"]
write = ["apps"]
admin = ["admins"]

[[security.acl]]
destination = "/topic/news.>"
read = ["*"]
write = ["olga"]

[[security.acl]]
destination = ">"
admin = ["admins"]
"""


def config(max_failures: int = 100) -> str:
    return ACCOUNTS.config(RULES, delay=DELAY, max_failures=max_failures)


@pytest.fixture
def secured(broker_factory: Any) -> Any:
    return broker_factory(config_text=config())


login = ACCOUNTS.login


class Raw:
    """A bare socket speaking STOMP 1.2 frames, for pipelining and header tricks."""

    def __init__(self, b: Any) -> None:
        self.sock = socket.create_connection((b.host, b.port), timeout=10)
        self.parser = FrameParser(version="1.2")
        self.frames: list[Frame] = []

    def send(self, *frames: Frame) -> None:
        self.sock.sendall(b"".join(encode_frame(f, "1.2") for f in frames))

    def recv(self, timeout: float = 10) -> Frame:
        deadline = time.monotonic() + timeout
        while not self.frames:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed")
            self.frames.extend(self.parser.feed(data))
        return self.frames.pop(0)


def connect_frame(user: str | None, passcode: str | None, **extra: str) -> Frame:
    h = {"accept-version": "1.2", "host": "localhost", **extra}
    if user is not None:
        h["login"] = user
    if passcode is not None:
        h["passcode"] = passcode
    return Frame("CONNECT", h)


# -- authentication --------------------------------------------------------------------------
def test_valid_login_connects(secured: Any) -> None:
    with login(secured, "app") as c:
        c.send("/queue/orders.a", b"x")


BAD_CREDENTIALS = [
    ("app", "wrong"), ("app", ""), ("app", None), ("nobody", "app-pw"), (None, None),
    ("APP", "app-pw"), ("app ", "app-pw"), ("olga", "app-pw"), ("app", "app-pw "),
    ("app", "APP-PW"), ("", ""), ("app:", "app-pw"),
]


def test_bad_or_missing_credentials_are_refused_late(secured: Any) -> None:
    def attempt(user: str | None, passcode: str | None) -> float:
        start = time.monotonic()
        with pytest.raises(ClientError) as info:
            Client(secured.url, login=user, passcode=passcode, timeout=10)
        assert "login" in str(info.value) or "authentication" in str(info.value)
        return time.monotonic() - start

    threads = []
    took: list[float] = []
    for user, passcode in BAD_CREDENTIALS:
        t = threading.Thread(target=lambda u=user, p=passcode: took.append(attempt(u, p)))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    assert len(took) == len(BAD_CREDENTIALS)
    assert min(took) >= DELAY * 0.9


def test_websocket_clients_log_in_with_connect_like_tcp_ones(secured: Any) -> None:
    """STOMP over WebSocket (aiohttp's client, as stomp.js would): CONNECT's login/passcode are
    checked the same way; a refusal is an ERROR, then the WebSocket closes."""
    async def connect(headers: dict[str, str]) -> tuple[str, str, aiohttp.WSMsgType]:
        async with aiohttp.ClientSession() as http, http.ws_connect(
                f"{secured.ws_url}/stomp", protocols=("v12.stomp",)) as ws:
            await ws.send_str(encode_frame(Frame("CONNECT", {
                "accept-version": "1.2", "host": "localhost", **headers}), "1.2").decode())
            frame = FrameParser(version="1.2").feed((await ws.receive(timeout=10)).data.encode())[0]
            after = (await ws.receive(timeout=10)).type if frame.command == "ERROR" else \
                aiohttp.WSMsgType.TEXT
            return frame.command, frame.headers.get("message", ""), after

    async def scenario() -> None:
        assert (await connect({"login": "app", "passcode": "app-pw"}))[0] == "CONNECTED"
        command, message, after = await connect({"login": "app", "passcode": "wrong"})
        assert (command, after) == ("ERROR", aiohttp.WSMsgType.CLOSE) and "login" in message
        command, message, after = await connect({})
        assert (command, after) == ("ERROR", aiohttp.WSMsgType.CLOSE)
        assert "authentication" in message

    asyncio.run(scenario())


def test_refusals_are_logged(secured: Any) -> None:
    with pytest.raises(ClientError):
        Client(secured.url, login="app", passcode="guess", timeout=10)
    secured.wait_for_log("login refused for 'app'")
    assert "guess" not in secured.log()  # passcodes never reach the log


def test_frames_pipelined_behind_connect_run_after_the_login(secured: Any) -> None:
    raw = Raw(secured)
    raw.send(connect_frame("app", "app-pw"),
             Frame("SEND", {"destination": "/queue/orders.pipe", "receipt": "r1",
                            "persistent": "true"}, b"p"))
    assert raw.recv().command == "CONNECTED"
    assert raw.recv().headers.get("receipt-id") == "r1"
    with login(secured, "app") as c:
        assert c.subscribe("/queue/orders.pipe").get(5).body == b"p"


def test_frames_pipelined_behind_a_failed_login_never_run(secured: Any) -> None:
    raw = Raw(secured)
    raw.send(connect_frame("app", "bad"),
             Frame("SEND", {"destination": "/queue/orders.sneak", "receipt": "r1"}, b"s"))
    reply = raw.recv()
    assert reply.command == "ERROR"
    with pytest.raises((ConnectionError, OSError)):
        raw.recv(3)
    with login(secured, "app") as c:
        assert c.head("/queue/orders.sneak").count == 0  # the SEND never ran


def test_slow_hash_checks_do_not_stall_connected_clients(secured: Any) -> None:
    with login(secured, "app") as c:
        stop = threading.Event()

        def guess() -> None:
            while not stop.is_set():
                with contextlib.suppress(ClientError):
                    Client(secured.url, login="app", passcode="guess", timeout=10).disconnect()

        threads = [threading.Thread(target=guess) for _ in range(8)]
        for t in threads:
            t.start()
        worst = 0.0
        try:
            for i in range(40):
                t0 = time.monotonic()
                c.send("/queue/orders.latency", str(i).encode())
                worst = max(worst, time.monotonic() - t0)
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert worst < 0.5, f"a receipt took {worst:.2f}s while logins were being checked"


def test_repeated_failures_lock_out_the_address(broker_factory: Any) -> None:
    b = broker_factory(config_text=config(max_failures=3))
    for _ in range(3):
        with pytest.raises(ClientError, match="invalid login"):
            Client(b.url, login="app", passcode="guess", timeout=10)
    with pytest.raises(ClientError, match="too many failed logins"):
        login(b, "app")  # even the right password, until the window passes


def test_anonymous_access_can_be_allowed_beside_users(broker_factory: Any) -> None:
    text = config().replace("[security]\n", "[security]\nanonymous = true\n")
    text += '\n[[security.acl]]\ndestination = "/queue/public"\nread = ["anonymous"]\n' \
            'write = ["anonymous"]\n'
    b = broker_factory(config_text=text)
    with Client(b.url, timeout=10) as anon:
        anon.send("/queue/public", b"hi")
        with pytest.raises(ClientError, match="not authorized"):
            anon.send("/queue/orders.a", b"x")


# -- authorization ---------------------------------------------------------------------------
def test_send_and_subscribe_follow_the_rules(secured: Any) -> None:
    with login(secured, "app") as app, login(secured, "rita") as rita:
        app.send("/queue/orders.eu", b"1")
        assert rita.subscribe("/queue/orders.eu", ack="client-individual").get(5).body == b"1"
        with pytest.raises(ClientError, match="not authorized to write"):
            rita.send("/queue/orders.eu", b"forged")
        with pytest.raises(ClientError, match="not authorized to write"):
            app.send("/queue/payroll", b"x")
        with pytest.raises(ClientError, match="not authorized to read"):
            app.subscribe("/queue/payroll")
        with pytest.raises(ClientError, match="not authorized to write"):
            app.send("/topic/news.today", b"x")
        news = app.subscribe("/topic/news.today")  # "*": any authenticated user reads
        with login(secured, "olga") as olga:
            olga.send("/topic/news.today", b"headline")
        assert news.get(5).body == b"headline"
        app.send("/queue/orders.eu", b"still connected after refusals")


def test_transactional_sends_are_checked_when_sent(secured: Any) -> None:
    with login(secured, "rita") as rita:
        tx = rita.transaction()
        with pytest.raises(ClientError, match="not authorized"):
            tx.send("/queue/orders.tx", b"x", receipt=True)
        tx.abort()


def test_every_stream_chunk_is_a_checked_send(secured: Any) -> None:
    with login(secured, "rita") as rita:
        headers = {STREAM_ID: "s-1", SEQ: "0", OFFSET: "0"}
        with pytest.raises(ClientError, match="not authorized"):
            rita.send("/queue/orders.big", b"chunk", headers)


def test_a_durable_subscription_cannot_be_taken_over(secured: Any) -> None:
    with login(secured, "app", client_id="svc") as app:
        app.subscribe("/topic/news.eu", durable_name="feed").unsubscribe()
    with login(secured, "rita", client_id="svc") as rita, \
            pytest.raises(ClientError, match="belongs to another user"):
        rita.subscribe("/topic/news.eu", durable_name="feed")
    with login(secured, "olga", client_id="svc") as olga:
        olga.send("/topic/news.eu", b"kept for app")
    with login(secured, "app", client_id="svc") as app:
        assert app.subscribe("/topic/news.eu", durable_name="feed").get(5).body == b"kept for app"


def test_a_durable_subscription_cannot_be_deleted_by_another_user(secured: Any) -> None:
    with login(secured, "app", client_id="svc2") as app:
        app.subscribe("/topic/news.x", durable_name="d").unsubscribe()
    raw = Raw(secured)
    raw.send(connect_frame("rita", "rita-pw", **{"client-id": "svc2"}))
    assert raw.recv().command == "CONNECTED"
    raw.send(Frame("UNSUBSCRIBE", {"id": "x", "activemq.subscriptionName": "d",
                                   "receipt": "u"}))
    reply = raw.recv()
    assert reply.command == "ERROR"
    assert "belongs to another user" in reply.headers["message"]


def test_client_id_collisions_are_refused(secured: Any) -> None:
    """A client id is connected once per user; another user's use of it is that user's own
    (tests/e2e/test_isolation.py), so it cannot lock the first one out."""
    with login(secured, "app", client_id="only-one"):
        with pytest.raises(ClientError, match="already connected"):
            login(secured, "app", client_id="only-one")
        login(secured, "olga", client_id="only-one").disconnect()


BYPASS_DESTINATIONS = [
    "/queue/payroll", "/queue/PAYROLL", "/queue/orders.>", "/queue/orders.*", "/queue/>",
    "/queue/orders/../payroll", "/queue//orders.x", "/queue/orders.x\\c", "/queue/ orders.x",
    "/queue/orders..x", "/queue/.orders.x", "queue/orders.x", "/topic/orders.x",
    "/temp-queue/orders.x", "/QUEUE/orders.x", "/queue/orders.x\t", "/queue/orders.x ",
    "", "/queue/", "/queue/orders.x\n", "/queue/orders.x;/queue/payroll",
]


def test_destination_tricks_are_refused_for_a_reader(secured: Any) -> None:
    raw = Raw(secured)
    raw.send(connect_frame("rita", "rita-pw"))
    assert raw.recv().command == "CONNECTED"
    for i, destination in enumerate(BYPASS_DESTINATIONS):
        raw.send(Frame("SEND", {"destination": destination, "receipt": f"r{i}"}, b"x"))
        reply = raw.recv()
        assert reply.command == "ERROR", (destination, reply)
        assert reply.headers["receipt-id"] == f"r{i}"
    raw.send(Frame("SEND", {"destination": "/queue/orders.x", "receipt": "last"}, b"x"))
    assert raw.recv().command == "ERROR"  # still refused, and the connection is still up
    raw.send(Frame("SUBSCRIBE", {"destination": "/queue/orders.x", "id": "1",
                                 "receipt": "sub"}))
    assert raw.recv().headers.get("receipt-id") == "sub"


def test_repeated_login_headers_and_second_connects_do_not_escalate(secured: Any) -> None:
    raw = Raw(secured)
    # first occurrence wins: the second login header is ignored, so this is rita
    raw.sock.sendall(b"CONNECT\naccept-version:1.2\nhost:h\nlogin:rita\npasscode:rita-pw\n"
                     b"login:olga\npasscode:olga-pw\n\n\x00")
    assert raw.recv().command == "CONNECTED"
    raw.send(Frame("SEND", {"destination": "/topic/news.x", "receipt": "r"}, b"x"))
    assert raw.recv().command == "ERROR"
    raw.send(connect_frame("olga", "olga-pw"))  # re-CONNECT on the same socket
    assert raw.recv().command == "ERROR"


def test_publishing_or_discarding_a_staged_batch_needs_write_on_its_destinations(
        secured: Any) -> None:
    def session(user: str) -> Raw:
        raw = Raw(secured)
        raw.send(connect_frame(user, USERS[user][0]))
        assert raw.recv().command == "CONNECTED"
        return raw

    def call(raw: Raw, command: str, **headers: str) -> Frame:
        raw.send(Frame(command, {**headers, "receipt": "r"}))
        return raw.recv()

    app = session("app")
    app.send(Frame("BEGIN", {"transaction": "t", "sluice-stage": "sink/b1/p0"}),
             Frame("SEND", {"transaction": "t", "destination": "/queue/orders.staged",
                            "persistent": "true"}, b"staged body"))
    assert call(app, "COMMIT", transaction="t").command == "RECEIPT"  # parked, invisible
    rita = session("rita")  # may read orders, not write them, so cannot stage there either
    rita.send(Frame("BEGIN", {"transaction": "t", "sluice-stage": "sink/b1/p0"}))
    refused = call(rita, "SEND", transaction="t", destination="/queue/orders.staged")
    assert "not authorized to write /queue/orders.staged" in refused.headers["message"]
    # and app's batch is not rita's: she can neither publish nor discard it
    refused = call(rita, "COMMIT", transaction="x", **{"sluice-stage-commit": "sink/b1",
                                                       "sluice-stage-parts": "p0"})
    assert "no part p0 staged by user 'rita'" in refused.headers["message"]
    kept = call(rita, "ABORT", transaction="x", **{"sluice-stage-abort": "sink/b1"})
    assert kept.headers["sluice-stage-discarded"] == "0"
    done = call(app, "COMMIT", transaction="x", **{"sluice-stage-commit": "sink/b1",
                                                   "sluice-stage-parts": "p0"})
    assert done.headers["sluice-stage-result"] == "published"  # the refusals changed nothing
    with login(secured, "rita") as reader:
        assert reader.subscribe("/queue/orders.staged").get(5).body == b"staged body"


def test_a_password_that_is_not_a_whole_hash_stops_the_broker_at_start(tmp_path: Path) -> None:
    """README's [[security.users]] placeholder (a hash cut short with "…") used to start a
    broker whose every login as that user waited for connect-timeout instead of an ERROR."""
    config = tmp_path / "broker.toml"
    config.write_text('[[security.users]]\nname = "app"\n'
                      'password = "$argon2id$v=19$m=65536,t=3,p=4$\u2026"\n', encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "sluicemq", "broker", "--port", "0",
                          "--console-port", "off", "--ws-port", "off", "--config", str(config),
                          "--data-dir", str(tmp_path / "data")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stderr
    assert "bad configuration: user 'app': password is not a whole hash from `sluice passwd`" \
        in out.stderr
    assert not (tmp_path / "data").exists()
