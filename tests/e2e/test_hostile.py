"""Spec: hostile clients meet a named limit in an ERROR, and a bystander keeps being served.

Each case replays one attack from issue #16 at a small scale against a real broker whose
`[limits]` are set low; bench/hostile.py replays them at full scale with RSS and latency
figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from e2e.stomp_helpers import connect as stomp_connect
from sluice_testing import RawStomp, eventually
from sluicemq.client import Client
from sluicemq.core.paging.flow import CURSOR_HIGH_WATER
from sluicemq.core.routing.destinations import DESTINATION_BYTES
from sluicemq.errors import ClientError
from sluicemq.protocol.codec import FrameParser, encode_frame
from sluicemq.protocol.frames import Frame
from sluicemq.transport.tcp import CONNECTION_BYTES as TCP_CONNECTION_BYTES
from sluicemq.transport.websocket import CONNECTION_BYTES

CONNECT = {"accept-version": "1.2", "host": "h", "heart-beat": "0,0"}


class Raw(RawStomp):
    """A bare STOMP 1.2 socket, optionally from another loopback address (another client)."""

    def __init__(self, b: Any, source: str | None = None) -> None:
        super().__init__(b.host, b.port, source=source)

    def connect(self) -> Frame:
        self.send("CONNECT", CONNECT)
        return self.recv()

    def closed_by_broker(self, timeout: float = 10) -> bool:
        """True once the broker has closed (EOF, not a reset) within ``timeout``."""
        self.sock.settimeout(timeout)
        while True:
            data = self.sock.recv(1 << 16)
            if not data:
                return True


def overview(b: Any) -> dict[str, Any]:
    """The console's /api/overview (limits, memory) as JSON."""
    with urllib.request.urlopen(f"{b.console_url}/api/overview", timeout=10) as resp:
        found: dict[str, Any] = json.load(resp)
        return found


def messages_held(b: Any) -> int:
    """What queued messages and output hold of memory_limit now: the account less the
    connections' and destinations' own state (one overview, so one moment)."""
    shown = overview(b)
    limits = shown["limits"]
    return int(shown["flow"]["limits"]["memory"]["used"] - limits["connection_memory"]["used"]
               - limits["destination_memory"]["used"])


def until_used(b: Any, limit: str, count: int) -> None:
    """Wait (bounded) until the console counts ``count`` against ``limit``: the broker has
    seen closed connections go."""
    deadline = time.monotonic() + 10
    while overview(b)["limits"][limit]["used"] != count:
        assert time.monotonic() < deadline, f"{limit} stayed at {overview(b)['limits'][limit]}"


def stuck_subscribers(b: Any, topic: str, n: int) -> list[RawStomp]:
    """``n`` subscribers of ``topic`` (from another address, tiny receive buffers) that read
    nothing once their SUBSCRIBE is confirmed."""
    stuck = []
    for i in range(n):
        s = RawStomp(b.host, b.port, source="127.0.0.3", rcvbuf=4096)
        s.connect()
        s.send("SUBSCRIBE", {"destination": topic, "id": str(i), "receipt": "r"})
        assert s.recv().command == "RECEIPT"
        stuck.append(s)
    return stuck


def bystander_works(b: Any, queue: str = "/queue/bystander") -> None:
    """Another client connects, sends and receives as if nothing happened."""
    with Client(b.url, timeout=10) as c:
        sub = c.subscribe(queue)
        c.send(queue, b"still served")
        got = sub.get(10)
        assert got is not None and got.body == b"still served"


