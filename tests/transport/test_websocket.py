"""STOMP over WebSocket: what stomp.js does, from aiohttp's client, against a real broker."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from sluice_testing import RawStomp
from sluicemq.protocol.codec import FrameParser, encode_frame
from sluicemq.protocol.frames import Frame


class WsStomp:
    """A STOMP client over one WebSocket: frames out as text or binary, frames in parsed."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.parser = FrameParser(version="1.2")
        self.frames: list[Frame] = []
        self.kinds: list[aiohttp.WSMsgType] = []
        self.heartbeats = 0

    async def send(self, command: str, headers: dict[str, str], body: bytes = b"",
                   binary: bool = False) -> None:
        data = encode_frame(Frame(command, headers, body), "1.2")
        await (self.ws.send_bytes(data) if binary else self.ws.send_str(data.decode()))

    async def recv(self, timeout: float = 10.0) -> Frame:
        deadline = time.monotonic() + timeout
        while not self.frames:
            await self._read(deadline)
        return self.frames.pop(0)

    async def heart_beats(self, count: int, timeout: float = 10.0) -> None:
        """Read until ``count`` heart-beats (lone EOLs) have arrived in all."""
        deadline = time.monotonic() + timeout
        while self.heartbeats < count:
            await self._read(deadline)

    async def _read(self, deadline: float) -> None:
        msg = await self.ws.receive(timeout=max(0.01, deadline - time.monotonic()))
        if msg.type not in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
            raise ConnectionError(f"websocket {msg.type.name}")
        data = msg.data.encode() if msg.type == aiohttp.WSMsgType.TEXT else msg.data
        if data == b"\n":
            self.heartbeats += 1
        self.kinds.append(msg.type)
        self.frames.extend(self.parser.feed(data))

    async def connect(self, **headers: str) -> Frame:
        await self.send("CONNECT", {"accept-version": "1.0,1.1,1.2", "host": "localhost",
                                    **headers})
        frame = await self.recv()
        assert frame.command == "CONNECTED", frame
        return frame


def run(ws_url: str, scenario: Callable[[WsStomp], Awaitable[Any]],
        protocols: tuple[str, ...] = ("v12.stomp", "v11.stomp", "v10.stomp")) -> Any:
    async def main() -> Any:
        async with aiohttp.ClientSession() as http, http.ws_connect(
                f"{ws_url}/stomp", protocols=protocols) as ws:
            return await scenario(WsStomp(ws))

    return asyncio.run(main())


def test_round_trip_connect_subscribe_send_message(broker) -> None:
    async def scenario(c: WsStomp) -> None:
        assert c.ws.protocol == "v12.stomp"
        connected = await c.connect()
        assert connected.headers["version"] == "1.2"
        await c.send("SUBSCRIBE", {"destination": "/queue/ws", "id": "0", "receipt": "s"})
        assert (await c.recv()).command == "RECEIPT"
        await c.send("SEND", {"destination": "/queue/ws", "content-type": "text/plain"},
                     b"hello from a browser")
        msg = await c.recv()
        assert msg.command == "MESSAGE" and msg.body == b"hello from a browser"
        assert msg.headers["subscription"] == "0"
        assert c.kinds[-1] == aiohttp.WSMsgType.TEXT  # what stomp.js expects for text

    run(broker.ws_url, scenario)


def test_any_path_and_each_stomp_subprotocol_or_none_get_a_session(broker) -> None:
    """stomp.js and other clients pick their own path and subprotocol list: every path upgrades,
    the first of v12/v11/v10.stomp the client lists is chosen, and a client that asks for none
    of them is served without a subprotocol. The STOMP version is CONNECT's accept-version."""
    async def session(path: str, protocols: tuple[str, ...]) -> tuple[str | None, str]:
        async with aiohttp.ClientSession() as http, http.ws_connect(
                f"{broker.ws_url}{path}", protocols=protocols) as ws:
            c = WsStomp(ws)
            connected = await c.connect()
            return ws.protocol, connected.headers["version"]

    async def scenario() -> None:
        for path in ("", "/", "/stomp", "/any/deeper/path?x=1"):
            assert await session(path, ("v12.stomp",)) == ("v12.stomp", "1.2")
        assert await session("/stomp", ("v10.stomp",)) == ("v10.stomp", "1.2")
        assert await session("/stomp", ("v11.stomp", "v12.stomp")) == ("v11.stomp", "1.2")
        assert await session("/stomp", ()) == (None, "1.2")
        assert await session("/stomp", ("mqtt",)) == (None, "1.2")

    asyncio.run(scenario())


