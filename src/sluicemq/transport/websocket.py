"""STOMP over WebSocket (what stomp.js speaks): same codec, same Session as TCP.

Each incoming WebSocket message, text or binary, is fed to the frame parser as bytes, so a
message may carry one frame, several, or part of one. Each outgoing frame is one message:
text when it is valid UTF-8 (what browser STOMP clients expect), binary otherwise.

Writes go through a queue drained by one task per connection; past the connection's share of
``output_buffer_bytes`` (``Admission.output_share``) the session reports itself not writable
and dispatch stops feeding it, as on TCP; what is queued is charged to the memory account, as
on TCP. Reading pauses as on TCP too (flow control, a
connection's turn of frames used up): the read loop stops taking messages, aiohttp's bounded
reader then stops reading the socket, and TCP holds the client back - so a WebSocket producer
can neither queue frames without bound in the broker nor hold the event loop longer than a
TCP one. An open connection's own state (~23 KiB, ``CONNECTION_BYTES``) is charged to the
memory account too, so thousands of WebSockets from many addresses cannot hold more than the
part of ``memory_limit`` queued messages do not use; an upgrade past it is refused. A refused
upgrade gets a STOMP ERROR and a close frame, and its client's close is awaited briefly; at
most ``MAX_REFUSING`` wait at once, past which the upgrade is refused before it is made (HTTP
503 naming the limit), so a flood of refusals holds a bounded amount too.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import time
from collections import deque
from typing import TYPE_CHECKING

from aiohttp import WSMsgType, web

from sluicemq.core.limits.admission import connect_timeout_message
from sluicemq.core.security.origin import cross_site, host_refused, is_loopback
from sluicemq.core.sessions.session import Session
from sluicemq.protocol.codec import encode_frame
from sluicemq.protocol.frames import Frame
from sluicemq.transport.keepalive import Keepalive

if TYPE_CHECKING:
    from sluicemq.core.sessions.services import Services

log = logging.getLogger("sluicemq.websocket")

SUBPROTOCOLS = ("v12.stomp", "v11.stomp", "v10.stomp")
FRAME_SLACK = 64 << 10  # a WebSocket message may hold a maximal frame plus a few small ones
HANDSHAKE_SECONDS = 0.001  # what an upgrade costs the loop, reserved when one is woken
REFUSED_CLOSE_SECONDS = 1.0  # a refused client's close frame is awaited this long
# Refused upgrades that may wait for their client's close at once. Each holds an upgraded
# connection's state (~20 KiB) for up to REFUSED_CLOSE_SECONDS, which nothing charges: 1,724
# refused in a row (5,000 WebSockets from five addresses) held ~20 MiB past memory_limit.
# Past this many, an upgrade is refused before it is made: HTTP 503 whose body is the reason.
MAX_REFUSING = 64
# What an open WebSocket connection holds beyond its output, charged to the memory account
# while it is open (``MemoryAccount.open``). Measured (bench/memdump.py, 1,000 upgrades):
# ~23 KiB each - aiohttp's parsed upgrade request kept for the connection's life, its reader,
# writer and response (~11 KiB), our connection, session and parser (~6 KiB), tasks and
# events (~3 KiB), the C parts (uvloop, HTTP parser) the rest.
CONNECTION_BYTES = 24 << 10


class WebSocketConnection:
    """One WebSocket client: the session's Outbound, a reader loop and a writer task."""

    transport_name = "websocket"

    def __init__(self, services: Services, ws: web.WebSocketResponse, peer: str,
                 transport: asyncio.BaseTransport | None = None) -> None:
        self.broker = services.broker
        self.ws = ws
        self.transport = transport  # the socket's: where a paused read ends (is_reading)
        self.session: Session | None = Session(services, self, peer)
        self.session.on_version = self._negotiated
        self.writable = True
        self._out: deque[bytes] = deque()
        self._queued = 0
        self._wake = asyncio.Event()
        self._closing = False
        self._loop = asyncio.get_running_loop()
        self.last_received = self.last_sent = time.monotonic()
        self._keepalive: Keepalive | None = None
        self._may_read = asyncio.Event()
        self._may_read.set()

    # -- Outbound (used by the session) ------------------------------------------------------
    def pause_reading(self) -> None:
        """Flow control, or this connection's turn of frames is used up: read nothing more."""
        self._may_read.clear()

    def resume_reading(self) -> None:
        if not self._may_read.is_set():
            self.last_received = time.monotonic()  # its heart-beats were not being read
            self._may_read.set()

    def write(self, data: bytes | memoryview) -> None:
        if self._closing or self.ws.closed:
            return
        # A body read back from the journal is a memoryview; the writer decodes what it
        # sends (text messages for stomp.js), which only bytes can do.
        self._out.append(data if isinstance(data, bytes) else bytes(data))
        self._queued += len(data)
        self.broker.memory.charge(self, self._queued)
        if self._queued > self.broker.admission.output_share():
            self.writable = False
        self._wake.set()

    def close(self) -> None:
        """Close once what the session already wrote (an ERROR, a RECEIPT) has gone out."""
        self._closing = True
        self._wake.set()
        self._may_read.set()  # the read loop must see the close, not wait for room forever

    # -- lifecycle ---------------------------------------------------------------------------
    async def run(self) -> None:
        """Serve the connection until either side closes it (or it never sends CONNECT).

        Once it ends, the connection lets go of its session (as the TCP protocol does): the
        two refer to each other, and that cycle held aiohttp's request, reader and writer
        (~40 objects a connection) for the cyclic collector, which found them only in a full
        collection - 11,000 upgrades made one of ~0.6 s on the event loop.
        """
        session = self.session
        assert session is not None
        writer = self._loop.create_task(self._write_loop())
        timeout = self.broker.config.limits.connect_timeout
        deadline = self._loop.call_later(timeout, self._connect_timed_out) if timeout > 0 else None
        try:
            await self._read_loop(session)
        finally:
            if deadline is not None:
                deadline.cancel()
            if self._keepalive is not None:
                self._keepalive.cancel()
            session.connection_lost()
            if not self._closing:
                writer.cancel()
            try:
                with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                    await writer
                if not self.ws.closed:
                    await self.ws.close()
            finally:
                self.session = None
                self._out.clear()
                self._queued = 0
                self.broker.memory.charge(self, 0)

    async def _read_loop(self, session: Session) -> None:
        async for msg in self.ws:
            if msg.type == WSMsgType.TEXT:
                data = msg.data.encode()
            elif msg.type == WSMsgType.BINARY:
                data = msg.data
            else:
                break
            self.last_received = time.monotonic()
            session.feed(data)
            if not self._may_read.is_set():
                await self._may_read.wait()

    async def _write_loop(self) -> None:
        ws = self.ws
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._out:
                data = self._out.popleft()
                self._queued -= len(data)
                self.broker.memory.charge(self, self._queued)
                try:
                    text = data.decode()
                except UnicodeDecodeError:
                    await ws.send_bytes(data)
                else:
                    await ws.send_str(text)
                self.last_sent = time.monotonic()
                if not self.writable and self._queued <= self.broker.admission.output_share() // 4:
                    self._resume()
            if self._closing:
                await ws.close()
                return

    def _connect_timed_out(self) -> None:
        session = self.session
        if session is not None and not session.connected and not session.closed:
            seconds = self.broker.config.limits.connect_timeout
            log.warning("closing %s: %s", session.peer, connect_timeout_message(seconds))
            session.error(connect_timeout_message(seconds), fatal=True)

    def _resume(self) -> None:
        self.writable = True
        if self.session is not None:
            self.session.output_ready()

    # -- heart-beating -----------------------------------------------------------------------
    def _negotiated(self, version: str) -> None:
        assert self.session is not None  # called by the session
        send_ms, expect_ms = self.session.heartbeat
        if send_ms or expect_ms:
            self._keepalive = Keepalive(self, send_ms, expect_ms)

    @property
    def gone(self) -> bool:
        return self.session is None or self.session.closed

    @property
    def buffered(self) -> int:
        """Frames queued for this peer and not yet handed to its socket."""
        return self._queued

    @property
    def reading_paused(self) -> bool:
        return not self._may_read.is_set()

    def send_heartbeat(self) -> None:
        self._out.append(b"\n")
        self._queued += 1
        self._wake.set()


