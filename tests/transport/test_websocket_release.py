"""Spec: a WebSocket connection that ended is freed at once, not left to the cyclic collector.

Why: a connection and its session refer to each other; while they did, aiohttp's request,
reader and writer (~40 objects a connection) hung off that cycle until a full collection
found it - after 11,000 upgrades one such collection held the event loop ~0.6 s (the
oversized-frame attack's probe p99 in bench/hostile.py). The broker runs in this process so
the spec can see its objects; the client speaks to it over a real socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import io
import re
import time
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from sluicemq.app import BrokerServer
from sluicemq.config import BrokerConfig
from sluicemq.protocol.codec import FrameParser, encode_frame
from sluicemq.protocol.frames import Frame

SECONDS = 30.0  # the longest any step may take (a failing spec's bound)


async def _frame(ws: aiohttp.ClientWebSocketResponse, parser: FrameParser) -> Frame:
    msg = await ws.receive(timeout=SECONDS)
    frames = parser.feed(msg.data.encode() if isinstance(msg.data, str) else msg.data)
    assert len(frames) == 1, (msg, frames)
    return frames[0]


async def _until(check: Callable[[], bool], what: str) -> None:
    """Let the broker's loop run (this loop) until ``check()`` holds."""
    deadline = time.monotonic() + SECONDS
    while not check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


async def _started(tmp_path: Path, **limits: int) -> tuple[BrokerServer, str]:
    config = BrokerConfig.load(None, host="127.0.0.1", port=0, data_dir=tmp_path / "data")
    config = replace(config, console_port=None, ws_port=0,
                     limits=replace(config.limits, **limits))
    server = BrokerServer(config)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        await server.start()
    found = re.search(r"websocket on (ws://\S+)", printed.getvalue())
    assert found is not None  # server.websocket is built by the port's first connection
    return server, f"{found.group(1)}/stomp"


def _without_gc(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    gc.collect()
    gc.disable()  # only reference counting may free what the spec watches
    try:
        asyncio.run(main())
    finally:
        gc.enable()


def test_an_ended_websocket_connection_is_freed_without_a_garbage_collection(
        tmp_path: Path) -> None:
    async def main() -> None:
        server, url = await _started(tmp_path)
        try:
            parser = FrameParser(version="1.2")
            async with aiohttp.ClientSession() as http:
                ws = await http.ws_connect(url, protocols=("v12.stomp",))
                assert server.websocket is not None
                connections = server.websocket.connections
                await ws.send_str(encode_frame(Frame("CONNECT", {
                    "accept-version": "1.2", "host": "h"}), "1.2").decode())
                assert (await _frame(ws, parser)).command == "CONNECTED"
                (conn,) = connections
                ended, response = weakref.ref(conn), weakref.ref(conn.ws)
                del conn
                await ws.send_str(encode_frame(Frame("DISCONNECT", {"receipt": "bye"}),
                                               "1.2").decode())
                assert (await _frame(ws, parser)).headers["receipt-id"] == "bye"
                await ws.close()
            await _until(lambda: not connections, "the broker saw the connection end")
            await _until(lambda: ended() is None and response() is None,
                         "the ended connection and its aiohttp response were freed")
        finally:
            await server.stop()

    _without_gc(main)


@contextlib.asynccontextmanager
async def _one_admitted(tmp_path: Path) -> AsyncIterator[
        tuple[BrokerServer, str, aiohttp.ClientSession, aiohttp.ClientWebSocketResponse]]:
    """A broker that admits one connection per address (its CONNECT timeout out of the way)
    and that one connection, open: every later upgrade from here is refused."""
    server, url = await _started(tmp_path, max_connections_per_address=1,
                                 connect_timeout=600)
    try:
        async with aiohttp.ClientSession() as http:
            kept = await http.ws_connect(url, protocols=("v12.stomp",))
            yield server, url, http, kept
            await kept.close()
    finally:
        await server.stop()


def test_a_refused_upgrade_whose_client_never_answers_the_close_is_freed(
        tmp_path: Path) -> None:
    """aiohttp keeps the timeout that ended the close handshake; its traceback held the
    response in a cycle (10,000 such refusals: collections of 230-330 ms)."""
    async def main() -> None:
        async with _one_admitted(tmp_path) as (server, url, http, _kept):
            assert server.websocket is not None
            connections = server.websocket.connections
            await _until(lambda: len(connections) == 1, "the first one was admitted")
            (admitted,) = connections
            refused = await http.ws_connect(url, protocols=("v12.stomp",))
            # it reads nothing: the broker's close waits REFUSED_CLOSE_SECONDS, times out
            (response,) = (r for r in _responses() if r is not admitted.ws)
            gone = weakref.ref(response)
            del response, admitted
            await _until(lambda: gone() is None, "the refused upgrade's response was freed")
            await refused.close()

    _without_gc(main)


def test_refused_upgrades_waiting_for_their_close_are_bounded(tmp_path: Path) -> None:
    """Each refused upgrade holds an upgraded connection's state until its client answers
    the close (or the wait ends), and nothing charges it: past ``max_refusing`` of them the
    next is refused before the upgrade, with an HTTP 503 whose body names the limit."""
    async def main() -> None:
        async with _one_admitted(tmp_path) as (server, url, http, _kept):
            websocket = server.websocket
            assert websocket is not None
            websocket.max_refusing = 2
            websocket.refused_close_seconds = SECONDS  # they wait while the spec runs
            waiting = [await http.ws_connect(url, protocols=("v12.stomp",))
                       for _ in range(2)]  # neither reads: both wait for their close
            await _until(lambda: websocket.refusing == 2, "two refusals wait")
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(url, protocols=("v12.stomp",))
            assert refused.value.status == 503
            async with http.get(url.replace("ws://", "http://"), headers={
                    "Upgrade": "websocket", "Connection": "Upgrade",
                    "Sec-WebSocket-Version": "13",
                    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}) as resp:
                assert resp.status == 503
                assert await resp.text() == ("too many connections from 127.0.0.1 "
                                             "(limit 1, max_connections_per_address)\n")
            parser = FrameParser(version="1.2")
            for ws in waiting:  # they read their ERROR and answer the close
                error = await _frame(ws, parser)
                assert error.command == "ERROR"
                await ws.close()
            await _until(lambda: websocket.refusing == 0, "their closes were answered")
            again = await http.ws_connect(url, protocols=("v12.stomp",))
            assert (await _frame(again, parser)).command == "ERROR"  # told over STOMP
            await again.close()

    asyncio.run(main())


def _responses() -> list[web.WebSocketResponse]:
    """The broker's WebSocket responses still in memory (freed or not yet: gc is off)."""
    return [o for o in gc.get_objects() if isinstance(o, web.WebSocketResponse)]