# -- connections ---------------------------------------------------------------------------
def test_a_socket_that_never_sends_connect_is_closed_after_the_connect_timeout(
        broker_factory: Any) -> None:
    """Silent sockets and CONNECTs dribbled in slowly are told why, then closed."""
    b = broker_factory(config_text="[limits]\nconnect-timeout = 1.0\n")
    silent = Raw(b)
    partial = Raw(b)
    partial.sock.sendall(b"CONNECT\naccept-version:1.2\n")  # and never the rest
    for r in (silent, partial):
        reply = r.recv(5)
        assert reply.command == "ERROR"
        assert reply.headers["message"] == "no CONNECT within 1 s (connect_timeout)"
        assert r.closed_by_broker()
    connected = Raw(b)
    assert connected.connect().command == "CONNECTED"
    connected.send("SEND", {"destination": "/queue/t", "receipt": "r"}, b"x")
    assert connected.recv(5).headers["receipt-id"] == "r"  # a connected client is not timed


def test_one_address_cannot_take_every_connection(broker_factory: Any) -> None:
    """Past max_connections_per_address that address is refused; other addresses are not."""
    b = broker_factory(config_text="[limits]\nmax-connections = 20\n"
                                   "max-connections-per-address = 3\n")
    held = [Raw(b, source="127.0.0.2") for _ in range(3)]  # idle: no CONNECT needed
    refused = Raw(b, source="127.0.0.2")
    reply = refused.recv()
    assert reply.command == "ERROR"
    assert reply.headers["message"] == ("too many connections from 127.0.0.2 (limit 3, "
                                        "max_connections_per_address)")
    assert refused.closed_by_broker()
    bystander_works(b)
    held.pop().sock.close()
    until_used(b, "connections_per_address", 2)
    assert Raw(b, source="127.0.0.2").connect().command == "CONNECTED"  # the freed slot


def test_websocket_connections_count_against_max_connections(broker_factory: Any) -> None:
    """WebSockets and TCP share one cap, so neither can exhaust the other's descriptors."""
    b = broker_factory(config_text="[limits]\nmax-connections = 3\n")

    async def scenario() -> tuple[str, str]:
        async with aiohttp.ClientSession() as http:
            held = [await http.ws_connect(f"{b.ws_url}/stomp", protocols=("v12.stomp",))
                    for _ in range(3)]
            extra = await http.ws_connect(f"{b.ws_url}/stomp", protocols=("v12.stomp",))
            msg = await extra.receive(timeout=10)
            ws_refusal = FrameParser().feed(msg.data.encode())[0].headers["message"]
            tcp_refusal = await asyncio.to_thread(lambda: Raw(b).recv().headers["message"])
            for ws in (*held, extra):
                await ws.close()
            return ws_refusal, tcp_refusal

    ws_refusal, tcp_refusal = asyncio.run(scenario())
    assert ws_refusal == "too many connections (limit 3, max_connections)"
    assert tcp_refusal == "too many connections (limit 3, max_connections)"
    until_used(b, "connections", 0)  # the WebSockets' slots are given back when they close
    bystander_works(b)