class WebSocketServer:
    """Accepts STOMP WebSocket upgrades on any path; tracks connections for the console."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.broker = services.broker
        self.connections: set[WebSocketConnection] = set()
        self._runner: web.AppRunner | None = None
        self._loopback_only = True
        self._handshakes = _Handshakes()  # every upgrade, as one spender of loop turns
        self.refusing = 0  # refused upgrades waiting for their close now
        self.max_refusing = MAX_REFUSING
        self.refused_close_seconds = REFUSED_CLOSE_SECONDS

    async def serve(self, host: str, sockets: list[socket.socket]) -> None:
        """Serve on ``sockets``, already listening on ``host`` (``transport/deferred.py``)."""
        self._loopback_only = is_loopback(host)
        app = web.Application()
        app.router.add_get("/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                     shutdown_timeout=1.0)
        await self._runner.setup()
        for sock in sockets:
            await web.SockSite(self._runner, sock).start()

    async def _take_turn(self) -> float:
        """Wait until this loop turn has room for a handshake; returns the start time.

        Why: an upgrade (HTTP parse, 101 response, admission, maybe an ERROR and a close)
        costs about a millisecond of the loop, and a client opening thousands at once would
        have dozens handled back to back in one turn while every other client waits.
        Handshakes share the turns' input budget (``core/limits/turns.py``) as one spender.
        """
        turns = self.broker.turns
        while turns.allowance(self._handshakes) <= 0:
            turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            turns.wait(self._handshakes, functools.partial(_wake, turn),
                       reserve=HANDSHAKE_SECONDS)
            await turn
        return turns.clock()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        started = await self._take_turn()
        try:
            ws, address = await self._upgrade(request)
        finally:
            self.broker.turns.charge(self._handshakes, started)
        if address is None:
            _drop_tracebacks(ws)
            return ws  # refused, and told why
        peer = request.transport.get_extra_info("peername") if request.transport else None
        conn = WebSocketConnection(self.services, ws,
                                   f"{peer[0]}:{peer[1]}" if peer else "?", request.transport)
        self.connections.add(conn)
        try:
            await conn.run()
        finally:
            self.connections.discard(conn)
            self.broker.admission.release(address)
            self.broker.memory.close(CONNECTION_BYTES)
            _drop_tracebacks(ws)
        return ws

    async def _upgrade(self, request: web.Request) -> tuple[web.WebSocketResponse, str | None]:
        """Upgrade and admit: the response and the client's address, or None as the address
        when the connection was refused (a fatal ERROR and a close frame sent)."""
        origins = self.broker.config.security.websocket_origins
        why = (host_refused(request.host, self._loopback_only)
               or cross_site(request.headers, request.host, origins))
        if why:  # a page on another site driving the operator's browser into the broker
            log.warning("WebSocket upgrade refused from %s: %s", request.remote, why)
            raise web.HTTPForbidden(text=f"cross-site WebSocket refused: {why}; list the page's "
                                         "origin in [security] websocket-origins\n")
        peer = request.transport.get_extra_info("peername") if request.transport else None
        address = str(peer[0]) if peer else "?"
        refused = self.broker.admission.admit(address)
        if refused is None:
            refused = self.broker.memory.open(CONNECTION_BYTES, "WebSocket connection")
            if refused is not None:
                self.broker.admission.release(address)
        if refused is not None and self.refusing >= self.max_refusing:
            log.warning("refusing websocket from %s before the upgrade: %s", address, refused)
            raise web.HTTPServiceUnavailable(text=f"{refused}\n")
        limit = self.broker.config.limits.max_frame_bytes + FRAME_SLACK
        # A refused client gets its ERROR and a close frame, and a short wait for its close:
        # thousands of refused upgrades left open by their client must not linger for 10 s.
        ws = web.WebSocketResponse(protocols=SUBPROTOCOLS, max_msg_size=limit, compress=False,
                                   timeout=self.refused_close_seconds if refused else 10.0)
        try:
            if not ws.can_prepare(request).ok:
                raise web.HTTPBadRequest(text="this port speaks STOMP over WebSocket only\n")
            await ws.prepare(request)
        except BaseException:
            if refused is None:
                self.broker.admission.release(address)
                self.broker.memory.close(CONNECTION_BYTES)
            raise
        if refused is None:
            return ws, address
        # counted with TCP (WebSockets cannot exhaust descriptors) and in memory_limit
        log.warning("refusing websocket from %s: %s", address, refused)
        error = Frame("ERROR", {"message": refused, "content-type": "text/plain"},
                      refused.encode())
        self.refusing += 1
        try:
            with contextlib.suppress(ConnectionError):
                await ws.send_str(encode_frame(error, "1.0").decode())
                await ws.close(code=1013, message=refused.split(" (")[0].encode()[:120])
        finally:
            self.refusing -= 1
        return ws, None

    async def stop(self) -> None:
        for conn in list(self.connections):
            with contextlib.suppress(Exception):
                await conn.ws.close(code=1001, message=b"broker shutting down")
        if self._runner is not None:
            await self._runner.cleanup()


class _Handshakes:
    """What WebSocket upgrades used of the loop recently (a ``turns.Spender``)."""

    used = 0.0
    used_at = 0.0


def _drop_tracebacks(ws: web.WebSocketResponse) -> None:
    """Forget the frames of the error that ended a close handshake (the error stays).

    Why: aiohttp keeps it (``ws.exception()``: a timeout when the peer never answered our
    close), and its traceback - and its context's, a cancellation - holds the frames of
    ``close()``, which hold the response: a cycle of ~100 objects a connection left for the
    cyclic collector. 10,000 refused upgrades whose client read nothing made collections of
    110-170k objects, 230-330 ms of the event loop each.
    """
    exc: BaseException | None = ws.exception()
    for _ in range(8):  # a context chain is short; never loop on a strange one
        if exc is None:
            return
        exc.__traceback__ = None
        exc = exc.__context__


def _wake(turn: asyncio.Future[None]) -> None:
    if not turn.done():  # cancelled: its client went away while it waited
        turn.set_result(None)
