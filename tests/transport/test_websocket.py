"""STOMP over WebSocket: what stomp.js does, from aiohttp's client, against a real broker."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from sluice_testing import RawStomp, rss_mib
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
            msg = await self.ws.receive(timeout=max(0.01, deadline - time.monotonic()))
            if msg.type not in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                raise ConnectionError(f"websocket {msg.type.name}")
            data = msg.data.encode() if msg.type == aiohttp.WSMsgType.TEXT else msg.data
            if data == b"\n":
                self.heartbeats += 1
            self.kinds.append(msg.type)
            self.frames.extend(self.parser.feed(data))
        return self.frames.pop(0)

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
        with contextlib.suppress(TimeoutError):  # only EOLs arrive: they end in a timeout
            await asyncio.wait_for(c.recv(), 0.8)
        assert c.heartbeats >= 2, "broker sent no heart-beats over the WebSocket"

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


def test_a_held_websocket_producer_is_paused_like_a_tcp_one(broker_factory) -> None:
    """A WebSocket producer whose destination is full stops being read (TCP holds it back)
    instead of having its frames queued in the broker without bound; once a consumer makes
    room, every SEND goes through, in order."""
    b = broker_factory(config_text='[[policy]]\nqueue = "vm.>"\ncursor = "vm"\n'
                                   'memory_limit = "64 KiB"\n')
    body = b"w" * (60 << 10)
    total = 1600  # ~94 MiB of SENDs against a destination that holds one of them
    overview = f"{b.console_url}/api/overview"

    def waiting() -> int:
        with urllib.request.urlopen(overview, timeout=10) as resp:
            return int(json.load(resp)["flow"]["producers_waiting"])

    async def scenario(c: WsStomp) -> None:
        await c.connect()
        before = rss_mib(b.pid)
        sent = 0

        async def produce() -> None:
            nonlocal sent
            for i in range(total):
                headers = {"destination": "/queue/vm.ws", "n": str(i)}
                if i == total - 1:
                    headers["receipt"] = "last"
                await c.send("SEND", headers, body, binary=True)
                sent += 1

        producer = asyncio.get_running_loop().create_task(produce())
        deadline = time.monotonic() + 30
        while await asyncio.to_thread(waiting) != 1:
            assert time.monotonic() < deadline, "the producer was never held"
            await asyncio.sleep(0.05)
        last = -1
        while sent != last:  # until the client's socket buffers are full and it blocks
            last = sent
            await asyncio.sleep(0.5)
        assert sent < total, "the broker kept reading a held WebSocket producer"
        assert rss_mib(b.pid) - before < 40, (before, rss_mib(b.pid))
        async with aiohttp.ClientSession() as http, http.ws_connect(
                f"{b.ws_url}/stomp", protocols=("v12.stomp",)) as ws:
            consumer = WsStomp(ws)
            await consumer.connect()
            await consumer.send("SUBSCRIBE", {"destination": "/queue/vm.ws", "id": "s"})
            for i in range(total):
                assert (await consumer.recv(timeout=60)).headers["n"] == str(i)
        await producer
        assert (await c.recv(timeout=30)).headers["receipt-id"] == "last"

    run(b.ws_url, scenario)


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