def test_websocket_connections_count_against_the_memory_limit(broker_factory: Any) -> None:
    """An open WebSocket holds ~23 KiB (aiohttp's request, reader, writer; our session) that
    no cap on messages sees: it is charged to memory_limit while open, and upgrades past the
    part of the limit queued messages leave them (30%, shared with TCP connections and
    destinations) are refused, naming the limit - so thousands of WebSockets from many
    addresses cannot take the process past its limit."""
    limit = 1 << 20
    most = limit - int(limit * CURSOR_HIGH_WATER)
    b = broker_factory(config_text=f'[limits]\nmemory-limit = "{limit} B"\n')

    async def scenario() -> tuple[str, int, int, int]:
        async with aiohttp.ClientSession() as http:
            first = await http.ws_connect(f"{b.ws_url}/stomp", protocols=("v12.stomp",))
            shown = overview(b)["limits"]
            assert shown["connection_memory"]["limit"] == most
            before = shown["connection_memory"]["used"] + shown["destination_memory"]["used"]
            admitted = 1 + (most - before) // CONNECTION_BYTES
            opened = [first] + [await http.ws_connect(f"{b.ws_url}/stomp",
                                                      protocols=("v12.stomp",))
                                for _ in range(admitted - 1)]
            used = overview(b)["limits"]["connection_memory"]["used"]
            held = overview(b)["flow"]["limits"]["memory"]["used"]
            with urllib.request.urlopen(f"{b.console_url}/metrics", timeout=10) as resp:
                shown_m = re.search(r"^sluice_connection_memory_bytes ([\d.e+]+)$",
                                    resp.read().decode(), re.M)
            assert shown_m is not None and float(shown_m.group(1)) == used
            extra = await http.ws_connect(f"{b.ws_url}/stomp", protocols=("v12.stomp",))
            msg = await extra.receive(timeout=10)
            refusal = FrameParser().feed(msg.data.encode())[0].headers["message"]
            for ws in (*opened, extra):
                await ws.close()
            return refusal, used - (before - CONNECTION_BYTES), held, admitted

    refusal, charged, held, admitted = asyncio.run(scenario())
    assert charged == admitted * CONNECTION_BYTES
    assert held >= charged, "inside what memory_limit counts"
    assert refusal.startswith("memory limit reached: connections and destinations hold ")
    assert f"at most {most} (the 30% of memory_limit {limit}" in refusal
    assert refusal.endswith(f"a WebSocket connection takes {CONNECTION_BYTES})")
    bystander_works(b)  # TCP clients are not refused, and messages still flow
    until_used(b, "connection_memory", 0)  # given back as the WebSockets close


def test_tcp_connections_count_against_the_memory_limit(broker_factory: Any) -> None:
    """A TCP connection's own state (protocol, session, parser: a few KiB) is charged while it
    is open, like a WebSocket's: 10,000 of them would be ~60 MiB outside memory_limit. Past the
    part of the limit queued messages leave, the next is refused with an ERROR naming it."""
    limit = 1 << 20
    most = limit - int(limit * CURSOR_HIGH_WATER)
    b = broker_factory(config_text=f'[limits]\nmemory-limit = "{limit} B"\n'
                                   "connect-timeout = 600\n")
    first = Raw(b, source="127.0.0.2")
    assert first.connect().command == "CONNECTED"
    shown = overview(b)["limits"]
    before = shown["connection_memory"]["used"] + shown["destination_memory"]["used"]
    assert shown["connection_memory"]["used"] == TCP_CONNECTION_BYTES
    room = (most - before) // TCP_CONNECTION_BYTES
    held = [first] + [Raw(b, source="127.0.0.2") for _ in range(room)]  # idle: no CONNECT
    until_used(b, "connection_memory", (room + 1) * TCP_CONNECTION_BYTES)
    refused = Raw(b, source="127.0.0.3")
    reply = refused.recv()
    assert reply.command == "ERROR"
    assert reply.headers["message"].startswith(
        "memory limit reached: connections and destinations hold ")
    assert reply.headers["message"].endswith(
        f"a TCP connection takes {TCP_CONNECTION_BYTES})")
    assert refused.closed_by_broker()
    for r in held[1:]:
        r.sock.close()
    until_used(b, "connection_memory", TCP_CONNECTION_BYTES)  # given back as they close
    assert Raw(b, source="127.0.0.3").connect().command == "CONNECTED"


