"""Spec of WebSocket flow control, in process: the broker (``BrokerServer``) runs on this
test's event loop so the spec can see its connection objects, and aiohttp's client speaks to
it over a real socket. A held producer is proven held by what the broker does - its read loop
paused, then its socket no longer read - not by a quiet while on the client's side.
(The wire-level WebSocket specs against a broker process: tests/transport/test_websocket.py.)
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import aiohttp

from sluicemq.app import BrokerServer
from sluicemq.config import BrokerConfig
from sluicemq.protocol.codec import FrameParser, encode_frame
from sluicemq.protocol.frames import Frame

SECONDS = 60.0  # the longest any step may take (a failing spec's bound)


class Stomp:
    """A STOMP 1.2 client over one aiohttp WebSocket."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.parser = FrameParser(version="1.2")
        self.frames: list[Frame] = []

    async def send(self, command: str, headers: dict[str, str], body: bytes = b"") -> None:
        await self.ws.send_bytes(encode_frame(Frame(command, headers, body), "1.2"))

    async def recv(self) -> Frame:
        while not self.frames:
            msg = await self.ws.receive(timeout=SECONDS)
            assert msg.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY), msg
            self.frames += self.parser.feed(msg.data.encode() if isinstance(msg.data, str)
                                            else msg.data)
        return self.frames.pop(0)

    async def connect(self) -> None:
        await self.send("CONNECT", {"accept-version": "1.2", "host": "h"})
        assert (await self.recv()).command == "CONNECTED"


async def until(check: Callable[[], bool], what: str) -> None:
    """Let the broker's loop (this loop) run until ``check()`` holds."""
    deadline = time.monotonic() + SECONDS
    while not check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)  # paces the re-check; the broker's state decides


async def started(tmp_path: Path, config_text: str) -> tuple[BrokerServer, str]:
    (tmp_path / "sluice.toml").write_text(config_text)
    config = BrokerConfig.load(tmp_path / "sluice.toml", host="127.0.0.1", port=0,
                               data_dir=tmp_path / "data")
    server = BrokerServer(replace(config, console_port=None, ws_port=0))
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        await server.start()
    found = re.search(r"websocket on (ws://\S+)", printed.getvalue())
    assert found is not None  # server.websocket is built by the port's first connection
    return server, f"{found.group(1)}/stomp"


def test_a_held_websocket_producer_is_not_read_until_a_consumer_makes_room(
        tmp_path: Path) -> None:
    """A WebSocket producer whose destination is full stops being read - the session's read
    loop pauses, aiohttp's bounded queue fills, then its socket is no longer read and TCP
    holds the client back - instead of having its frames queued in the broker without bound;
    once a consumer makes room, every SEND goes through, in order."""
    body = b"w" * (60 << 10)
    total = 1600  # ~94 MiB of SENDs against a destination that holds one of them

    async def main() -> None:
        server, url = await started(tmp_path, '[[policy]]\nqueue = "vm.>"\ncursor = "vm"\n'
                                              'memory_limit = "64 KiB"\n')
        try:
            assert server.broker is not None
            flow = server.broker.flow
            async with aiohttp.ClientSession() as http, http.ws_connect(
                    url, protocols=("v12.stomp",)) as pws:
                producer = Stomp(pws)
                await producer.connect()
                assert server.websocket is not None
                (held,) = server.websocket.connections
                sent = 0

                async def produce() -> None:
                    nonlocal sent
                    for i in range(total):
                        headers = {"destination": "/queue/vm.ws", "n": str(i)}
                        if i == total - 1:
                            headers["receipt"] = "last"
                        await producer.send("SEND", headers, body)
                        sent += 1

                producing = asyncio.get_running_loop().create_task(produce())
                assert held.transport is not None
                await until(lambda: flow.waiting == 1 and held.reading_paused,
                            "the producer was never held")
                await until(lambda: not held.transport.is_reading() or producing.done(),
                            "the held producer's socket was still read")
                assert not producing.done() and sent < total
                assert held.session is not None
                taken = held.session.received  # SENDs the broker took: all it holds of them
                assert taken < total
                async with http.ws_connect(url, protocols=("v12.stomp",)) as cws:
                    consumer = Stomp(cws)
                    await consumer.connect()
                    await consumer.send("SUBSCRIBE", {"destination": "/queue/vm.ws", "id": "s"})
                    for i in range(total):
                        assert (await consumer.recv()).headers["n"] == str(i)
                await producing
                assert (await producer.recv()).headers["receipt-id"] == "last"
        finally:
            await server.stop()

    asyncio.run(main())