def test_each_frame_to_the_client_is_one_websocket_message(broker) -> None:
    """stomp.js parses each WebSocket message on its own: frames the broker sends together
    (a RECEIPT and three MESSAGEs of one turn) still arrive one per message."""
    async def scenario(c: WsStomp) -> None:
        await c.connect()
        frames = b"".join(encode_frame(Frame("SEND", {"destination": "/queue/per"}, body), "1.2")
                          for body in (b"a", b"b", b"c"))
        frames += encode_frame(Frame("SUBSCRIBE", {"destination": "/queue/per", "id": "1",
                                                   "receipt": "r"}), "1.2")
        await c.ws.send_str(frames.decode())
        got = []
        for _ in range(4):
            msg = await c.ws.receive(timeout=10)
            assert msg.type == aiohttp.WSMsgType.TEXT
            got.append(FrameParser(version="1.2").feed(msg.data.encode()))
        assert all(len(f) == 1 for f in got), got
        assert sorted(f[0].body for f in got if f[0].command == "MESSAGE") == [b"a", b"b", b"c"]

    run(broker.ws_url, scenario)


def test_binary_messages_split_and_batched_frames_all_work(broker) -> None:
    body = bytes(range(256)) * 4

    async def scenario(c: WsStomp) -> None:
        await c.connect()
        sub = encode_frame(Frame("SUBSCRIBE", {"destination": "/queue/bin", "id": "1"}), "1.2")
        send = encode_frame(Frame("SEND", {"destination": "/queue/bin", "receipt": "r"}, body),
                            "1.2")
        both = sub + send
        await c.ws.send_bytes(both[:10])  # a frame cut across WebSocket messages ...
        await c.ws.send_bytes(both[10:])  # ... and two frames in one message
        frames = [await c.recv(), await c.recv()]
        assert sorted(f.command for f in frames) == ["MESSAGE", "RECEIPT"]
        msg = next(f for f in frames if f.command == "MESSAGE")
        assert msg.body == body
        assert aiohttp.WSMsgType.BINARY in c.kinds  # non-UTF-8 bodies go out as binary

    run(broker.ws_url, scenario, protocols=("v11.stomp",))


def test_tcp_and_websocket_clients_share_destinations_and_heart_beats(broker_factory,
                                                                       raw) -> None:
    b = broker_factory(config_text="[limits]\nheartbeat_ms = 200\n", name="hb")

    async def scenario(c: WsStomp) -> None:
        await c.connect(**{"heart-beat": "0,200", "login": "web"})
        await c.send("SUBSCRIBE", {"destination": "/topic/feed", "id": "f", "receipt": "s"})
        assert (await c.recv()).command == "RECEIPT"
        loop = asyncio.get_running_loop()
        conns = await loop.run_in_executor(None, _connections, b.console_url)
        assert [x["transport"] for x in conns if x["login"] == "web"] == ["websocket"]
        producer = raw(b)
        producer.connect()
        producer.send("SEND", {"destination": "/topic/feed"}, b"from tcp")
        msg = await c.recv()
        assert msg.command == "MESSAGE" and msg.body == b"from tcp"
        await c.heart_beats(2)  # asked for every 200 ms: the broker sends them

    run(b.ws_url, scenario)


def test_a_plain_http_request_is_refused(broker) -> None:
    url = broker.ws_url.replace("ws://", "http://")
    try:
        urllib.request.urlopen(url, timeout=5)
    except urllib.error.HTTPError as exc:
        assert exc.code == 400
    else:
        raise AssertionError("plain HTTP should be refused")


def _connections(console_url: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{console_url}/api/connections", timeout=5) as resp:
        return json.loads(resp.read())["connections"]


def test_a_large_message_read_back_from_the_journal_reaches_a_websocket_consumer(
        broker) -> None:
    """After a restart a persistent message's body is read back from the journal (a view of
    the read buffer, not bytes); a large one goes out in pieces, which the WebSocket writer
    must still be able to send as text or binary."""
    body = b"j" * (200 << 10)
    sender = RawStomp(broker.host, broker.port)
    sender.connect()
    sender.send("SEND", {"destination": "/queue/ws.big", "persistent": "true",
                         "receipt": "r"}, body)
    assert sender.recv().headers["receipt-id"] == "r"
    sender.close()
    broker.stop()
    broker.restart()

    async def scenario(c: WsStomp) -> None:
        await c.connect()
        await c.send("SUBSCRIBE", {"destination": "/queue/ws.big", "id": "0"})
        msg = await c.recv(timeout=30)
        assert msg.command == "MESSAGE" and msg.body == body

    run(broker.ws_url, scenario)