def test_destinations_count_against_the_memory_limit(broker_factory: Any) -> None:
    """Each queue and topic holds a few KiB of its own however empty (cursor, stats,
    policy): charged to memory_limit, and a new one past the part queued messages leave is
    refused, naming the limit; the destination caps alone left 10,000 (~50 MiB) uncounted."""
    limit = 1 << 20
    b = broker_factory(config_text=f'[limits]\nmemory-limit = "{limit} B"\n'
                                   "max-destinations-per-user = 0\n")
    r = Raw(b, source="127.0.0.2")
    assert r.connect().command == "CONNECTED"
    sent = 0
    while True:
        r.send("SEND", {"destination": f"/queue/many.{sent}", "receipt": str(sent)}, b"x")
        reply = r.recv()
        if reply.command == "ERROR":
            break
        sent += 1
        assert sent < 1000, "never refused"
    assert reply.headers["message"].startswith(
        f"cannot create /queue/many.{sent}: memory limit reached: connections and "
        "destinations hold ")
    assert reply.headers["message"].endswith(f"a destination takes {DESTINATION_BYTES})")
    shown = overview(b)["limits"]["destination_memory"]
    assert shown["used"] >= sent * DESTINATION_BYTES
    r.send("SEND", {"destination": "/queue/many.0", "receipt": "old"}, b"x")
    assert r.recv().headers["receipt-id"] == "old"  # existing ones stay usable


# -- frames --------------------------------------------------------------------------------
def test_a_frame_refused_for_size_is_answered_before_the_close_without_a_reset(
        broker_factory: Any) -> None:
    """The client keeps sending its too-large frame: it gets no reset and reads the ERROR."""
    b = broker_factory(config_text="[limits]\nmax-frame-bytes = 1048576\n")
    r = Raw(b)
    assert r.connect().command == "CONNECTED"
    big = encode_frame(Frame("SEND", {"destination": "/queue/big"}, b"x" * (8 << 20)), "1.2")
    r.sock.settimeout(30)
    r.sock.sendall(big)  # would fail with a reset or broken pipe if the broker just closed
    reply = r.recv()
    assert reply.command == "ERROR"
    assert "max_frame_bytes=1048576" in reply.headers["message"]
    assert r.closed_by_broker()
    bystander_works(b)


def test_megabytes_of_headers_are_refused_as_they_arrive(broker_factory: Any) -> None:
    """A header section past max_header_bytes is refused before it is whole (it is never
    parsed or held), and the client still reads why."""
    b = broker_factory(config_text="[limits]\nmax-header-bytes = 65536\n")
    r = Raw(b)
    assert r.connect().command == "CONNECTED"
    headers = {f"h{i}": "v" * 8000 for i in range(900)}  # issue #16: 7.2 MB of headers
    r.sock.settimeout(30)
    r.sock.sendall(encode_frame(Frame("SEND", {"destination": "/queue/heavy", **headers},
                                      b"x"), "1.2"))
    reply = r.recv()
    assert reply.command == "ERROR"
    assert reply.headers["message"] == "frame headers exceed max_header_bytes=65536"
    assert r.closed_by_broker()
    fits = Raw(b)
    assert fits.connect().command == "CONNECTED"
    fits.send("SEND", {"destination": "/queue/heavy", "receipt": "r",
                       **{f"h{i}": "v" * 8000 for i in range(7)}}, b"x")
    assert fits.recv().headers["receipt-id"] == "r"  # 56 KB of headers are fine
    bystander_works(b)


def test_stomp_py_reads_the_error_for_a_frame_too_large(broker_factory: Any) -> None:
    """What most applications use: stomp.py's send succeeds and its listener gets the ERROR."""
    b = broker_factory(config_text="[limits]\nmax-frame-bytes = 1048576\n")
    conn, seen = stomp_connect(b)
    try:
        conn.send("/queue/big", b"y" * (4 << 20))
        error = seen.errors.get(timeout=10)
        assert "max_frame_bytes=1048576" in error.headers["message"]
    finally:
        with contextlib.suppress(Exception):  # the broker closed it: that is the point
            conn.disconnect()
    bystander_works(b)


# -- memory --------------------------------------------------------------------------------
def test_header_bytes_count_against_the_memory_limit(broker_factory: Any) -> None:
    """Messages whose weight is in their headers fill the memory limit as bodies would."""
    b = broker_factory(config_text='[limits]\nmemory-limit = "2 MiB"\n'
                                   '[[policy]]\nqueue = "heavy"\ncursor = "vm"\n'
                                   'fail-if-no-space = true\n')
    r = Raw(b)
    assert r.connect().command == "CONNECTED"
    headers = {f"h{i}": "v" * 8000 for i in range(12)}  # ~96 KB of headers, a 1-byte body
    refused = None
    for i in range(40):  # at 1 KiB a message 2 MiB would hold 2000 of them
        r.send("SEND", {"destination": "/queue/heavy", "receipt": str(i), **headers}, b"x")
        reply = r.recv()
        if reply.command == "ERROR":
            refused = reply
            break
    assert refused is not None, "40 messages of ~96 KB headers fitted in 2 MiB"
    assert refused.headers["message"] == ("/queue/heavy cannot take the message: memory limit "
                                          "reached (2097152 bytes)")
    assert int(refused.headers["receipt-id"]) < 30
    bystander_works(b)


# -- destinations --------------------------------------------------------------------------
DESTINATION_CAPS = """
[limits]
max-destinations = 5
max-destinations-per-user = 3
idle-destination-seconds = 3600
"""


def test_one_client_cannot_create_more_than_its_share_of_destinations(
        broker_factory: Any) -> None:
    """Anonymous clients are counted per address; the broker-wide cap holds for everyone."""
    b = broker_factory(config_text=DESTINATION_CAPS)
    hostile = Raw(b, source="127.0.0.2")
    assert hostile.connect().command == "CONNECTED"
    for i in range(4):
        hostile.send("SEND", {"destination": f"/queue/spam.{i}", "receipt": str(i)}, b"x")
    assert [hostile.recv().command for _ in range(4)] == ["RECEIPT"] * 3 + ["ERROR"]
    hostile.send("SEND", {"destination": "/queue/spam.9", "receipt": "again"}, b"x")
    refusal = hostile.recv()
    assert refusal.headers["message"] == (
        "cannot create /queue/spam.9: address 127.0.0.2 created too many destinations "
        "(limit 3, max_destinations_per_user)")
    hostile.send("SEND", {"destination": "/queue/spam.0", "receipt": "old"}, b"x")
    assert hostile.recv().headers["receipt-id"] == "old"  # existing ones stay usable
    bystander_works(b, "/queue/mine")  # another address; emptied again, so reclaimable
    with Client(b.url, timeout=10) as c:
        c.send("/queue/mine.2", b"the 5th")
        c.send("/queue/mine.3", b"fits: the idle, empty /queue/mine is reclaimed for it")
        with pytest.raises(ClientError, match=r"too many destinations \(limit 5, "
                                              r"max_destinations\)"):
            c.send("/queue/mine.4", b"a 6th holding messages")


def test_empty_destinations_nobody_uses_are_reclaimed(broker_factory: Any) -> None:
    """SUBSCRIBE + UNSUBSCRIBE cycles leave nothing behind: at the cap idle ones go first."""
    b = broker_factory(config_text=DESTINATION_CAPS)
    r = Raw(b)
    assert r.connect().command == "CONNECTED"
    for i in range(50):
        r.send("SUBSCRIBE", {"destination": f"/queue/cycle.{i}", "id": "s", "receipt": "s"})
        assert r.recv().command == "RECEIPT"
        r.send("UNSUBSCRIBE", {"id": "s", "receipt": "u"})
        assert r.recv().command == "RECEIPT"
    r.send("SEND", {"destination": "/queue/cycle.keep", "receipt": "k"}, b"kept")
    assert r.recv().headers["receipt-id"] == "k"
    bystander_works(b)
    with Client(b.url, timeout=10) as c:  # a queue with messages was never reclaimed
        got = c.subscribe("/queue/cycle.keep").get(10)
        assert got is not None and got.body == b"kept"


# -- transactions --------------------------------------------------------------------------
def test_open_transactions_are_capped_in_bytes_and_kept_out_of_ram(broker_factory: Any) -> None:
    """A connection's open transactions hold at most max_transaction_bytes, and beyond 1 MiB
    of them in memory the largest move to temporary files."""
    b = broker_factory(config_text='[limits]\nmax-transaction-bytes = "2.5 MiB"\n')
    r = Raw(b)
    assert r.connect().command == "CONNECTED"
    part = b"t" * (200 << 10)  # under the spool's own 256 KiB threshold: stays in RAM alone
    for i in range(10):
        r.send("BEGIN", {"transaction": f"t{i}"})
        r.send("SEND", {"destination": "/queue/tx", "transaction": f"t{i}",
                        "receipt": f"s{i}"}, part)
        assert r.recv().headers["receipt-id"] == f"s{i}"
    spool_dir = str(b.data_dir.resolve() / "tmp")
    spilled = [p for p in Path(f"/proc/{b.pid}/fd").iterdir()
               if os.readlink(p).startswith(spool_dir)]  # unlinked spool files
    assert len(spilled) >= 4  # of 10 x 200 KiB: RAM keeps 1 MiB plus the part just added
    r.send("BEGIN", {"transaction": "big"})
    r.send("SEND", {"destination": "/queue/tx", "transaction": "big", "receipt": "over"},
           b"o" * (1 << 20))
    refused = r.recv()
    assert refused.command == "ERROR" and refused.headers["receipt-id"] == "over"
    assert re.fullmatch(r"open transactions on this connection would hold 3\d{6} bytes "
                        r"\(limit 2621440, max_transaction_bytes\)", refused.headers["message"])
    r.send("COMMIT", {"transaction": "t0", "receipt": "c0"})
    assert r.recv().headers["receipt-id"] == "c0"  # the connection and its work go on
    with Client(b.url, timeout=10) as c:
        got = c.subscribe("/queue/tx").get(10)
        assert got is not None and got.body == part
    bystander_works(b)


# -- waits for a consumer ------------------------------------------------------------------
def wait_query(r: Raw, receipt: str, seconds: str = "1e9") -> None:
    r.send("SEND", {"destination": "/queue/nobody", "sluice-stream-query": f"s-{receipt}",
                    "sluice-stream-wait-consumer": seconds, "receipt": receipt})


def test_waits_for_a_consumer_are_bounded_in_number_and_time(broker_factory: Any) -> None:
    """A connection may keep max_consumer_waits waiting, each at most the configured time."""
    b = broker_factory(config_text="[limits]\nmax-consumer-waits = 3\n"
                                   "max-consumer-wait-seconds = 1.0\n")
    r = Raw(b)
    assert r.connect().command == "CONNECTED"
    for i in range(4):
        wait_query(r, str(i))
    refused = r.recv()
    assert refused.command == "ERROR" and refused.headers["receipt-id"] == "3"
    assert refused.headers["message"] == ("too many SENDs waiting for a consumer on this "
                                          "connection (limit 3, max_consumer_waits)")
    answered = [r.recv(5) for _ in range(3)]  # after 1 s, not 1e9 s: nobody subscribed
    assert sorted(f.headers["receipt-id"] for f in answered) == ["0", "1", "2"]
    assert all(f.headers["sluice-stream-consumers"] == "0" for f in answered)
    wait_query(r, "nan", "nan")
    assert "not a number" in r.recv().headers["message"]
    bystander_works(b)


def test_a_connection_that_leaves_takes_its_waits_with_it(broker_factory: Any) -> None:
    b = broker_factory(config_text="[limits]\nmax-consumer-wait-seconds = 3600\n")
    r = Raw(b)
    assert r.connect().command == "CONNECTED"
    for i in range(50):
        wait_query(r, str(i))
    r.send("SEND", {"destination": "/queue/x", "receipt": "sync"}, b"")
    assert r.recv().headers["receipt-id"] == "sync"  # the 50 waits are registered
    assert overview(b)["limits"]["consumer_waits"] == 50
    r.sock.close()
    deadline = time.monotonic() + 10
    while overview(b)["limits"]["consumer_waits"]:
        assert time.monotonic() < deadline, "the waits outlived their connection"
    bystander_works(b)


# -- durable subscriptions -----------------------------------------------------------------
def test_durable_subscriptions_per_client_id_are_capped(broker_factory: Any) -> None:
    b = broker_factory(config_text="[limits]\nmax-durable-subscriptions = 3\n")
    r = Raw(b)
    r.send("CONNECT", {**CONNECT, "client-id": "hoarder"})
    assert r.recv().command == "CONNECTED"
    for i in range(4):
        r.send("SUBSCRIBE", {"destination": "/topic/news", "id": str(i), "receipt": str(i),
                             "activemq.subscriptionName": f"d{i}"})
    replies = {f.headers["receipt-id"]: f for f in (r.recv() for _ in range(4))}
    assert [replies[str(i)].command for i in range(4)] == ["RECEIPT"] * 3 + ["ERROR"]
    assert replies["3"].headers["message"] == (
        "client-id 'hoarder' has too many durable subscriptions (limit 3, "
        "max_durable_subscriptions)")
    bystander_works(b)


def test_a_durable_backlog_does_not_stall_other_clients_non_persistent_sends(
        broker_factory: Any) -> None:
    """Durable subscriptions nobody reads fill the memory budget; other producers' messages
    page to temp files instead of waiting for room that never comes."""
    b = broker_factory(config_text='[limits]\nmemory-limit = "1 MiB"\n')
    r = Raw(b)
    r.send("CONNECT", {**CONNECT, "client-id": "idle"})
    assert r.recv().command == "CONNECTED"
    for i in range(50):
        r.send("SUBSCRIBE", {"destination": "/topic/feed", "id": str(i), "receipt": str(i),
                             "activemq.subscriptionName": f"d{i}"})
        assert r.recv().command == "RECEIPT"
    r.send("DISCONNECT", {"receipt": "bye"})
    assert r.recv().headers["receipt-id"] == "bye"
    with Client(b.url, timeout=20) as c:
        for _ in range(20):
            c.send("/topic/feed", b"p" * 20_000)  # 50 x 20 x 20 KB: far past 1 MiB
        sub = c.subscribe("/queue/other")
        for i in range(200):
            c.send("/queue/other", str(i).encode(), persistent=False)
        got = [sub.get(10) for _ in range(200)]
        assert [m.body for m in got if m is not None] == [str(i).encode() for i in range(200)]


def test_memory_counted_for_a_paged_backlog_returns_to_zero_when_drained(
        broker_factory: Any) -> None:
    """Persistent messages paged out before their record was durable stop counting once it
    is; the account neither leaks nor counts them twice (which stalled producers for good)."""
    b = broker_factory(config_text='[limits]\nmemory-limit = "256 KiB"\n')
    with Client(b.url, timeout=20) as c:
        for i in range(500):
            c.send("/queue/backlog", f"{i:04d}".encode() * 256)  # persistent, 1 KiB
        assert messages_held(b) <= 256 << 10
        sub = c.subscribe("/queue/backlog", prefetch=50)
        got = [sub.get(10) for _ in range(500)]
        assert [m.body[:4] for m in got if m is not None] == [f"{i:04d}".encode()
                                                               for i in range(500)]
    assert messages_held(b) == 0


# -- output --------------------------------------------------------------------------------
def test_subscribers_that_stop_reading_hold_only_their_share_of_the_output_budget(
        broker_factory: Any) -> None:
    """Frames for a peer that does not read wait in the broker until its socket takes them.
    Each connection may back up only its share of output_buffer_bytes (the budget over the
    connections), so a client opening subscribers that never read cannot fill the broker's
    RAM with their frames (at 4 MiB a connection, 200 of them held ~900 MiB)."""
    b = broker_factory(config_text='[limits]\noutput-buffer-bytes = "1 MiB"\n'
                                   '[defaults]\nmax_consumer_lag = 0\n')  # publish unpaced
    stuck = stuck_subscribers(b, "/topic/stuck", 4)
    publisher = Raw(b)
    assert publisher.connect().command == "CONNECTED"
    body = b"s" * (16 << 10)
    for _ in range(600):  # 9.6 MB for each subscriber: more than its socket buffers take
        publisher.send("SEND", {"destination": "/topic/stuck"}, body)
    publisher.send("SEND", {"destination": "/topic/stuck", "receipt": "all"}, body)
    assert publisher.recv().headers.get("receipt-id") == "all"
    share = overview(b)["limits"]["output_buffer"]["per_connection"]
    assert share == (1 << 20) // 5  # four subscribers and the publisher
    with urllib.request.urlopen(f"{b.console_url}/api/connections", timeout=10) as resp:
        conns = json.load(resp)["connections"]
    backed_up = [c["output_buffered"] for c in conns if c["subscriptions"]]
    # at most a share in the socket's buffer and a share (plus a frame) written after it
    assert len(backed_up) == 4 and all(share <= n <= 2 * share + len(body) + 1024
                                       for n in backed_up), (share, backed_up)
    bystander_works(b)
    held = overview(b)["flow"]["limits"]["memory"]["used"]
    # the frames their sockets did not take wait in their subscriptions, and what waits in
    # the broker's output buffers counts against memory_limit too
    assert held >= sum(backed_up) > 0, (held, backed_up)
    for s in stuck:
        s.close()
    # their subscriptions go with them, and so does what those held against memory_limit
    eventually(lambda: messages_held(b) == 0,
               lambda: f"still counted after the subscribers left: {overview(b)['flow']}")


def test_a_topic_message_paged_out_for_many_stuck_subscribers_is_stored_once(
        broker_factory: Any) -> None:
    """Ten subscribers of one topic that stop reading: what their sockets do not take is paged
    out to temp files, one record a message however many subscriptions hold it (one each
    wrote 10x the bytes; with 200 of them it was half the broker's time). A subscriber that
    reads again gets every message back, in order, and a stomp.py subscriber that kept
    reading got them all."""
    b = broker_factory(config_text='[limits]\nmemory-limit = "2 MiB"\n'
                                   'output-buffer-bytes = "1 MiB"\n'
                                   '[defaults]\nmax_consumer_lag = 0\n')  # publish unpaced
    reader, seen = stomp_connect(b)
    reader.subscribe("/topic/fan", id="r", headers={"receipt": "sub-r"})
    assert seen.receipts.get(timeout=10) == "sub-r"
    stuck = stuck_subscribers(b, "/topic/fan", 10)
    publisher = Raw(b)
    assert publisher.connect().command == "CONNECTED"
    bodies = [b"%04d" % i * (4 << 10) for i in range(300)]  # 16 KiB each, 4.9 MB in all
    for i, body in enumerate(bodies):
        publisher.send("SEND", {"destination": "/topic/fan", "n": str(i)}, body)
    publisher.send("SEND", {"destination": "/topic/fan", "receipt": "all"}, b"end")
    assert publisher.recv().headers.get("receipt-id") == "all"
    temp = overview(b)["flow"]["limits"]["temp"]["used"]
    published = sum(len(body) for body in bodies)
    assert published // 2 < temp < 2 * published, (temp, published)  # not 10x
    got = [seen.next(timeout=30).body for _ in range(len(bodies) + 1)]
    assert got == [*(body.decode() for body in bodies), "end"]
    again = stuck.pop()
    received = [again.recv(timeout=30) for _ in range(len(bodies) + 1)]
    assert [f.body for f in received] == [*bodies, b"end"]
    assert [f.headers.get("n") for f in received[:-1]] == [str(i) for i in range(300)]
    reader.disconnect()
    for s in stuck:
        s.close()
